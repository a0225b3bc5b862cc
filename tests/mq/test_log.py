"""A topic's durable log on real files: append, read, seek, roll, retention, recovery."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import pathlib
import struct
import subprocess
import sys
import zlib
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mq import CursorStore, FormatError, StoreError, TopicLog
from mq.storage._cursor import SLOT, SLOT_GAP
from mq.storage._files import VIEW_BODY
from mq.storage._record import SEGMENT_HEADER, Produced
from mq.storage._tail import Kept
from mq.topics._topic import Log

Clock = list[float]


def clock_at(t: float = 1_790_000_000.0) -> tuple[Clock, object]:
    now = [t]
    return now, lambda: now[0]


def fill(log: TopicLog, n: int, size: int = 100, tag: str | None = "t") -> list[int]:
    return [log.append([(tag, "p1", i, bytes([i % 256]) * size)]) for i in range(n)]


def bodies(log: TopicLog, offset: int = 0) -> list[bytes | memoryview]:
    out: list[bytes | memoryview] = []
    while True:
        records = log.read(offset, max_count=1000)
        if not records:
            return out
        out += [r.body for r in records]
        offset = records[-1].offset + 1


def test_append_read_and_reopen(tmp_path: pathlib.Path) -> None:
    log = TopicLog(tmp_path)
    assert log.append([("eu.orders", "p1", 7, b"hello"), (None, "p1", 8, b"world")]) == 0
    assert log.append([(None, "p2", 1, b"!")]) == 2
    (first, second, third) = log.read(0)
    assert (first.offset, first.tag, first.producer, first.sequence, first.body) == (
        0, "eu.orders", "p1", 7, b"hello")
    assert second.tag is None and third.producer == "p2"
    assert [r.offset for r in log.read(1, max_count=1)] == [1]
    log.close()
    again = TopicLog(tmp_path)
    assert again.next_offset == 3 and [r.body for r in again.read(0)] == [
        b"hello", b"world", b"!"]
    assert again.corruptions == [] and again.cut_bytes == 0
    again.close()


def test_segments_roll_and_the_index_finds_any_offset(tmp_path: pathlib.Path) -> None:
    log = TopicLog(tmp_path, segment_bytes=20_000)
    fill(log, 1000)
    assert len(log.segments) > 5
    assert log.durable_offset >= log.segments[-2].next_offset  # sealed ones are fsynced
    for offset in (0, 1, 199, 200, 555, 999):
        (record,) = log.read(offset, max_count=1)
        assert record.offset == offset and record.body == bytes([offset % 256]) * 100
    assert log.read(1000) == []
    log.close()
    # sealed segments come back from their index, the last one is read whole
    again = TopicLog(tmp_path, segment_bytes=20_000)
    assert again.next_offset == 1000 and bodies(again) == [bytes([i % 256]) * 100
                                                         for i in range(1000)]
    again.close()


def test_sealed_segments_flushed_in_a_thread_are_the_same_files(
        tmp_path: pathlib.Path) -> None:
    """With ``flush_in_thread`` a sealed segment is fsynced and indexed while appends go on
    to the next: the same segment and index files as sealing inline, every record
    readable meanwhile, durable once a sync (which waits for the flush) says so."""
    made = {}
    for flushed in (False, True):
        log = TopicLog(tmp_path / str(flushed), segment_bytes=20_000,
                       clock=lambda: 1_790_000_000.0, flush_in_thread=flushed)
        fill(log, 1000)
        assert len(log.segments) > 5 and bodies(log) == [bytes([i % 256]) * 100
                                                         for i in range(1000)]
        assert log.sync() == 1000 and log.durable_offset == 1000
        log.close()
        files = sorted((tmp_path / str(flushed) / "segments").iterdir())
        made[flushed] = {f.name: f.read_bytes() for f in files}
        again = TopicLog(tmp_path / str(flushed), segment_bytes=20_000)
        assert again.next_offset == 1000 and again.corruptions == [] == [
            f for f in files if f.suffix == ".tmp"]
        again.close()
    assert made[True] == made[False]
    assert sum(name.endswith(".idx") for name in made[True]) == len(made[True]) // 2


def test_a_flush_that_fails_refuses_every_later_write(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    log = TopicLog(tmp_path, segment_bytes=20_000, flush_in_thread=True)
    real = os.fsync
    sealed = log.segments[0].fd

    def broken(fd: int) -> None:
        if fd == sealed:
            raise OSError(errno.EIO, "Input/output error")
        real(fd)

    monkeypatch.setattr(os, "fsync", broken)
    while len(log.segments) == 1:  # until the first segment is sealed
        fill(log, 1)
    with pytest.raises(StoreError, match="fsync failed: Input/output error"):
        log.sync()
    monkeypatch.undo()
    assert log.durable_offset == 0
    assert "refuses writes until it is opened again" in caplog.text
    with pytest.raises(StoreError, match="refusing writes: fsync failed"):
        log.append([(None, "p", 0, b"z")])
    log.close()


def test_a_segment_sealed_but_not_flushed_when_the_process_died_is_read_whole(
        tmp_path: pathlib.Path) -> None:
    """A killed process can leave the segment before the last without its index (the
    flush was under way): opening reads it whole, writes its index and keeps every
    record; cut short (a machine that crashed before its records reached the disk), the
    records lost are reported and the next segment's are kept."""
    log = TopicLog(tmp_path, segment_bytes=20_000)
    fill(log, 600)
    log.close()
    sealed = sorted((tmp_path / "segments").glob("*.seg"))[:-1]
    indexes = sorted((tmp_path / "segments").glob("*.idx"))
    assert len(sealed) == len(indexes) >= 2
    indexes[-1].unlink()
    again = TopicLog(tmp_path, segment_bytes=20_000)
    assert bodies(again) == [bytes([i % 256]) * 100 for i in range(600)]
    assert again.corruptions == [] and indexes[-1].exists()
    again.close()
    size = sealed[-1].stat().st_size
    for cut in (size - 1, size - 150, size - 300):
        indexes[-1].unlink(missing_ok=True)
        with open(sealed[-1], "r+b") as f:
            f.truncate(cut)
        again = TopicLog(tmp_path, segment_bytes=20_000)
        (lost,) = again.corruptions
        assert lost.last is not None  # the next segment's base bounds what is lost
        kept = [r.offset for r in again.read(0, max_count=1000)]
        assert again.next_offset == 600 and kept[-1] == 599
        assert set(range(600)) - set(kept) == set(range(lost.first, lost.last + 1)) != set()
        again.close()


def test_the_tail_in_memory_reads_what_the_files_hold(tmp_path: pathlib.Path) -> None:
    """Readers that keep up are served from memory (the newest bodies up to
    ``tail_bytes``); whatever it holds, a read gives what a cold read of the files gives,
    with the same count and byte budgets."""
    log = TopicLog(tmp_path, tail_bytes=5_000, segment_bytes=20_000)
    for n in range(600):  # batches of 1..7 records of 10..400 bytes, mixed tags
        log.append([("t" if i % 3 else None, f"p{n % 2}", n * 10 + i,
                     bytes([n % 256]) * (10 + (n * 37 + i * 11) % 390))
                    for i in range(1 + n % 7)])
    cold = TopicLog(tmp_path, tail_bytes=0, segment_bytes=20_000)
    assert cold.next_offset == log.next_offset > 2_000 and len(log.segments) > 2
    in_memory = {id(r) for r in log.tail.held()}
    served_from_memory = 0
    end = log.next_offset
    for offset in sorted({*range(0, end, 7), *range(end - 60, end + 2)}):
        for max_count, max_bytes in ((1, 1 << 20), (5, 1 << 20), (1000, 700), (1000, 1)):
            got = log.read(offset, max_count=max_count, max_bytes=max_bytes)
            assert got == cold.read(offset, max_count=max_count, max_bytes=max_bytes), (
                offset, max_count, max_bytes)  # every field of every record
            served_from_memory += bool(got) and id(got[0]) in in_memory
    assert served_from_memory > 20
    held = sum(len(r.body) for r in log.tail.held())
    assert 5_000 - 400 < held <= 5_000  # bounded; the oldest go first, a body at a time
    log.close()
    cold.close()


@given(reads=st.lists(st.tuples(st.integers(0, 260), st.integers(1, 40),
                                st.sampled_from([1, 700, 5_000, 1 << 20])),
                      min_size=1, max_size=40))
@settings(max_examples=60, deadline=None)
def test_reads_behind_the_tail_are_served_again_as_the_files_give_them(
        tmp_path_factory: pytest.TempPathFactory, reads: list[tuple[int, int, int]]) -> None:
    """Readers behind the tail read the files, and the next reader of that stretch is
    served what the last read gave (a topic's groups behind its producers): whatever the
    reads, each gives what a cold read of the files gives, with the same budgets, around
    a record that damage lost too."""
    path = tmp_path_factory.mktemp("log")
    log = TopicLog(path, tail_bytes=2_000, segment_bytes=20_000)
    for n in range(60):  # batches of 1..7 records of 10..400 bytes, mixed tags
        log.append([("t" if i % 3 else None, f"p{n % 2}", n * 10 + i,
                     bytes([n % 256]) * (10 + (n * 37 + i * 11) % 390))
                    for i in range(1 + n % 7)])
    log.close()
    segment = sorted((path / "segments").glob("*.seg"))[1]
    data = bytearray(segment.read_bytes())
    data[SEGMENT_HEADER.size + 50] ^= 0xFF  # the second segment's first record is lost
    segment.write_bytes(bytes(data))
    log, cold = (TopicLog(path, tail_bytes=tail, segment_bytes=20_000)
                 for tail in (2_000, 0))
    for offset, max_count, max_bytes in reads:
        got = log.read(offset, max_count=max_count, max_bytes=max_bytes)
        assert got == cold.read(offset, max_count=max_count, max_bytes=max_bytes)
    assert log.read_back.size <= 4 << 20 and cold.read_back.size == 0
    log.close()
    cold.close()


def test_readers_behind_one_after_the_other_read_the_files_once(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ten groups behind the tail read the same stretch one after the other, a batch
    each in turn: the files are read (and each record checked) for the first only.  What
    was read back goes once every group is past it, or once the topic has no reader."""
    log = TopicLog(tmp_path, tail_bytes=10_000)
    fill(log, 2_000)
    preads = []
    real = os.pread
    monkeypatch.setattr(os, "pread", lambda *a: preads.append(a) or real(*a))
    positions = [0] * 10
    while positions[-1] < 1_800:
        for group, at in enumerate(positions):
            got = log.read(at, max_count=100)
            assert [r.offset for r in got] == list(range(at, at + 100))
            positions[group] = at + 100
        log.release(min(positions))  # as a topic does once its groups read on
    reads = len(preads)
    assert 0 < reads <= 18 * 2  # the first group's reads; the nine others', none
    assert log.read_back.size < 100 * 200  # what every group read is let go
    log.read(0, max_count=100)
    assert log.read_back.size == 100 * 100
    # the topic's readers gone (its next appends are not kept for one): let go too
    log.append([(None, "p", 0, b"later")], keep=False)
    assert log.read_back.size == 0 and log.read(0, max_count=1)[0].offset == 0
    log.close()


def test_the_logs_of_a_process_keep_at_most_their_shared_budget_in_memory(
        tmp_path: pathlib.Path) -> None:
    """Twenty topics whose readers are behind, each keeping up to 50,000 bytes in its
    tail and 4 MiB read back: together they keep at most the 125,000 bytes they share,
    the topics written least recently letting go of theirs first (each its newest record
    aside); every read still gives what a cold read of the files gives."""
    kept = Kept(125_000)
    logs = [TopicLog(tmp_path / f"t{i}", tail_bytes=50_000, kept=kept) for i in range(20)]
    for log in logs:
        fill(log, 400)  # 40,000 bytes of bodies, none read
        assert kept.total <= 125_000
    assert sum(log.tail.size + log.read_back.size for log in logs) == kept.total
    assert [log.tail.size > 100 for log in logs] == [False] * 17 + [True] * 3
    assert kept.shed == 17
    for log in logs:  # readers behind: from the files, kept as read back, within budget
        cold = TopicLog(log.directory, tail_bytes=0, kept=Kept(0))
        for at in range(0, 400, 50):
            assert log.read(at, max_count=50) == cold.read(at, max_count=50)
            assert kept.total <= 125_000
        cold.close()
    for log in logs:
        log.close()
    assert kept.total == 0 and not kept.line


def test_seek_by_time(tmp_path: pathlib.Path) -> None:
    now, clock = clock_at()
    log = TopicLog(tmp_path, segment_bytes=20_000, clock=clock)  # type: ignore[arg-type]
    for i in range(600):
        now[0] += 0.5
        log.append([(None, "p", i, b"x" * 100)])
    t = int((1_790_000_000.0 + 0.5 * 301) * 1000)
    assert log.offset_for_time(t) == 300
    assert log.offset_for_time(0) == 0
    assert log.offset_for_time(t * 2) == 600
    now[0] -= 100  # the clock goes back: timestamps do not
    log.append([(None, "p", 600, b"late")])
    (late,) = log.read(600)
    assert late.timestamp == log.read(599)[0].timestamp
    log.close()


def test_retention_by_size_and_age_deletes_whole_old_segments(tmp_path: pathlib.Path) -> None:
    now, clock = clock_at()
    log = TopicLog(tmp_path, segment_bytes=20_000, clock=clock)  # type: ignore[arg-type]
    fill(log, 500)
    segments = len(log.segments)
    assert log.retain(max_bytes=10**9) == 0
    gone = log.retain(max_bytes=60_000)
    assert gone > 0 and log.size_bytes <= 60_000 + 20_000 and log.start_offset == gone
    assert log.read(0)[0].offset == gone  # older offsets read from the oldest held
    now[0] += 3600
    log.append([(None, "p", 0, b"fresh")])
    assert log.retain(max_age=60) > 0
    assert len(log.segments) == 1 and log.start_offset == log.segments[-1].base
    assert len(list((tmp_path / "segments").glob("*.seg"))) == 1 < segments
    log.close()


def test_a_file_of_another_version_is_refused(tmp_path: pathlib.Path) -> None:
    log = TopicLog(tmp_path)
    fill(log, 3)
    log.close()
    path = tmp_path / "segments" / f"{0:020d}.seg"
    data = bytearray(path.read_bytes())
    data[8:12] = struct.pack("<I", 2)
    path.write_bytes(bytes(data))
    with pytest.raises(FormatError, match="format version 2; this rdvpump reads version 1"):
        TopicLog(tmp_path)


def test_a_file_that_is_no_segment_is_refused(tmp_path: pathlib.Path) -> None:
    (tmp_path / "segments").mkdir()
    (tmp_path / "segments" / f"{0:020d}.seg").write_bytes(b"x" * 64)
    with pytest.raises(FormatError, match="not an rdvpump queue segment"):
        TopicLog(tmp_path)


def test_a_corrupt_record_in_the_middle_is_reported_and_reading_goes_on(
        tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture) -> None:
    log = TopicLog(tmp_path)
    fill(log, 50)
    record_size = 36 + 1 + 2 + 100
    log.close()
    path = tmp_path / "segments" / f"{0:020d}.seg"
    data = bytearray(path.read_bytes())
    at = SEGMENT_HEADER.size + 20 * record_size + 60  # inside record 20's body
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.ERROR, logger="rdvpump.mq"):
        again = TopicLog(tmp_path)
    (corruption,) = again.corruptions
    assert corruption.file == str(path)
    assert corruption.position == SEGMENT_HEADER.size + 20 * record_size
    assert "checksum mismatch" in caplog.text and str(path) in caplog.text
    offsets = [r.offset for r in again.read(0, max_count=100)]
    assert offsets == [*range(20), *range(21, 50)]  # only the damaged one is lost
    assert again.next_offset == 50 and again.append([(None, "p", 0, b"new")]) == 50
    again.close()


def test_a_failed_write_stores_nothing_and_the_log_goes_on(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = TopicLog(tmp_path)
    fill(log, 5)
    log.sync()
    real = os.pwritev

    def full_after_some(fd: int, chunks: list[bytes | memoryview], at: int) -> int:
        data = b"".join(chunks)
        os.pwrite(fd, data[:len(data) // 2], at)  # half of it reaches the file
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwritev", full_after_some)
    with pytest.raises(StoreError, match="write failed, nothing stored: No space left"):
        log.append([(None, "p", 9, b"y" * 1000)])
    monkeypatch.setattr(os, "pwritev", real)
    assert log.next_offset == 5 and len(log.read(0)) == 5
    assert log.append([(None, "p", 9, b"after")]) == 5  # space again: it goes on
    log.close()
    again = TopicLog(tmp_path)
    assert again.cut_bytes == 0 and [r.body for r in again.read(5)] == [b"after"]
    again.close()


def test_a_producers_run_whose_write_fails_stores_nothing_and_one_cut_short_is_finished(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A produce request's small messages go in one write of the records encoded in C: a
    failed one (a full disk, half of it in the file) stores nothing and the log goes on;
    a short one (a nearly full disk) is finished by the rest."""
    log = TopicLog(tmp_path)
    fill(log, 5)
    real = os.pwrite

    def full_after_some(fd: int, data: Any, at: int) -> int:
        real(fd, bytes(data)[:len(data) // 2], at)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full_after_some)
    with pytest.raises(StoreError, match="write failed, nothing stored: No space left"):
        log.append(Produced(None, "p", 9, b"y" * 1000, (400, 600)))
    calls: list[int] = []

    def short(fd: int, data: Any, at: int) -> int:
        calls.append(len(data))
        return real(fd, bytes(data)[:max(1, len(data) // 3)], at)

    monkeypatch.setattr(os, "pwrite", short)
    assert log.append(Produced("t", "p", 9, b"ab" * 600, (100, 1100))) == 5
    monkeypatch.setattr(os, "pwrite", real)
    assert len(calls) > 1 and log.next_offset == 7
    log.close()
    again = TopicLog(tmp_path)
    assert again.cut_bytes == 0 and again.corruptions == []
    assert [(r.offset, r.tag, r.sequence, r.body) for r in again.read(5)] == [
        (5, "t", 9, b"ab" * 50), (6, "t", 10, b"ab" * 550)]
    again.close()


def test_a_batch_of_more_pieces_than_one_gathered_write_takes_and_short_writes(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch is written as its pieces (large bodies as they are, runs of small pieces
    joined): more than the kernel takes in one pwritev go in several, and a short one (a
    nearly full disk) finishes the rest."""
    real, calls = os.pwritev, []

    def short(fd: int, chunks: list[bytes | memoryview], at: int) -> int:
        calls.append(len(chunks))
        return real(fd, chunks[:len(chunks) // 2 + 1], at) - 3  # not even those whole

    monkeypatch.setattr(os, "pwritev", short)
    log = TopicLog(tmp_path)
    # every other body large: 750 of them, each between two runs of small pieces
    batch = [(None, "p", i, bytes([i % 256]) * (i % 50 + (VIEW_BODY if i % 2 == 0 else 0)))
             for i in range(1500)]
    assert log.append(batch) == 0
    monkeypatch.setattr(os, "pwritev", real)
    log.close()
    assert calls == [1024, 1501 - 1024]  # 750 large bodies, 751 joined runs
    again = TopicLog(tmp_path)
    assert again.cut_bytes == 0 and bodies(again) == [body for *_, body in batch]
    again.close()


def test_a_failed_fsync_refuses_every_later_write(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = TopicLog(tmp_path)
    fill(log, 3)

    def broken(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", broken)
    with pytest.raises(StoreError, match="fsync failed: Input/output error"):
        log.sync()
    monkeypatch.undo()
    with pytest.raises(StoreError, match="refusing writes: fsync failed"):
        log.append([(None, "p", 0, b"z")])
    with pytest.raises(StoreError, match="refusing writes"):
        log.sync()  # never retried as if it had worked
    assert log.durable_offset == 0
    log.close()


def test_an_unwritable_directory_is_a_clear_error(tmp_path: pathlib.Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(StoreError, match="cannot open the queue"):
        TopicLog(tmp_path / "file" / "topic")


def test_a_queue_that_cannot_be_opened_is_refused_and_leaks_no_file(
        tmp_path: pathlib.Path) -> None:
    """Out of files (a server of many topics), or an epochs file that cannot be read:
    the same clear error, and the segments it had opened are closed again."""
    TopicLog(tmp_path / "t").close()
    (tmp_path / "t" / "epochs.json").mkdir()  # read, it fails as no JSON would
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(3):
        with pytest.raises(StoreError, match="cannot open the queue: Is a directory"):
            TopicLog(tmp_path / "t")
    assert len(os.listdir("/proc/self/fd")) == before


def test_sync_is_one_fsync_for_many_appends(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = TopicLog(tmp_path)
    log.sync()  # the new segment's directory entry too, once
    calls = []
    real = os.fsync

    def counted(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", counted)
    fill(log, 100)
    assert calls == [] and log.durable_offset == 0
    assert log.sync() == 100 and len(calls) == 1
    log.close()


def test_cursors_are_saved_in_place_and_damage_is_reported(
        tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture) -> None:
    store = CursorStore(tmp_path)
    store.save("billing", 41)
    path = tmp_path / "groups" / "billing.cursor"
    inode = path.stat().st_ino
    store.save("eu/ops group", 7)
    store.save("billing", 42)
    store.save("billing", 43)
    assert store.load(["billing", "eu/ops group", "never saved"]) == {"billing": 43,
                                                                      "eu/ops group": 7}
    # saved again in place: no file made, renamed or left behind
    assert path.stat().st_ino == inode
    assert not list((tmp_path / "groups").glob(".*"))
    data = path.read_bytes()
    # the slot holding the newest damaged: the other, the save before it, is read
    newest, = (at for at in (0, SLOT_GAP) if SLOT.unpack_from(data, at)[2] == 43)
    hurt = bytearray(data)
    hurt[newest + 13] ^= 1
    path.write_bytes(bytes(hurt))
    assert store.load(["billing"]) == {"billing": 42}
    store.save("billing", 44)  # written over the damaged slot
    assert store.load(["billing"]) == {"billing": 44}
    hurt = bytearray(path.read_bytes())
    hurt[13] ^= 1
    hurt[SLOT_GAP + 13] ^= 1
    path.write_bytes(bytes(hurt))
    with caplog.at_level(logging.ERROR, logger="rdvpump.mq"):
        assert store.load(["billing", "eu/ops group"]) == {"eu/ops group": 7}
    assert "cursor checksum mismatch in both slots" in caplog.text
    store.save("billing", 45)  # a file damaged in both slots is replaced whole
    assert store.load(["billing"]) == {"billing": 45}
    store.remove("eu/ops group")
    assert store.load(["billing", "eu/ops group"]) == {"billing": 45}


def test_a_cursor_save_a_crash_cuts_short_leaves_the_old_cursor_or_the_new(
        tmp_path: pathlib.Path) -> None:
    """A save writes one slot; a crash may leave any prefix of it on the disk, over the
    old bytes or over zeros.  Cut at every byte, the file reads as the cursor before the
    save or the one after, and the next saves go on from there."""
    store = CursorStore(tmp_path)
    path = store.path("billing")
    store.save("billing", 41)
    store.save("billing", 42)
    before = path.read_bytes()
    store.save("billing", 43)
    after = path.read_bytes()
    changed = [i for i in range(len(after)) if after[i] != before[i]]
    start, end = changed[0], changed[-1] + 1
    assert end - start <= SLOT.size and end <= len(after)  # one slot written
    for cut in range(start, end + 1):
        for rest in (before[cut:end], bytes(end - cut)):
            path.write_bytes(after[:cut] + rest + after[end:])
            got = store.load(["billing"])
            assert got == {"billing": 43 if cut == end else 42}, (cut, rest)
            store.save("billing", 50)
            store.save("billing", 51)
            assert store.load(["billing"]) == {"billing": 51}, cut
            path.write_bytes(before)


def test_a_version_1_cursor_is_read_and_replaced_by_the_next_save(
        tmp_path: pathlib.Path) -> None:
    store = CursorStore(tmp_path)
    path = store.path("billing")
    head = struct.pack("<8sIQ", b"RDVPQCUR", 1, 17)
    path.write_bytes(head + struct.pack("<I", zlib.crc32(head)))
    assert store.load(["billing"]) == {"billing": 17}
    store.save("billing", 18)
    assert len(path.read_bytes()) == SLOT_GAP + SLOT.size
    store.save("billing", 19)
    assert store.load(["billing"]) == {"billing": 19}


def test_a_queued_save_never_replaces_a_newer_one_nor_brings_back_a_removed_cursor(
        tmp_path: pathlib.Path) -> None:
    """Positions saved in the saver's thread (queued, written later) and saves or
    removals made at once: whatever the order they run in, each file ends as the newest
    asked for it, and each queued job reports its failed writes."""
    from mq.storage._cursor import CursorSaver

    posted: list[Any] = []
    saver = CursorSaver(posted.append, start=False)  # its jobs run here, one by one
    store = CursorStore(tmp_path, saver)
    reports: list[dict[Any, OSError]] = []

    def queue(group: str, floor: int) -> None:
        saver.submit([(group, store.path(group), floor)], reports.append)

    queue("billing", 5)
    store.save("billing", 7)  # newer, at once: the queued 5 is not written
    queue("audit", 3)
    store.remove("audit")  # the queued 3 does not bring it back
    queue("eu", 1)
    queue("eu", 2)  # two queued: the newer is written
    store.save("late", 9)
    queue("late", 10)  # queued after: written
    (tmp_path / "groups" / "lost").mkdir()
    saver.submit([("x", tmp_path / "groups" / "lost" / "nowhere" / "x.cursor", 1)],
                 reports.append)
    while saver._jobs.qsize():
        assert saver.run_one()
    for call in posted:
        call()
    assert store.load(["billing", "audit", "eu", "late"]) == {"billing": 7, "eu": 2,
                                                              "late": 10}
    assert [list(r) for r in reports] == [[], [], [], [], [], ["x"]]
    assert isinstance(reports[-1]["x"], FileNotFoundError)
    saver.close()
    assert saver._newest == {}  # nothing kept once written


def records(log: Log) -> list[tuple[object, ...]]:
    """Every record of ``log``, each as its fields."""
    out: list[tuple[object, ...]] = []
    offset = log.start_offset
    while records := log.read(offset, max_count=1000):
        out += [(r.offset, r.timestamp, r.sequence, r.tag, r.producer, bytes(r.body))
                for r in records]
        offset = records[-1].offset + 1
    return out


def _copies(log: TopicLog, offset: int, count: int) -> bytes:
    from mq.storage._record import encode_records

    records = log.read(offset, max_count=count, max_bytes=1 << 30)
    chunks, _ = encode_records(records, log.max_body)
    return b"".join(bytes(c) for c in chunks)


@given(st.lists(st.tuples(st.sampled_from([None, "eu", "ü"]), st.sampled_from(["p1", "p2"]),
                          st.binary(max_size=300)), min_size=1, max_size=12),
       st.data())
@settings(max_examples=200, deadline=None)
def test_a_run_of_copies_scans_as_record_by_record_decoding_would(
        entries: list[tuple[str | None, str, bytes]], data: st.DataObject) -> None:
    """:func:`scan_copies` (a replica's whole frame, or a file read back, in one C call)
    gives the records, their ends and the first fault that :func:`decode` called record by
    record gives, on whole frames, frames cut at any byte and frames with a byte flipped
    anywhere, from the start of a buffer or from a place in it, all or at most so many."""
    from mq.storage._copies import scan_copies
    from mq.storage._record import BadRecord, decode, encode_batch

    chunks, _ = encode_batch(7, 1000, [(tag, producer, i, body)
                                       for i, (tag, producer, body) in enumerate(entries)],
                             1 << 20)
    frame = bytearray(b"".join(bytes(c) for c in chunks))
    how = data.draw(st.sampled_from(["whole", "cut", "flip"]))
    if how == "cut":
        del frame[data.draw(st.integers(0, len(frame) - 1)):]
    elif how == "flip":
        frame[data.draw(st.integers(0, len(frame) - 1))] ^= data.draw(st.integers(1, 255))
    expected, ends, fault, pos = [], [], None, 0
    while pos < len(frame):
        try:
            found = decode(bytes(frame), pos, 1 << 20)
        except BadRecord as exc:
            fault = str(exc)
            break
        if found is None:
            fault = "the bytes end inside it"
            break
        record, pos = found
        expected.append(record)
        ends.append(pos)
    for given_as in (bytes(frame), memoryview(bytes(frame))):
        got = scan_copies(given_as, max_record=1 << 20, max_body=1 << 20, expected=7,
                          min_ts=1000, records=True)
        assert (got.records, got.ends, got.fault) == (expected, ends, fault)
        assert got.timestamps == [1000] * len(ends)
        assert got.fault_at == (ends[-1] if ends else 0)
        assert got.records is not None and all(type(r.body) is bytes for r in got.records)
        alone = scan_copies(given_as, max_record=1 << 20, max_body=1 << 20, expected=7,
                            min_ts=1000, records=False)
        assert (alone.records, alone.ends, alone.fault) == (None, ends, fault)
    # from a place in a buffer (a file read back): the same, counted from the buffer's
    # start; and at most so many
    before = data.draw(st.binary(max_size=50))
    later = scan_copies(before + bytes(frame), max_record=1 << 20, max_body=1 << 20,
                        expected=7, min_ts=1000, records=True, start=len(before))
    assert (later.records, later.fault) == (expected, fault)
    assert later.ends == [len(before) + end for end in ends]
    assert later.fault_at == len(before) + (ends[-1] if ends else 0)
    limit = data.draw(st.integers(0, len(expected)))
    some = scan_copies(before + bytes(frame), max_record=1 << 20, max_body=1 << 20,
                       expected=7, min_ts=1000, records=True, start=len(before), limit=limit)
    assert some.records == expected[:limit] and (some.fault is None or limit == len(expected))
    if how == "whole":
        assert [(r.tag, r.producer, r.body) for r in expected] == entries


@pytest.mark.parametrize(("first", "min_ts", "max_body", "fault"), [
    (8, 0, 1 << 20, "offset 7, 8 expected"),
    (7, 2000, 1 << 20, "timestamp 1000 before 2000"),
    (7, 0, 2, "a body of 3 bytes exceeds the queue's maximum of 2"),
])
def test_copies_out_of_line_are_named_at_the_first_record_out_of_line(
        first: int, min_ts: int, max_body: int, fault: str) -> None:
    from mq.storage._copies import scan_copies
    from mq.storage._record import encode_batch

    chunks, lengths = encode_batch(7, 1000, [(None, "p", 0, b"abc")], 1 << 20)
    got = scan_copies(b"".join(chunks), max_record=1 << 20, max_body=max_body,
                      expected=first, min_ts=min_ts, records=True)
    assert (got.ends, got.records, got.fault, got.fault_at) == ([], [], fault, 0)


@given(st.lists(st.integers(0, 40), min_size=1, max_size=30),
       st.lists(st.integers(0, 3000), min_size=1, max_size=8))
@settings(max_examples=25, deadline=None)
def test_the_sparse_index_of_appends_and_copies_is_the_one_a_scan_of_the_file_makes(
        batches: list[int], sizes: list[int]) -> None:
    """Batches appended (bodies of many sizes, across segments; as entries or as a
    producer's run) and copied to a replica leave each segment's index as reading its
    file back would rebuild it."""
    import tempfile

    from mq.storage._scan import scan_segment

    with tempfile.TemporaryDirectory() as tmp:
        master = TopicLog(pathlib.Path(tmp) / "m", segment_bytes=20_000)
        replica = TopicLog(pathlib.Path(tmp) / "r", segment_bytes=30_000)
        for i, count in enumerate(batches):
            lengths = [sizes[(i + j) % len(sizes)] for j in range(count)]
            first = master.append(
                Produced(None, "p", 0, b"b" * sum(lengths), tuple(lengths))
                if i % 2 and count and max(lengths) < VIEW_BODY else  # as produces come
                [(None, "p", j, b"b" * size) for j, size in enumerate(lengths)])
            if count:
                replica.append_copies(_copies(master, first, count))
        for log in (master, replica):
            for segment in log.segments:
                scan = scan_segment(segment.path.read_bytes(), segment.base, log.max_record,
                                    last=segment is log.segments[-1])
                assert segment.index == scan.index, segment.path
        master.close()
        replica.close()


@given(st.lists(st.integers(1, 40), min_size=500, max_size=1500)  # many to an entry
       | st.lists(st.integers(1, 3000), min_size=1, max_size=60),
       st.integers(0, 9000), st.integers(0, 5000))
def test_the_index_of_a_run_has_the_entries_a_look_at_every_record_makes(
        sizes: list[int], start: int, since: int) -> None:
    """:meth:`TopicLog._index_run` finds its entries by bisection: the same as
    looking at every record."""
    from itertools import accumulate

    from mq.storage._scan import INDEX_INTERVAL

    ends = list(accumulate(sizes))
    last = max(0, start - since)
    want, before = [], 0
    for i, end in enumerate(ends):
        if start + before - last >= INDEX_INTERVAL:
            want.append((100 + i - 90, start + before, 5000 + i))
            last = start + before
        before = end

    segment = SimpleNamespace(index=[], base=90, last_indexed=max(0, start - since))
    TopicLog._index_run(segment, 100, start, ends,  # type: ignore[arg-type]
                           [5000 + i for i in range(len(ends))])
    assert segment.index == want and segment.last_indexed == last


@given(st.one_of(st.lists(st.integers(0, 300), min_size=1, max_size=40),  # many lengths
                 st.tuples(st.integers(0, VIEW_BODY - 1), st.integers(1, 40))  # one length
                 .map(lambda p: [p[0]] * p[1])),
       st.sampled_from([None, "", "eu", "ü" * 127]), st.sampled_from(["", "p1", "x" * 255]),
       st.integers(0, 2**40), st.integers(0, 2**62), st.integers(0, 2**41),
       st.integers(0, 2**32 - 1), st.booleans())
def test_a_producers_messages_encoded_in_c_are_the_records_encode_batch_makes(
        sizes: list[int], tag: str | None, producer: str, first: int, sequence: int,
        timestamp: int, crc: int, as_view: bool) -> None:
    """:func:`encode_produced` (a produce request's small messages, one C call) writes
    the bytes :func:`encode_batch` writes, says where each record ends, and carries the
    segment's CRC-32 on over them as ``zlib.crc32`` would."""
    import zlib
    from itertools import accumulate

    from mq.storage._copies import encode_produced
    from mq.storage._record import Produced, encode_batch

    data = bytes(i % 251 for i in range(sum(sizes)))
    produced = Produced(tag, producer, sequence, memoryview(data) if as_view else data,
                        tuple(sizes))
    chunks, lengths = encode_batch(first, timestamp, produced.entries(), 1 << 20)
    want = b"".join(bytes(c) for c in chunks)
    out, ends, after = encode_produced(produced, first, timestamp, crc, 1 << 20)
    assert bytes(out) == want
    assert list(ends) == list(accumulate(lengths))
    assert after == zlib.crc32(want, crc)


def test_a_producers_messages_too_long_or_badly_named_are_refused() -> None:
    from mq.storage._copies import encode_produced
    from mq.storage._record import Produced
    from pump import ConfigError

    with pytest.raises(ConfigError, match="a body of 3 bytes exceeds the queue's maximum of 2"):
        encode_produced(Produced(None, "p", 0, b"abcd", (1, 3)), 0, 0, 0, 2)
    with pytest.raises(ConfigError, match="at most 255 bytes"):
        encode_produced(Produced("t" * 256, "p", 0, b"a", (1,)), 0, 0, 0, 10)


@given(st.binary(max_size=5000), st.integers(0, 2**32 - 1))
def test_the_c_crc32_is_zlibs(data: bytes, crc: int) -> None:
    """Folded with carry-less multiplies (where the CPU has them) or with tables, the
    CRC-32 of the records' C checks has ``zlib.crc32``'s values."""
    import zlib

    from mq.storage._records import lib

    want = zlib.crc32(data, crc)
    assert lib.rs_crc32(crc, data, len(data)) == want
    assert lib.rs_crc32_tables(crc, data, len(data)) == want
    cut = len(data) // 3  # and combined from the CRCs of two parts
    assert lib.rs_crc32_combine(zlib.crc32(data[:cut], crc), zlib.crc32(data[cut:]),
                                len(data) - cut) == want


def test_a_replica_stores_the_master_s_records_as_they_are(tmp_path: pathlib.Path) -> None:
    """Records copied from one log to another keep their offsets, timestamps, producers,
    sequences, tags and bodies, across segments and a reopen, byte for byte; the
    replica's segments and indexes are its own."""
    now, clock = clock_at()
    master = TopicLog(tmp_path / "master", segment_bytes=8192,
                      clock=clock)  # type: ignore[arg-type]
    for i in range(300):
        now[0] += 0.001 * (i % 3 == 0)  # runs of equal timestamps, and steps
        master.append([("eu" if i % 2 else None, f"p{i % 3}", i, bytes([i % 251]) * (i % 97))])
    replica = TopicLog(tmp_path / "replica", segment_bytes=5000)
    offset = 0
    for batch in (1, 7, 50, 242):
        assert replica.append_copies(_copies(master, offset, batch)) == batch
        offset += batch
    assert replica.next_offset == master.next_offset == 300
    assert records(replica) == records(master)
    assert replica.sync() == 300
    replica.close()
    again = TopicLog(tmp_path / "replica", segment_bytes=5000)
    assert records(again) == records(master) and again.corruptions == []
    assert again.append([(None, "p9", 1, b"after")]) == 300  # a promoted replica goes on
    again.close()
    master.close()


def test_copies_that_are_damaged_cut_short_or_out_of_line_store_nothing(
        tmp_path: pathlib.Path) -> None:
    _, clock = clock_at()
    master = TopicLog(tmp_path / "master", clock=clock)  # type: ignore[arg-type]
    fill(master, 10)
    replica = TopicLog(tmp_path / "replica")
    assert replica.append_copies(_copies(master, 0, 4)) == 4
    size = replica.size_bytes
    good = _copies(master, 4, 6)
    flipped = bytearray(good)
    flipped[len(good) // 2] ^= 0x01
    for data, says in ((bytes(flipped), "checksum mismatch"),
                       (good[:-1], "the bytes end inside it"),
                       (_copies(master, 5, 5), "offset 5, 4 expected"),
                       (_copies(master, 0, 2), "offset 0, 4 expected")):
        with pytest.raises(StoreError, match=says) as caught:
            replica.append_copies(data)
        assert "nothing stored" in str(caught.value)
        assert replica.next_offset == 4 and replica.size_bytes == size
    assert replica.append_copies(good) == 6
    assert replica.append_copies(b"") == 0
    # a record older than the replica's newest (its master's clock never goes back)
    from mq.storage._record import Record, encode_records

    chunks, _ = encode_records([Record(10, 0, 1, None, "p1", b"old")], replica.max_body)
    with pytest.raises(StoreError, match="timestamp 0 before"):
        replica.append_copies(b"".join(bytes(c) for c in chunks))
    assert replica.next_offset == 10
    replica.close()
    master.close()


def test_a_cut_at_any_offset_keeps_exactly_the_records_before_it(
        tmp_path: pathlib.Path) -> None:
    """A replica cuts a tail its master never had: at every offset of a log of several
    segments (sealed ones with their indexes, the last without), what is before the cut
    stays, byte for byte, on disk as in memory; the next record gets the cut's offset;
    the epochs that began past it go; reopening finds the same, nothing torn."""
    def build(where: pathlib.Path) -> TopicLog:
        log = TopicLog(where, segment_bytes=400)
        fill(log, 6)
        log.begin_epoch(2)
        fill(log, 8)
        log.begin_epoch(4)
        fill(log, 3)
        return log

    whole = build(tmp_path / "whole")
    assert len(whole.segments) >= 5 and whole.epochs.entries == [(0, 0), (2, 6), (4, 14)]
    expected = bodies(whole)
    whole.close()
    for offset in range(len(expected) + 1):
        log = build(tmp_path / str(offset))
        assert log.truncate(offset) == len(expected) - offset
        assert log.next_offset == offset and bodies(log) == expected[:offset]
        assert log.epochs.entries == [e for e in [(0, 0), (2, 6), (4, 14)]
                                      if e[1] < offset or e == (0, 0)]
        assert log.append([("t", "p2", 1, b"after the cut")]) == offset
        log.close()
        again = TopicLog(tmp_path / str(offset), segment_bytes=400)
        assert bodies(again) == [*expected[:offset], b"after the cut"]
        assert again.corruptions == [] and again.cut_bytes == 0
        assert again.epochs.entries == log.epochs.entries
        assert len(list((tmp_path / str(offset) / "segments").glob("*.idx"))) == \
            len(again.segments) - 1
        again.close()


def test_a_cut_before_the_oldest_record_held_is_refused(tmp_path: pathlib.Path) -> None:
    log = TopicLog(tmp_path, segment_bytes=400)
    fill(log, 12)
    assert log.retain(max_bytes=800) > 0 and log.start_offset > 0
    with pytest.raises(StoreError, match=f"the oldest record held is {log.start_offset}"):
        log.truncate(log.start_offset - 1)
    assert log.next_offset == 12 and log.truncate(12) == 0
    log.close()


@given(st.lists(st.lists(st.integers(0, 500), min_size=1, max_size=8), min_size=1,
                max_size=12),
       st.integers(0, 200), st.integers(1, 5000), st.integers(1, 30))
@settings(max_examples=60, deadline=None)
def test_the_newest_appends_as_written_are_the_records_encoded_again(
        batches: list[list[int]], at: int, max_bytes: int, max_count: int) -> None:
    """What a master sends a replica that keeps up, the pieces its appends wrote (a
    batch's chunks, or a producer's run encoded as one buffer), is byte for byte its
    records read back and encoded again: from any offset it holds (a batch's start or
    inside one, across batches), within the byte budget (at least one record) and the
    count."""
    import tempfile

    from mq.storage._record import encode_records

    with tempfile.TemporaryDirectory() as tmp:
        log = TopicLog(pathlib.Path(tmp) / "t", segment_bytes=4000)
        log.want_written()  # a replica follows: kept from now
        for i, sizes in enumerate(batches):
            entries = [("x" if i % 2 else None, f"p{i % 3}", j, bytes([j]) * size)
                       for j, size in enumerate(sizes)]
            log.append(entries if i % 3 else  # or as a produce request's run
                       Produced(entries[0][0], entries[0][1], 0,
                                b"".join(e[3] for e in entries), tuple(sizes)))
        offset = at % log.next_offset
        got = log.written_since(offset, max_bytes, max_count)
        assert got is not None
        chunks, count, size = got
        records = log.read(offset, max_count=count, max_bytes=1 << 30)
        again, lengths = encode_records(records, log.max_body)
        assert b"".join(bytes(c) for c in chunks) == b"".join(bytes(c) for c in again)
        assert size == sum(lengths) and 1 <= count <= max_count
        assert size - lengths[-1] < max_bytes  # each taken while the budget was not spent
        if log.read(offset + count, max_count=1) and count < max_count:
            assert size >= max_bytes  # it stopped at the budget, not before
        assert log.written_since(log.next_offset, max_bytes, max_count) is None
        log.close()


def test_what_is_kept_as_written_is_bounded_and_forgotten_when_records_stop_following(
        tmp_path: pathlib.Path) -> None:
    from mq.storage._written import KEPT_BATCHES

    now, clock = clock_at()
    log = TopicLog(tmp_path / "t", clock=clock)  # type: ignore[arg-type]
    log.append([(None, "p", 0, b"m")])
    assert log.written_since(0, 1 << 20, 100) is None  # kept only once wanted
    for i in range(1, KEPT_BATCHES + 5):
        log.want_written()  # at each shipment, while a replica follows
        log.append([(None, "p", i, b"m")])
    assert log.written_since(4, 1 << 20, 100) is None  # the oldest batches went
    assert log.written_since(5, 1 << 20, 100)[1] == KEPT_BATCHES  # type: ignore[index]
    log.truncate(60)  # records cut: nothing is kept
    assert log.written_since(59, 1 << 20, 100) is None
    log.want_written()
    log.append([(None, "p", 0, b"m")])
    assert log.written_since(60, 1 << 20, 100)[1] == 1  # type: ignore[index]
    for i in range(KEPT_BATCHES + 1):  # no one asks: it stops keeping, and forgets
        log.append([(None, "p", i, b"m")])
    assert log.written_since(60, 1 << 20, 100) is None
    assert log.written is not None and not log.written.batches
    replica = TopicLog(tmp_path / "r", clock=clock)  # type: ignore[arg-type]
    replica.want_written()
    replica.append([(None, "p", 0, b"m")])
    assert replica.written_since(0, 1 << 20, 100) is not None
    replica.append_copies(_copies(log, 1, 3))  # copies are not appends as written
    assert replica.written_since(0, 1 << 20, 100) is None
    log.close()
    replica.close()


def test_copies_no_one_reads_here_are_kept_only_on_disk(tmp_path: pathlib.Path) -> None:
    """A replica no consumer reads makes no record of its copies for memory, and forgets
    what it held there: reads take the file, and find every record."""
    now, clock = clock_at()
    master = TopicLog(tmp_path / "m", clock=clock)  # type: ignore[arg-type]
    replica = TopicLog(tmp_path / "r", clock=clock)  # type: ignore[arg-type]
    fill(master, 9)
    assert replica.append_copies(_copies(master, 0, 3)) == 3  # read here: kept
    assert [r.offset for r in replica.tail.held()] == [0, 1, 2]
    assert replica.append_copies(_copies(master, 3, 3), keep=False) == 3
    assert replica.tail.held() == []
    assert replica.append_copies(_copies(master, 6, 3)) == 3  # read again: kept anew
    assert [r.offset for r in replica.tail.held()] == [6, 7, 8]
    assert replica.read(0, max_count=9) == master.read(0, max_count=9)
    master.close()
    replica.close()


def open_segment_files(directory: pathlib.Path) -> int:
    """How many file descriptors of this process are open on ``directory``'s segments."""
    where = str(directory / "segments")
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor, closed since
            count += os.readlink(f"/proc/self/fd/{fd}").startswith(where)
    return count


@pytest.mark.parametrize("in_thread", [False, True], ids=["inline", "flush-thread"])
def test_a_log_keeps_two_files_open_however_many_segments_it_holds(
        tmp_path: pathlib.Path, in_thread: bool) -> None:
    log = TopicLog(tmp_path, segment_bytes=2_000, flush_in_thread=in_thread, tail_bytes=0)
    fill(log, 400)
    log.sync()
    assert len(log.segments) > 20
    # the last segment, and the one sealed last while its flush may still run
    assert open_segment_files(tmp_path) <= 2
    expected = [bytes([i % 256]) * 100 for i in range(400)]
    assert bodies(log) == expected  # every sealed segment read again from its file
    assert bodies(log, 150) == expected[150:]
    assert open_segment_files(tmp_path) <= 2  # the last, and the one read last
    log.retain(max_bytes=20_000)
    start = log.start_offset
    assert start > 0 and bodies(log, start) == expected[start:]
    log.truncate(start + 30)  # into a sealed segment: it is the last again
    log.append([("t", "p1", 999, b"after")])
    log.sync()
    assert bodies(log, start) == [*expected[start:start + 30], b"after"]
    assert open_segment_files(tmp_path) <= 2
    log.close()
    assert open_segment_files(tmp_path) == 0
    again = TopicLog(tmp_path, segment_bytes=2_000)
    assert open_segment_files(tmp_path) == 1  # only the last: the sealed ones on demand
    assert bodies(again, start) == [*expected[start:start + 30], b"after"]
    again.close()


def out_of_files_while(monkeypatch: pytest.MonkeyPatch, where: pathlib.Path) -> list[bool]:
    """``os.open`` of anything under ``where`` fails as a process out of descriptors
    does, while the flag returned is set."""
    real, short = os.open, [True]

    def refused(path: str | os.PathLike[str], *args: object, **kwargs: object) -> int:
        if short[0] and str(path).startswith(str(where)):
            raise OSError(errno.EMFILE, "Too many open files")
        return real(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", refused)
    return short


@pytest.mark.parametrize("in_thread", [False, True], ids=["inline", "flush-thread"])
def test_a_roll_out_of_files_stores_every_write_and_rolls_once_it_can(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture, in_thread: bool) -> None:
    log = TopicLog(tmp_path, segment_bytes=2_000, flush_in_thread=in_thread)
    fill(log, 10)
    log.sync()
    short = out_of_files_while(monkeypatch, tmp_path)
    for i in range(10, 60):  # some rolls' worth, each refused: the last segment grows
        assert log.append([("t", "p1", i, bytes([i]) * 100)]) == i
    assert len(log.segments) == 1 and log.segments[0].size > 3 * 2_000
    assert log.sync() == 60  # nothing new to name in the directory: durable as ever
    assert log.failed is None
    assert caplog.text.count("cannot start the next segment (Too many open files)") == 1
    short[0] = False
    log.append([("t", "p1", 60, b"after")])  # rolls now
    assert len(log.segments) == 2 and "the next segment started" in caplog.text
    log.sync()
    log.close()
    again = TopicLog(tmp_path, segment_bytes=2_000)
    assert bodies(again) == [bytes([i % 256]) * 100 for i in range(60)] + [b"after"]
    again.close()


def test_a_sync_that_cannot_open_the_directory_is_refused_and_tried_again(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = TopicLog(tmp_path)  # new: its first sync fsyncs the segments' directory too
    fill(log, 5)
    short = out_of_files_while(monkeypatch, tmp_path / "segments")
    with pytest.raises(StoreError, match=r"not made durable now \(Too many open files\): "
                                         r"tried again at the next sync"):
        log.sync()
    assert log.failed is None and log.durable_offset == 0  # not refusing writes
    fill(log, 1)
    short[0] = False
    assert log.sync() == 6
    log.close()


def test_a_process_out_of_files_goes_on_storing_in_its_last_segment(
        tmp_path: pathlib.Path) -> None:
    """The same with the kernel's own refusal: a process that has used up its open-files
    limit appends past a roll, syncs, and rolls once a file is free again."""
    script = f"""
import os, resource
from mq import TopicLog
resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
log = TopicLog({str(tmp_path)!r}, segment_bytes=2_000, flush_in_thread=True)
for i in range(10):
    log.append([("t", "p1", i, b"x" * 100)])
log.sync()
spare = []
try:
    while True:
        spare.append(os.open("/dev/null", os.O_RDONLY))
except OSError as exc:
    assert exc.errno == 24
for i in range(10, 60):
    log.append([("t", "p1", i, b"x" * 100)])
assert len(log.segments) == 1 and log.sync() == 60
for fd in spare:
    os.close(fd)
log.append([("t", "p1", 60, b"after")])
assert len(log.segments) == 2 and log.sync() == 61
log.close()
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr[-2000:]
    assert "cannot start the next segment (Too many open files)" in done.stderr
    again = TopicLog(tmp_path, segment_bytes=2_000)
    assert bodies(again) == [b"x" * 100] * 60 + [b"after"]
    again.close()


def test_a_seal_out_of_files_makes_nothing_durable_and_the_next_sync_does(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """The flush thread seals a segment while the index and the directory cannot be
    opened: no record is said durable for it, and the log does not refuse writes."""
    log = TopicLog(tmp_path, segment_bytes=2_000, flush_in_thread=True)
    fill(log, 1)
    log.sync()
    real, short = os.open, [True]
    segments = str(tmp_path / "segments")

    def refused(path: str | os.PathLike[str], *args: object, **kwargs: object) -> int:
        name = str(path)
        if short[0] and (name == segments or name.endswith(".tmp")):
            raise OSError(errno.EMFILE, "Too many open files")
        return real(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", refused)
    while len(log.segments) == 1:  # until a segment is sealed, its flush out of files
        fill(log, 1)
    with pytest.raises(StoreError, match="not made durable now"):
        log.sync()
    assert log.failed is None and log.durable_offset == 1
    assert "its index not written (Too many open files)" in caplog.text
    fill(log, 1)  # writes go on
    short[0] = False
    assert log.sync() == log.next_offset  # the directory fsynced now
    log.close()
    again = TopicLog(tmp_path, segment_bytes=2_000)  # the sealed one read whole
    assert len(bodies(again)) == again.next_offset and again.corruptions == []
    again.close()
