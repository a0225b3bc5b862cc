"""Recovery: a cut at every byte of the last segment, and random appends, acks, restarts
and crashes under hypothesis; what was acknowledged is always there."""

from __future__ import annotations

import os
import pathlib
import shutil
import tempfile
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mq import CursorStore, TopicLog
from mq.storage._record import SEGMENT_HEADER


@pytest.mark.slow  # thousands of reopened logs: CI runs it, the quick loop does not
def test_a_cut_at_every_byte_of_the_last_segment_keeps_exactly_the_whole_records(
        tmp_path: pathlib.Path) -> None:
    source = tmp_path / "source"
    log = TopicLog(source, segment_bytes=4096)
    messages = [(f"tag.{i % 3}" if i % 2 else None, f"p{i % 2}", i, os.urandom(i * 7 % 300))
                for i in range(60)]
    for message in messages:
        log.append([message])
    log.sync()
    last = log.segments[-1]
    assert len(log.segments) > 2 and last.next_offset - last.base >= 3
    # where each record of the last segment ends
    ends, pos = [], SEGMENT_HEADER.size
    for record in log.read(last.base, max_count=1000):
        pos += record.size
        ends.append(pos)
    assert ends[-1] == last.size
    name, base, size = last.path.name, last.base, last.size
    log.close()
    for cut in range(SEGMENT_HEADER.size, size + 1):
        copy = tmp_path / f"cut{cut}"
        shutil.copytree(source, copy)
        with open(copy / "segments" / name, "r+b") as f:
            f.truncate(cut)
        again = TopicLog(copy, segment_bytes=4096)
        whole = sum(1 for end in ends if end <= cut)
        kept = max([SEGMENT_HEADER.size] + [end for end in ends if end <= cut])
        assert again.next_offset == base + whole, cut
        assert again.cut_bytes == cut - kept and again.corruptions == []
        got = [(r.tag, r.producer, r.sequence, r.body) for r in again.read(0, max_count=1000)]
        assert got == messages[:base + whole], cut
        assert again.append([(None, "after", 0, b"x")]) == base + whole
        again.close()
        shutil.rmtree(copy)


def test_a_segment_torn_inside_its_header_is_written_again_and_loses_nothing(
        tmp_path: pathlib.Path) -> None:
    """A process killed as it rolled to a new segment, between the file's creation and
    its header's write, leaves a last segment of 0 to 23 bytes: the log opens with every
    record of the segments before, the segment's header written again, and appends go
    on there."""
    source = tmp_path / "source"
    log = TopicLog(source, segment_bytes=4096)
    messages = [(None, "p", i, os.urandom(200)) for i in range(40)]
    for message in messages:
        log.append([message])
    log.sync()
    last = log.segments[-1]
    assert len(log.segments) >= 2
    name, base = last.path.name, last.base
    kept = [m for m in messages if m[2] < base]
    log.close()
    for cut in range(SEGMENT_HEADER.size):
        copy = tmp_path / f"cut{cut}"
        shutil.copytree(source, copy)
        with open(copy / "segments" / name, "r+b") as f:
            f.truncate(cut)
        again = TopicLog(copy, segment_bytes=4096)
        assert again.next_offset == base and again.cut_bytes == cut, cut
        got = [(r.tag, r.producer, r.sequence, r.body) for r in again.read(0, max_count=1000)]
        assert got == kept, cut
        assert again.append([(None, "after", 0, b"x")]) == base
        again.close()
        reopened = TopicLog(copy, segment_bytes=4096)
        assert reopened.next_offset == base + 1
        reopened.close()
        shutil.rmtree(copy)


op = st.one_of(
    st.tuples(st.just("append"), st.lists(st.integers(0, 600), min_size=1, max_size=8)),
    st.tuples(st.just("sync")),
    st.tuples(st.just("ack"), st.sampled_from(["g1", "g2"]), st.floats(0, 1)),
    st.tuples(st.just("restart")),
    st.tuples(st.just("crash"), st.floats(0, 1)),
)


@given(st.lists(op, min_size=1, max_size=40))
def test_acknowledged_messages_survive_restarts_and_crashes(steps: list[tuple[Any, ...]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        directory = pathlib.Path(tmp)
        log = TopicLog(directory, segment_bytes=2048)
        cursors = CursorStore(directory)
        written: list[bytes] = []  # every body appended, by offset
        acked: dict[str, int] = {}
        synced: tuple[str, int] | None = None  # the last segment and its size at the last sync
        try:
            for step in steps:
                kind = step[0]
                if kind == "append":
                    batch = [os.urandom(n) for n in step[1]]
                    assert log.append([(None, "p", len(written) + i, b)
                                       for i, b in enumerate(batch)]) == len(written)
                    written += batch
                elif kind == "sync":
                    log.sync()
                    synced = (log.segments[-1].path.name, log.segments[-1].size)
                elif kind == "ack" and log.durable_offset > 0:
                    # a consumer acknowledges up to some point of what is durable
                    offset = int(step[2] * log.durable_offset)
                    cursors.save(step[1], offset)
                    acked[step[1]] = offset
                elif kind == "restart":
                    log.close()
                    log = TopicLog(directory, segment_bytes=2048)
                    assert log.next_offset == len(written)  # a clean restart loses nothing
                    synced = (log.segments[-1].path.name, log.segments[-1].size)
                elif kind == "crash":
                    durable = log.durable_offset
                    last = log.segments[-1]
                    floor = synced[1] if synced and synced[0] == last.path.name else \
                        SEGMENT_HEADER.size
                    cut = floor + int(step[1] * (last.size - floor))
                    log.close()
                    with open(last.path, "r+b") as f:  # what never reached the disk
                        f.truncate(cut)
                    log = TopicLog(directory, segment_bytes=2048)
                    survived = log.next_offset
                    assert durable <= survived <= len(written)
                    written = written[:survived]
                    synced = (log.segments[-1].path.name, log.segments[-1].size)
                # what the log holds is exactly what was written, in order
                assert log.next_offset == len(written)
                assert log.durable_offset <= log.next_offset
            got = []
            offset = 0
            while records := log.read(offset, max_count=500):
                got += [r.body for r in records]
                offset = records[-1].offset + 1
            assert got == written
            assert log.corruptions == []
            loaded = cursors.load(acked)
            assert loaded == acked
            assert all(0 <= c <= log.next_offset for c in loaded.values())
        finally:
            log.close()
