"""A subscription's messages as columns (``receive_batch``, :class:`mq.MessageBatch`),
beside ``receive`` and ``receive_many`` on one stream, on trio's virtual clock."""

from __future__ import annotations

import pathlib
from types import SimpleNamespace
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from mq import MessageBatch, Subscription
from mq.topics._held import Held
from pump import ConfigError

from .test_server import site

FIELDS = ("topic", "group", "offset", "tag", "producer", "sequence", "deliveries",
          "timestamp", "body")


def fields(messages: Any) -> list[tuple[Any, ...]]:
    return [tuple(getattr(m, name) for name in FIELDS) for m in messages]


async def test_a_batch_holds_what_receive_many_gives_and_its_ack_frees_them(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    async with site(tmp_path) as s:
        first, second, consumer = s.client("p1"), s.client("p2"), s.client("c")
        await first.declare("orders")
        await first.declare("orders", group="audit")
        batch_sub = await consumer.subscribe("orders", window=100)
        each_sub = await consumer.subscribe("orders", group="audit", window=100)
        await first.publish_many("orders", [b"a", b"bb" * 3000, b""], tag="eu")
        await second.publish("orders", b"x" * 5000)
        await first.publish_many("orders", [b"c", b"d"])
        batch = await batch_sub.receive_batch()
        while len(batch) < 6:
            batch = MessageBatch.join([batch, await batch_sub.receive_batch()])
        each = await each_sub.receive_many()
        while len(each) < 6:
            each += await each_sub.receive_many()
        assert list(batch.offsets) == [m.offset for m in each] == [0, 1, 2, 3, 4, 5]
        assert batch.offsets == range(6)  # consecutive: a range, not a list of them
        assert list(batch.bodies) == [m.body for m in each] == [
            b"a", b"bb" * 3000, b"", b"x" * 5000, b"c", b"d"]
        assert batch.tags == ["eu", "eu", "eu", None, None, None]
        assert batch.producers == [first.producer] * 3 + [second.producer] + [
            first.producer] * 2
        assert batch.sequences == [1, 2, 3, 1, 4, 5]
        assert batch.deliveries == [1] * 6 and batch.timestamps == [m.timestamp for m in each]
        assert (batch.topic, batch.group, len(batch)) == ("orders", "orders", 6)
        # the same messages, as Message objects, by index and by iteration
        assert fields(batch) == [(*f[:1], "orders", *f[2:]) for f in fields(each)]
        assert fields([batch[4]]) == fields(batch)[4:5] and fields(batch[1:3]) == fields(
            batch)[1:3]
        await batch.ack()
        await trio.sleep(0.1)
        groups = (await consumer.query("orders"))["orders"]["groups"]
        assert (groups["orders"]["inFlight"], groups["orders"]["lag"]) == (0, 0)
        assert (groups["audit"]["inFlight"], groups["audit"]["lag"]) == (6, 6)


#: Calls on one subscription, in turn until every message came: ("one", 0) is
#: ``receive``, ("many", n) ``receive_many(n)``, ("batch", n) ``receive_batch(n)``.
PATTERNS = [
    [("batch", 1000)],
    [("one", 0), ("batch", 3), ("many", 5)],
    [("batch", 1), ("many", 1), ("one", 0)],
    [("many", 7), ("batch", 11), ("one", 0), ("batch", 2)],
]


async def _take(sub: Subscription, call: str, count: int) -> list[tuple[int, bytes]]:
    """One call of ``sub`` (``one``, ``many`` or ``batch``, at most ``count``): what it
    gave, as (offset, body), each call within its count."""
    if call == "one":
        message = await sub.receive()
        return [(message.offset, message.body)]
    if call == "many":
        messages = await sub.receive_many(count)
        assert 1 <= len(messages) <= count
        return [(m.offset, m.body) for m in messages]
    batch = await sub.receive_batch(count)
    assert 1 <= len(batch) <= count
    return list(zip(batch.offsets, batch.bodies, strict=True))


@pytest.mark.parametrize("pattern", PATTERNS)
async def test_receive_receive_many_and_receive_batch_take_one_stream_in_order(
        tmp_path: pathlib.Path, autojump_clock: object, pattern: list[tuple[str, int]]
        ) -> None:
    """Whatever mix of calls takes them, frames cut anywhere: every message once, in
    order, each call within its count."""
    sizes = [7, 13, 1, 29, 2]
    async with site(tmp_path) as s:
        producer, consumer = s.client("p"), s.client("c")
        await producer.declare("orders")
        sub = await consumer.subscribe("orders", window=1000)
        start = 0
        for size in sizes:
            await producer.publish_many("orders", [b"m%d" % i for i in range(start,
                                                                             start + size)])
            start += size
        got: list[tuple[int, bytes]] = []
        turn = 0
        while len(got) < start:
            call, count = pattern[turn % len(pattern)]
            turn += 1
            got += await _take(sub, call, count)
        assert got == [(i, b"m%d" % i) for i in range(start)]
        await sub.ack([offset for offset, _ in got])
        await trio.sleep(0.1)
        assert (await consumer.query("orders"))["orders"]["groups"]["orders"]["lag"] == 0


_STEPS = st.lists(st.one_of(
    st.tuples(st.just("publish"), st.integers(1, 12)),
    st.tuples(st.sampled_from(["one", "many", "batch"]), st.integers(1, 15)),
    st.tuples(st.just("ack"), st.just(0))), min_size=1, max_size=12)


@given(steps=_STEPS, window=st.sampled_from([3, 8, 1000]))
def test_publishes_calls_and_acks_in_any_order_give_each_message_once_in_order(
        steps: list[tuple[str, int]], window: int) -> None:
    """Publishes of any size, the three ways of taking and acks, interleaved as drawn,
    with a window that cuts frames or not: every message comes once, in order, and all
    are acknowledged at the end."""

    async def main() -> None:
        async with site(None) as s:
            producer, consumer = s.client("p"), s.client("c")
            await producer.declare("orders")
            sub = await consumer.subscribe("orders", window=window)
            published, got, acked = 0, list[tuple[int, bytes]](), 0
            for step, n in [*steps, ("publish", 1)]:
                if step == "publish":
                    await producer.publish_many("orders", [b"m%d" % i for i in range(
                        published, published + n)])
                    published += n
                elif step == "ack":
                    await sub.ack([offset for offset, _ in got[acked:]])
                    acked = len(got)
                elif len(got) - acked < window and len(got) < published:  # one can come
                    got += await _take(sub, step, n)
            while len(got) < published:
                await sub.ack([offset for offset, _ in got[acked:]])
                acked = len(got)
                got += await _take(sub, "batch", 1000)
            assert got == [(i, b"m%d" % i) for i in range(published)]
            await sub.ack([offset for offset, _ in got[acked:]])
            await trio.sleep(0.1)
            groups = (await consumer.query("orders"))["orders"]["groups"]
            assert (groups["orders"]["lag"], groups["orders"]["inFlight"]) == (0, 0)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


async def test_receive_batch_and_receive_many_refuse_a_count_below_one(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    async with site(tmp_path) as s:
        consumer = s.client("c")
        await consumer.declare("orders")
        sub = await consumer.subscribe("orders")
        for call in (sub.receive_batch, sub.receive_many):
            with pytest.raises(ConfigError, match="max_count must be at least 1"):
                await call(0)


def test_batches_join_and_cut_with_bodies_in_their_frames_or_cut() -> None:
    owner: Any = SimpleNamespace(topic="t", group="g")
    frame = b"aabbbc"
    lazy = MessageBatch(owner, [0, 1, 2], [None] * 3, ["p"] * 3, [1, 2, 3], [1] * 3,
                        [9] * 3, parts=[(memoryview(frame), [2, 3, 1])])
    other = MessageBatch(owner, [3], ["x"], ["q"], [1], [2], [10],
                         parts=[(b"dd", [2])])
    joined = MessageBatch.join([lazy, other])
    assert list(joined.bodies) == [b"aa", b"bbb", b"c", b"dd"]
    assert joined.offsets == [0, 1, 2, 3] and joined.deliveries == [1, 1, 1, 2]
    # ranges that follow each other join into one; others into a list
    runs = [MessageBatch(owner, r, [None] * len(r), ["p"] * len(r), list(r), [1] * len(r),
                         [9] * len(r), parts=[(b"x" * len(r), [1] * len(r))])
            for r in (range(5, 8), range(8, 9), range(12, 14))]
    assert MessageBatch.join(runs[:2]).offsets == range(5, 9)
    assert MessageBatch.join(runs).offsets == [5, 6, 7, 8, 12, 13]
    assert runs[0][1:].offsets == range(6, 8)
    cut = lazy[1:]
    assert (cut.offsets, list(cut.bodies), cut.sequences) == ([1, 2], [b"bbb", b"c"], [2, 3])
    # one already cut joined with one that is not
    mixed = MessageBatch.join([cut, other])
    assert list(mixed.bodies) == [b"bbb", b"c", b"dd"] and mixed.tags == [None, None, "x"]
    assert [m.body for m in MessageBatch.of(owner, list(mixed))] == [b"bbb", b"c", b"dd"]
    assert repr(mixed) == "<MessageBatch of 3 messages of 't' in group 'g'>"


def test_columns_sent_as_one_value_are_made_when_read_and_join_so() -> None:
    from mq.topics._wire import lazy_column

    owner: Any = SimpleNamespace(topic="t", group="g")
    sent = [lazy_column(v, 3, counting=c) for v, c in
            ((None, False), ("p", False), (7, True), (1, False), (9, False))]
    one = MessageBatch(owner, range(0, 3), *sent, parts=[(b"abc", [1, 1, 1])])
    other = MessageBatch(owner, [3], ["x"], ["q"], [1], [2], [10], parts=[(b"d", [1])])
    joined = MessageBatch.join([one, other])
    assert (joined.tags, joined.producers, joined.sequences, joined.deliveries,
            joined.timestamps) == ([None, None, None, "x"], ["p", "p", "p", "q"],
                                   [7, 8, 9, 1], [1, 1, 1, 2], [9, 9, 9, 10])
    assert one.sequences is one.sequences  # made once
    assert [(m.offset, m.producer, m.sequence) for m in one] == [
        (0, "p", 7), (1, "p", 8), (2, "p", 9)]


def test_an_ack_of_a_range_is_first_and_count_only_when_it_counts_by_one() -> None:
    """A batch's consecutive offsets go as the first and the count; a range with a step
    is acked as the offsets it names, and what is not held stays in for the server."""
    owner: Any = SimpleNamespace(topic="t", group="g", held=Held(), stale={})
    ack_request = Subscription.ack_request
    owner.held.add(range(10), None)
    assert ack_request(owner, range(2, 6)) == {"cmd": "ack", "topic": "t", "group": "g",
                                               "offsets": 2, "count": 4}
    assert ack_request(owner, range(0, 10, 3)) == {"cmd": "ack", "topic": "t", "group": "g",
                                                   "offsets": [0, 3, 6, 9]}
    assert list(owner.held) == [1, 7, 8]
    # partly held (4 and 5 acked above): sent whole, for the server to refuse what it
    # does not hold
    assert ack_request(owner, range(5, 9)) == {"cmd": "ack", "topic": "t", "group": "g",
                                               "offsets": 5, "count": 4}
    assert list(owner.held) == [1]


async def test_consumers_that_outnumber_a_batch_get_it_whole_in_turn(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    """Twenty consumers of one group on links of their own, batches of ten: each batch
    reaches one consumer as one frame (one ``receive_batch``), the next batch the next
    consumer, and every message goes once."""
    async with site(tmp_path) as s:
        producer = s.client("p")
        await producer.declare("orders")
        subs = [await s.client(f"c{i}").subscribe("orders", window=100) for i in range(20)]
        for _ in range(5):
            await producer.publish_many("orders", [b"m"] * 10)
        frames: list[list[int]] = []
        for sub in subs:
            with trio.move_on_after(1):
                while True:
                    frames.append(list((await sub.receive_batch()).offsets))
            frames.append([])  # where one consumer's frames end
        whole = [[list(range(10 * i, 10 * i + 10)), []] for i in range(5)]
        assert frames == [part for parts in whole for part in parts] + [[]] * 15
