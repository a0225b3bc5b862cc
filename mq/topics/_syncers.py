"""The threads a group commit's fsyncs run in (:mod:`._commit`), one commit at a time,
each reported back on the pump's trio loop.

:class:`NativeSyncer` is the one a server uses: a C thread (``native/syncer.c``) that
never takes the GIL.  It is handed the commit's descriptors, fsyncs them, and writes an
eventfd that a trio task of this process waits on; the group commit also asks it at
each write (:meth:`NativeSyncer.poll`).  A Python thread must first take the GIL to
wake up, and the pump holds it while it works: under a 64 KiB ``sync`` load that thread
started its fsync up to a millisecond after it was asked, often more than the fsync
took.

:class:`ThreadSyncer` is a Python thread: for a commit that must wait for a sealed
segment's flush (a Python thread of its own) before its fsync, and where the C thread
cannot start.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from queue import SimpleQueue
from typing import Any

import trio

from ..storage._files import SyncPoint, run_sync
from ..storage._syncer import ffi, lib

__all__ = ["Done", "NativeSyncer", "ThreadSyncer", "run_syncs"]

#: What a syncer calls on the pump's trio loop once a commit's fsyncs are done: the
#: errors by topic.
Done = Callable[[dict[str, OSError]], object]


def run_syncs(points: dict[str, SyncPoint]) -> dict[str, OSError]:
    """fsync each point (any thread); the errors by topic."""
    errors = {}
    for name, point in points.items():
        try:
            run_sync(point)
        except OSError as exc:
            errors[name] = exc
    return errors


class ThreadSyncer:
    """One Python thread that runs the commits' fsyncs (a thread started per commit cost
    more than many fsyncs of a small commit)."""

    def __init__(self, token: trio.lowlevel.TrioToken) -> None:
        self._token = token
        self._jobs: SimpleQueue[tuple[dict[str, SyncPoint], Done] | None] = SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="mq fsync", daemon=True)
        self._thread.start()

    def submit(self, points: dict[str, SyncPoint], done: Done) -> None:
        self._jobs.put((points, done))

    def stop(self) -> None:
        """No more commits: the thread ends after the one under way (not waited for)."""
        self._jobs.put(None)

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            points, done = job
            errors = run_syncs(points)
            try:
                self._token.run_sync_soon(done, errors)
            except trio.RunFinishedError:  # ending: nothing is acknowledged
                return


class NativeSyncer:
    """The C thread of the module's account.  Made on the trio loop (it starts a trio
    system task); :class:`OSError` if the thread cannot start.  A commit whose points
    wait for a flush is not for it (:meth:`takes`)."""

    def __init__(self) -> None:
        self._efd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        self._c: Any = lib.sy_start(self._efd)
        if self._c == ffi.NULL:
            code = ffi.errno
            os.close(self._efd)
            raise OSError(code, f"the fsync thread did not start: {os.strerror(code)}")
        #: the job under way: each descriptor's topic, the descriptors, and what to call
        #: when it is done
        self._job: tuple[list[str], list[int], Done] | None = None
        self._stopped = False
        self._errs: Any = ffi.new("int[]", lib.SY_MAX_FDS)
        self._scope = trio.CancelScope()
        trio.lowlevel.spawn_system_task(self._watch, name="mq fsync")

    @staticmethod
    def takes(points: dict[str, SyncPoint]) -> bool:
        """Whether this syncer can do the fsyncs of ``points``: none waits for a flush
        still under way, and their descriptors (a directory's too) fit one job."""
        return (2 * len(points) <= lib.SY_MAX_FDS
                and all(p.flush is None or p.flush.done for p in points.values()))

    def submit(self, points: dict[str, SyncPoint], done: Done) -> None:
        """Start the fsyncs of ``points`` (what :meth:`takes`; one commit at a time);
        ``done`` is called on the trio loop.  A flush that failed, or a directory that
        cannot be opened, is its topic's error at once, as the fsync's would be."""
        assert self._job is None, "one commit at a time"
        owners: list[str] = []
        fds: list[int] = []
        opened: list[int] = []
        failed: dict[str, OSError] = {}
        for name, point in points.items():
            if point.flush is not None and point.flush.error is not None:
                failed[name] = point.flush.error
                continue
            owners.append(name)
            fds.append(point.fd)
            if point.directory is not None:
                try:
                    fd = os.open(point.directory, os.O_RDONLY | os.O_CLOEXEC)
                except OSError as exc:
                    failed[name] = exc
                    owners.pop()
                    fds.pop()
                    continue
                opened.append(fd)
                owners.append(name)
                fds.append(fd)

        def finish(errors: dict[str, OSError]) -> object:
            for fd in opened:
                os.close(fd)
            return done({**failed, **errors})

        self._job = (owners, fds, finish)
        code = lib.sy_submit(self._c, fds, len(fds))
        assert code == 0, f"sy_submit: {code}"

    async def _watch(self) -> None:
        """The trio task of this syncer: each finished job's result to its ``done``;
        the C thread stopped and the eventfd closed when it ends."""
        try:
            with self._scope:
                while not self._stopped:  # (stopped before this task first ran, say)
                    try:
                        await trio.lowlevel.wait_readable(self._efd)
                    except trio.ClosedResourceError:
                        return  # stopped meanwhile
                    with contextlib.suppress(BlockingIOError):
                        os.eventfd_read(self._efd)
                    self.poll()
        finally:
            self._end()

    def poll(self) -> None:
        """If the job under way is finished, report it now.  Its eventfd wakes a trio
        task only when trio next looks for I/O, after every task that was ready has run
        (on a loaded server, more than half a millisecond after the fsync); the group
        commit also asks here whenever a write comes, which a loaded server has often."""
        job = self._job
        if job is None:
            return
        owners, _, finish = job
        if lib.sy_take(self._c, self._errs, len(owners)) < 0:
            return  # not finished
        self._job = None
        errors: dict[str, OSError] = {}
        for name, code in zip(owners, self._errs, strict=False):
            if code and name not in errors:
                errors[name] = OSError(code, os.strerror(code))
        finish(errors)

    def stop(self) -> None:
        """No more commits: the C thread ends after the one under way (not waited for)
        and nothing more is reported."""
        self._scope.cancel()
        if self._stopped:
            return
        with contextlib.suppress(RuntimeError):  # (trio's run already over)
            trio.lowlevel.notify_closing(self._efd)
        self._end()

    def _end(self) -> None:
        if not self._stopped:
            self._stopped = True
            self._job = None
            lib.sy_stop(self._c)  # under its lock: it never writes the eventfd after
            os.close(self._efd)

