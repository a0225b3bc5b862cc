"""What a relaying server makes of the root's frames, sans-I/O: the messages of a
``messages`` frame read back as they were framed, and the frames it cuts for its local
consumers, against the rule applied one message at a time."""

from __future__ import annotations

from collections import deque

from hypothesis import given
from hypothesis import strategies as st

from brokermgr import decode
from mq._delivery import messages_frame
from mq._relay_groups import Relayed, relayed_messages, take_frame

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
