"""The group commit's fsync threads (:mod:`mq.topics._syncers`): the C one reports
each topic's fsync and its errors, runs while the pump's thread holds the GIL, and
stops cleanly with a job under way."""

from __future__ import annotations

import errno
import os
import pathlib

import trio

from mq.storage._files import SyncPoint
from mq.topics._syncers import NativeSyncer


def point(fd: int, directory: pathlib.Path | None = None) -> SyncPoint:
    return SyncPoint(fd=fd, directory=directory, target=0)


async def test_each_topics_fsync_and_its_error(tmp_path: pathlib.Path) -> None:
    fd = os.open(tmp_path / "segment", os.O_WRONLY | os.O_CREAT)
    read_end, write_end = os.pipe()  # fsync of a pipe: EINVAL
    syncer = NativeSyncer()
    try:
        done: list[dict[str, OSError]] = []
        reported = trio.Event()
        syncer.submit({"a": point(fd, tmp_path), "b": point(write_end),
                       "c": point(fd, tmp_path / "gone")},
                      lambda errors: (done.append(errors), reported.set()))
        with trio.fail_after(10):
            await reported.wait()
        [errors] = done
        assert set(errors) == {"b", "c"}  # a: its file and its directory were fsynced
        assert errors["b"].errno == errno.EINVAL
        assert errors["c"].errno == errno.ENOENT  # its directory could not be opened
        # another job after it
        again = trio.Event()
        syncer.submit({"a": point(fd)}, lambda errors: again.set() if not errors else None)
        with trio.fail_after(10):
            await again.wait()
    finally:
        syncer.stop()
        for f in (fd, read_end, write_end):
            os.close(f)


async def test_the_fsync_runs_while_the_pumps_thread_holds_the_gil(
        tmp_path: pathlib.Path) -> None:
    """A Python thread could not even wake up to start it: the pump's thread is in one
    long C call that keeps the GIL (as its ring's calls do).  The C thread has done it
    by the end of that call, and the group commit's poll reports it at once."""
    fd = os.open(tmp_path / "segment", os.O_WRONLY | os.O_CREAT)
    syncer = NativeSyncer()
    try:
        done: list[dict[str, OSError]] = []
        syncer.submit({"a": point(fd)}, done.append)
        sum(range(20_000_000))  # a C loop: the GIL is never let go
        syncer.poll()
        assert done == [{}]
    finally:
        syncer.stop()
        os.close(fd)


async def test_stopped_with_a_job_under_way_reports_nothing(tmp_path: pathlib.Path) -> None:
    fd = os.open(tmp_path / "segment", os.O_WRONLY | os.O_CREAT)
    try:
        syncer = NativeSyncer()
        done: list[dict[str, OSError]] = []
        syncer.submit({"a": point(fd)}, done.append)
        syncer.stop()
        syncer.stop()  # again: nothing
        syncer.poll()
        await trio.lowlevel.checkpoint()  # its trio task ends, without an error
        assert done == []
    finally:
        os.close(fd)


class _Log:
    """A topic's log as the group commit sees it (:class:`~mq.topics._topic.Log`), whose
    fsync point is ``fd``; what ``finish_sync`` was told is kept."""

    persistent = True
    durable_offset = 0
    next_offset = 1

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.told: list[OSError | None] = []

    def prepare_sync(self) -> SyncPoint:
        return SyncPoint(fd=self.fd, directory=None, target=self.next_offset)

    def finish_sync(self, at: SyncPoint, error: OSError | None) -> int:
        from mq.storage._record import StoreError

        self.told.append(error)
        if error is not None:
            raise StoreError(f"fsync failed: {error.strerror}")
        self.durable_offset = at.target
        return at.target


async def test_a_group_commit_through_the_c_thread_fails_only_the_topic_whose_fsync_failed(
        tmp_path: pathlib.Path) -> None:
    """Two topics share a commit under ``sync``: the one whose fsync fails is failed with
    the reason and what waited for it is dropped; the other is durable and what waited
    for it runs."""
    from mq.topics._commit import Durability, GroupCommit
    from pump import Pump

    fd = os.open(tmp_path / "segment", os.O_WRONLY | os.O_CREAT)
    read_end, write_end = os.pipe()
    good, bad = _Log(fd), _Log(write_end)
    failed: list[tuple[str, str]] = []
    committed: list[str] = []
    ran: list[str] = []
    settled = trio.Event()
    pump = Pump(name="commit")
    async with trio.open_nursery() as nursery:
        await nursery.start(pump.serve)
        commit = GroupCommit(pump, Durability.parse("sync"), owner=None,
                             release=lambda reply: None,
                             failed=lambda name, why: failed.append((name, why)),
                             committed=lambda names: (committed.extend(names),
                                                      settled.set()))
        commit.add("good", good)  # type: ignore[arg-type]
        commit.add("bad", bad)  # type: ignore[arg-type]
        commit.after("good", good, lambda: ran.append("good"))  # type: ignore[arg-type]
        commit.after("bad", bad, lambda: ran.append("bad"))  # type: ignore[arg-type]
        with trio.fail_after(10):
            await settled.wait()
        commit.close()
        nursery.cancel_scope.cancel()
    for f in (fd, read_end, write_end):
        os.close(f)
    assert good.told == [None] and good.durable_offset == 1
    assert [e.errno for e in bad.told if e is not None] == [errno.EINVAL]
    assert failed == [("bad", "fsync failed: Invalid argument")]
    assert committed == ["good"] and ran == ["good"]


async def test_what_was_written_during_a_commit_starts_its_fsync_before_that_commit_answers(
        tmp_path: pathlib.Path) -> None:
    """A write made while a commit's fsync runs is fsynced by the next commit, whose fsync
    is handed to the thread as soon as the first is done, before the first one's replies
    and deliveries go out: the thread is never left idle while they are made."""
    from mq.topics._commit import Durability, GroupCommit
    from pump import Pump

    fd = os.open(tmp_path / "segment", os.O_WRONLY | os.O_CREAT)
    events: list[str] = []

    class Log(_Log):
        def prepare_sync(self) -> SyncPoint:
            events.append(f"fsync up to {self.next_offset}")
            return super().prepare_sync()

    log = Log(fd)
    both = trio.Event()
    pump = Pump(name="commit")
    async with trio.open_nursery() as nursery:
        await nursery.start(pump.serve)
        commit = GroupCommit(pump, Durability.parse("sync"), owner=None,
                             release=lambda reply: None, failed=lambda name, why: None,
                             committed=lambda names: None)
        commit.add("t", log)  # type: ignore[arg-type]

        def second() -> None:  # runs right after the first commit was handed its fsync
            log.next_offset = 2
            commit.after("t", log, lambda: (events.append("answered 2"),  # type: ignore[arg-type]
                                            both.set()))

        commit.after("t", log, lambda: events.append("answered 1"))  # type: ignore[arg-type]
        pump.post("a write during the fsync", second)
        with trio.fail_after(10):
            await both.wait()
        commit.close()
        nursery.cancel_scope.cancel()
    os.close(fd)
    assert events == ["fsync up to 1", "fsync up to 2", "answered 1", "answered 2"]
