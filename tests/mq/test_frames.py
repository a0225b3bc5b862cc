"""Frames and acks taken a batch at a time, sans-I/O, against the rules applied one
message at a time: a relaying server reads the root's ``messages`` frames back as they
were framed and cuts frames for its local consumers; a client acks what it holds; a
producer's batch is stored, and kept in the log's tail, as the records one message at a
time would make."""

from __future__ import annotations

from collections import deque

from hypothesis import given
from hypothesis import strategies as st

from brokermgr import decode
from mq._delivery import messages_frame
from mq._files import VIEW_BODY
from mq._record import Entry, Record
from mq._relay_groups import Relayed, relayed_messages, take_frame
from mq._tail import Tail
from pump import ConfigError

_MESSAGES = st.lists(st.tuples(st.sampled_from([None, "a", "b.c"]), st.sampled_from(["p", "q"]),
                               st.integers(0, 3), st.integers(1, 3), st.binary(max_size=40)),
                     min_size=1, max_size=30)


def _relayed(rows: list[tuple[str | None, str, int, int, bytes]]) -> list[Relayed]:
    return [Relayed(100 + i, tag, producer, 7 + seq, deliveries, 1_000 + i, body)
            for i, (tag, producer, seq, deliveries, body) in enumerate(rows)]


@given(rows=_MESSAGES)
def test_a_relayed_frame_reads_back_as_it_was_framed(
        rows: list[tuple[str | None, str, int, int, bytes]]) -> None:
    messages = _relayed(rows)
    frame = messages_frame("t", "g", messages, [m.deliveries for m in messages])
    assert relayed_messages(decode(bytes(frame))) == messages


@given(sizes=st.lists(st.integers(0, 50), min_size=1, max_size=40),
       credits=st.integers(1, 45), frame_bytes=st.integers(1, 200))
def test_a_frame_for_a_local_consumer_ends_where_credits_or_its_bytes_do(
        sizes: list[int], credits: int, frame_bytes: int) -> None:
    messages = [Relayed(i, None, "p", i, 1, 0, b"x" * n) for i, n in enumerate(sizes)]
    expected: list[Relayed] = []
    size = 0
    rest = deque(messages)
    while rest and len(expected) < credits and size < frame_bytes:  # one at a time
        expected.append(rest.popleft())
        size += len(expected[-1].body)
    pending = deque(messages)
    assert take_frame(pending, credits, frame_bytes) == expected
    assert list(pending) == list(rest)


@given(held=st.sets(st.integers(0, 20)), stale=st.sets(st.integers(0, 20)),
       offsets=st.lists(st.integers(0, 20), min_size=1, max_size=12))
def test_a_client_acks_what_it_holds_and_drops_what_came_on_a_lost_link(
        held: set[int], stale: set[int], offsets: list[int]) -> None:
    """Each offset the subscription holds is taken (once), one that came on a lost link
    is dropped from the ack (delivered again), any other is kept for the server to
    refuse; a consecutive run goes as its first offset and a count."""
    from mq._subscription import Subscription

    sub = Subscription(None, "t", "g", 10)  # type: ignore[arg-type]
    sub.held = dict.fromkeys(sorted(held))
    sub.stale = dict.fromkeys(sorted(stale - held))
    left_held, left_stale, kept = set(held), set(stale - held), []
    for offset in offsets:  # the rule, one offset at a time
        if offset in left_held:
            left_held.discard(offset)
            kept.append(offset)
        elif offset in left_stale:
            left_stale.discard(offset)
        else:
            kept.append(offset)
    request = sub.ack_request(offsets)
    if not kept:
        assert request is None
    else:
        assert request is not None
        sent = request["offsets"]
        if "count" in request:
            sent = list(range(sent, sent + request["count"]))
        assert sent == kept
    assert (set(sub.held), set(sub.stale)) == (left_held, left_stale)


@given(tag=st.sampled_from([None, "", "a.b", "x" * 255, "y" * 256]),
       producer=st.sampled_from(["p", "q" * 255, "r" * 256]),
       rows=st.lists(st.tuples(st.integers(0, 2**40), st.binary(max_size=30)), min_size=1,
                     max_size=20),
       max_body=st.integers(0, 40), first=st.integers(0, 2**40))
def test_a_producer_s_batch_is_stored_as_records_made_one_at_a_time(
        tag: str | None, producer: str, rows: list[tuple[int, bytes]], max_body: int,
        first: int) -> None:
    """The records of a batch of one tag and one producer id, made by C iterators, are
    the bytes (and lengths, and errors) of records made one message at a time."""
    from mq._record import _encode_each, encode_batch

    messages = [(tag, producer, sequence, body) for sequence, body in rows]
    try:
        expected: object = _encode_each(first, 1_700_000_000_000, messages, max_body)
    except ConfigError as exc:
        expected = str(exc)
    try:
        got: object = encode_batch(first, 1_700_000_000_000, messages, max_body)
    except ConfigError as exc:
        got = str(exc)
    if not isinstance(expected, str):
        assert isinstance(got, tuple)
        expected = (b"".join(expected[0]), expected[1])
        got = (b"".join(got[0]), got[1])
    assert got == expected


def _keep_one_by_one(tail: Tail, first: int, now: int, messages: list[Entry]) -> None:
    """:meth:`Tail.keep` one record at a time: the rule the batch path follows."""
    total = tail._total(first)  # noqa: SLF001 - the rule, against the class's own state
    offset = first
    for tag, producer, sequence, body in messages:
        kept = body if len(body) >= VIEW_BODY else bytes(body)
        tail.records.append(Record(offset, now, sequence, tag or None, producer, kept))
        total += len(kept)
        tail.ends.append(total)
        offset += 1
    tail._trim(total)  # noqa: SLF001


@given(batches=st.lists(st.lists(st.tuples(st.sampled_from([None, "", "a"]),
                                           st.sampled_from(["p", "q"]), st.integers(0, 9),
                                           st.integers(0, VIEW_BODY + 5)), max_size=12),
                        max_size=8),
       limit=st.integers(1, 3 * VIEW_BODY), gap=st.booleans())
def test_the_tail_keeps_a_batch_as_it_keeps_one_record_at_a_time(
        batches: list[list[tuple[str | None, str, int, int]]], limit: int,
        gap: bool) -> None:
    batch_path, rule = Tail(limit), Tail(limit)
    first = 10
    for i, batch in enumerate(batches):
        messages: list[Entry] = [(tag, producer, seq, memoryview(bytes([seq]) * size))
                                 for tag, producer, seq, size in batch]
        if gap and i == 3:
            first += 5  # a record that does not follow the newest starts afresh
        batch_path.keep(first, 1_000 + i, messages)
        _keep_one_by_one(rule, first, 1_000 + i, messages)
        first += len(messages)
        assert batch_path.held() == rule.held()
        assert (batch_path.ends, batch_path.start, batch_path.floor) == (
            rule.ends, rule.start, rule.floor)
        assert [type(r.body) for r in batch_path.held()] == [
            type(r.body) for r in rule.held()]
