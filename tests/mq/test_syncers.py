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
