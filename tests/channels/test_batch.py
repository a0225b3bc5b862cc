"""A Batch: messages joined once, sent on several queues, delivered on each as if sent
one by one."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from channels import (
    AsyncMessageQueue,
    Batch,
    ChannelManager,
    MessageQueue,
    MessageTooLargeError,
    QueueFullError,
)
from pump import ListSink, Pump

from .helpers import Recorder, queue_pair


def fan_out(pump: Pump, sinks: int, capacity: int, **options: int
            ) -> tuple[list[MessageQueue], list[Recorder]]:
    """Queues from one broker to ``sinks`` others, each sink recording what arrives."""
    cm = ChannelManager(pump, capacity=capacity)
    sources, recorders = [], []
    for i in range(sinks):
        a, b = cm.open_pair("faucet", f"sink{i}", 80)
        sources.append(MessageQueue(a, **options))
        recorder = Recorder()
        MessageQueue(b, **options).set_listener(recorder)
        recorders.append(recorder)
    return sources, recorders


def test_a_batch_on_three_queues_arrives_on_each_in_order_among_plain_sends() -> None:
    pump = Pump()
    queues, sinks = fan_out(pump, 3, 1024)
    messages = [bytes([i]) * (i * 37 % 300) for i in range(40)]  # empty ones too
    batch = Batch(messages)
    for q in queues:
        q.send(b"before")
        assert q.send_many(batch) == 40
        q.send(b"after")
    pump.run_until_idle()
    for q, sink in zip(queues, sinks, strict=True):
        assert sink.messages == [b"before", *messages, b"after"]
        assert q.statistics().messages_sent == 42


def test_past_the_mark_a_prefix_is_queued_and_the_rest_goes_once_room_frees() -> None:
    pump = Pump()
    (q,), (sink,) = fan_out(pump, 1, 64, high_water=100, low_water=0)
    batch = Batch([b"%02d" % i + b"." * 8 for i in range(25)])  # 10 bytes each
    q.send(b"x" * 5)  # the queue is not idle: 95 bytes of room left
    assert q.send_many(batch) == 9
    with pytest.raises(QueueFullError):
        q.send_batch(batch, 9)
    pump.run_until_idle()
    assert q.send_batch(batch, 9) == 10  # idle again: the mark's worth
    pump.run_until_idle()
    assert q.send_batch(batch, 19) == 6
    assert q.send_batch(batch, 25) == 0  # nothing left from there
    pump.run_until_idle()
    assert sink.messages == [b"x" * 5, *batch.messages]
    assert q.statistics().messages_sent == 26


def test_a_long_backlog_of_batches_stays_in_order_as_the_queue_trims_what_left() -> None:
    """Batches of 6,000 small messages behind a 64-byte ring: the queue drops what has
    left from the head of its backlog now and then (every few thousand messages) while
    the batches are still going out."""
    pump = Pump()
    (q,), (sink,) = fan_out(pump, 1, 64)
    first = Batch([i.to_bytes(2, "big") for i in range(6000)])
    second = Batch([b"b" + i.to_bytes(2, "big") for i in range(6000)])
    assert q.send_many(first) == 6000
    q.send(b"between")
    assert q.send_many(second) == 6000
    pump.run_until_idle()
    assert sink.messages == [*first.messages, b"between", *second.messages]


def test_an_idle_queue_takes_a_first_message_past_the_mark_as_send_does() -> None:
    pump = Pump()
    (q,), (sink,) = fan_out(pump, 1, 64, high_water=16, low_water=0)
    batch = Batch([b"a" * 40, b"b"])
    assert q.send_many(batch) == 1
    with pytest.raises(QueueFullError):
        q.send_batch(batch, 1)
    pump.run_until_idle()
    assert q.send_batch(batch, 1) == 1
    pump.run_until_idle()
    assert sink.messages == [b"a" * 40, b"b"]


def test_messages_bigger_than_the_ring_go_in_pieces_and_arrive_whole() -> None:
    pump = Pump()
    queues, sinks = fan_out(pump, 2, 64)
    messages = [b"small", bytes(range(256)) * 2, b"", b"tail" * 30]
    batch = Batch(messages)
    for q in queues:
        assert q.send_many(batch) == 4
    pump.run_until_idle()
    assert [s.messages for s in sinks] == [messages, messages]


def test_what_send_refuses_a_batch_is_refused_the_same_way() -> None:
    pump = Pump()
    (q,), _ = fan_out(pump, 1, 64, max_message_size=1 << 20, high_water=1 << 16)
    with pytest.raises(TypeError, match="not str"):
        Batch([b"ok", "text"])  # type: ignore[list-item]
    assert Batch([bytearray(b"ab"), memoryview(b"cd")]).messages == [b"ab", b"cd"]
    small = MessageQueue(ChannelManager(pump, capacity=64).open_pair("a", "b", 1)[0],
                         max_message_size=100, high_water=100)
    with pytest.raises(MessageTooLargeError):
        small.send_many(Batch([b"x", b"y" * 101]))
    # all of them past the limit, each within it: queued up to the mark
    assert small.send_many(Batch([b"a" * 40, b"b" * 40, b"c" * 40])) == 2
    q.close()
    with pytest.raises(trio.ClosedResourceError):
        q.send_many(Batch([b"late"]))


def test_a_traced_queue_records_each_message_of_a_batch() -> None:
    sink = ListSink()
    pump = Pump(trace=sink)
    qa, qb = queue_pair(pump, 64)
    rec = Recorder()
    qb.set_listener(rec)
    qa.send_many(Batch([b"one", b"two", b"x" * 100]))
    pump.run_until_idle()
    sends = [(e.seq, e.size) for e in sink.events if e.kind == "send"]
    delivers = [(e.seq, e.size) for e in sink.events if e.kind == "deliver"]
    assert sends == delivers == [(1, 3), (2, 3), (3, 100)]
    assert rec.messages == [b"one", b"two", b"x" * 100]


@given(st.lists(st.one_of(
           st.lists(st.binary(max_size=300), max_size=30).map(lambda ms: ("batch", ms)),
           st.binary(max_size=300).map(lambda m: ("send", [m]))), max_size=12),
       st.sampled_from([64, 256, 4096]), st.integers(200, 5000))
def test_batches_and_plain_sends_arrive_in_order_on_every_queue(
        sends: list[tuple[str, list[bytes]]], capacity: int, high_water: int) -> None:
    """Whatever the ring, the mark and the mixture: each queue delivers exactly what was
    given to it, in order, sending the rest of a batch each time it drains."""
    pump = Pump()
    queues, sinks = fan_out(pump, 2, capacity, high_water=high_water,
                            low_water=high_water // 4)
    expected: list[bytes] = []
    for kind, messages in sends:
        batch = Batch(messages) if kind == "batch" else None
        for q in queues:
            done = 0
            for _ in range(10_000):  # bounded: each round moves at least one message
                if done == len(messages):
                    break
                try:
                    done += (q.send_batch(batch, done) if batch is not None
                             else q.send_many(messages[done:]))
                except QueueFullError:
                    pump.run_until_idle()
            assert done == len(messages)
        expected += messages
    pump.run_until_idle()
    for q, sink in zip(queues, sinks, strict=True):
        assert sink.messages == expected
        assert q.statistics().messages_sent == len(expected)


async def test_the_async_face_sends_a_whole_batch_waiting_for_room() -> None:
    """1,000 messages of 1,000 B through 16 KiB rings to two receivers: await send_many
    returns once all are queued, each receiver gets them all in order."""
    pump = Pump()
    cm = ChannelManager(pump, capacity=1 << 14)
    messages = [bytes([i % 251]) * 1000 for i in range(1000)]
    batch = Batch(messages)
    async with trio.open_nursery() as nursery:
        await nursery.start(pump.serve)
        pairs = [cm.open_pair("faucet", f"s{i}", 80) for i in range(2)]
        outs = [AsyncMessageQueue(MessageQueue(a, high_water=1 << 15)) for a, _ in pairs]
        ins = [AsyncMessageQueue(MessageQueue(b)) for _, b in pairs]
        got: list[list[bytes]] = [[], []]
        done = [trio.Event(), trio.Event()]

        async def take(i: int) -> None:
            while len(got[i]) < len(messages):
                got[i] += await ins[i].receive_many(256)
            done[i].set()

        for i in range(2):
            nursery.start_soon(take, i)
        with trio.fail_after(10):
            for out in outs:
                await out.send_many(batch)
            for event in done:
                await event.wait()
        nursery.cancel_scope.cancel()
    assert got == [messages, messages]
