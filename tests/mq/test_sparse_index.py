"""A segment's sparse index: what reads find with it, its file form, and what it costs in
memory as the log grows."""

from __future__ import annotations

import bisect
import pathlib
import tempfile
import tracemalloc

from hypothesis import given
from hypothesis import strategies as st

from mq import TopicLog
from mq.storage._index import SparseIndex

# entries as segments make them: offsets and positions rising, timestamps not falling
entries = st.lists(st.tuples(st.integers(1, 50), st.integers(1, 9000), st.integers(0, 5)),
                   max_size=60).map(lambda steps: _rising(steps))


def _rising(steps: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    out, offset, position, ts = [], 0, 0, 1_790_000_000_000
    for d_offset, d_position, d_ts in steps:
        offset, position, ts = offset + d_offset, position + d_position, ts + d_ts
        out.append((offset, position, ts))
    return out


@given(entries, st.integers(0, 3000))
def test_a_read_by_offset_starts_where_a_list_of_the_entries_says(
        listed: list[tuple[int, int, int]], relative: int) -> None:
    index = SparseIndex(listed)
    i = bisect.bisect_right(listed, (relative, 1 << 64, 0)) - 1
    assert index.position_of(relative) == (listed[i][1] if i >= 0 else None)


@given(entries, st.integers(1_790_000_000_000, 1_790_000_000_400))
def test_a_read_by_time_starts_where_a_list_of_the_entries_says(
        listed: list[tuple[int, int, int]], timestamp: int) -> None:
    index = SparseIndex(listed)
    i = bisect.bisect_left([e[2] for e in listed], timestamp) - 1
    assert index.offset_before(timestamp) == (listed[i][0] if i >= 0 else None)


@given(entries)
def test_the_index_file_form_round_trips(listed: list[tuple[int, int, int]]) -> None:
    index = SparseIndex(listed)
    again = SparseIndex.from_bytes(index.to_bytes())
    assert again == index == listed
    assert list(again) == listed and len(again) == len(listed)
    assert again.last_position == (listed[-1][1] if listed else None)


def test_a_log_holds_well_under_one_percent_of_what_it_stores_in_its_index() -> None:
    """The index is what a log's memory grows with as it stores: an entry every 4 KiB
    of log, each once a tuple of three ints (about 150 bytes: 3.7 % of the log)."""
    with tempfile.TemporaryDirectory() as tmp:
        log = TopicLog(pathlib.Path(tmp) / "t", segment_bytes=1 << 20)
        body = b"m" * 1000
        log.append([(None, "p", 0, body)], keep=False)  # the first segment made
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for i in range(1, 8001):  # about 8 MiB in eight segments
                log.append([(None, "p", i, body)], keep=False)
            grown = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        stored = sum(segment.size for segment in log.segments)
        entries = sum(len(segment.index) for segment in log.segments)
        log.close()
    assert stored > 8_000_000 and entries > 1_900
    assert grown < stored // 100, f"{grown} bytes held for {stored} stored"
