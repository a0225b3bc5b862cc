"""Files written durably, and fsyncs that may run in another thread.

``write_file`` replaces a small file atomically and durably (the topics' ``meta.json``,
the groups' positions); ``write_chunks`` writes a segment's records as the kernel
gathers them; a :class:`SyncPoint` is what an fsync must cover, taken on the pump
and run anywhere (:mod:`mq.topics._commit` runs it in its fsync thread).
"""

from __future__ import annotations

import errno
import fcntl
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from channels import SMALL_PIECE, coalesce

from ._record import StoreError, crc32

__all__ = ["IOV_MAX", "OUT_OF_FILES", "VIEW_BODY", "Flush", "SyncPoint", "fsync_dir",
           "lock_directory", "lock_holder", "out_of_files", "run_sync", "write_all",
           "write_chunks", "write_file"]

#: Bodies this large are written and kept as views of their produce request, not copied.
VIEW_BODY = SMALL_PIECE


#: What opening a file fails with when the process or the system is out of files.
OUT_OF_FILES = frozenset({errno.EMFILE, errno.ENFILE})


def out_of_files(error: OSError) -> bool:
    """A file could not be opened for want of descriptors (an fsync never fails so): what
    was to be done with it was not done, and nothing was lost; it may work later."""
    return error.errno in OUT_OF_FILES


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def lock_directory(path: Path) -> int:
    """An exclusive lock on the directory ``path``, held while the returned descriptor
    is open: the kernel drops it when the process ends, however it ends (SIGKILL
    included), so it is never stale.  :class:`StoreError` when another open of it holds
    the lock, in another process or in this one: two servers writing one topic's
    segments, or one recovering a tail the other is appending to, would lose
    acknowledged messages."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(os.fstat(fd))
        os.close(fd)
        raise StoreError(f"{path}: in use by another MQ server{holder}; one directory "
                         f"serves one server at a time") from None
    except BaseException:
        os.close(fd)
        raise
    return fd


def lock_holder(st: os.stat_result) -> int | None:
    """The pid of the process that holds a lock on the file or directory of ``st``, read
    from ``/proc/locks`` (Linux: nothing is locked to find out); None when none does or
    it cannot be told."""
    where = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open("/proc/locks") as locks:
            for line in locks:
                fields = line.split()
                # "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF"; blocked waiters have "->"
                if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == where:
                    return int(fields[4])
    except (OSError, ValueError):
        pass
    return None


def _holder(st: os.stat_result) -> str:
    pid = lock_holder(st)
    if pid is None:
        return ""
    return f" (pid {pid}{', this process' if pid == os.getpid() else ''})"


class Flush:
    """A sealed segment flushed in a thread of its own, its records fsynced and its index
    written (``work``), while the pump goes on appending to the next segment; ``error``
    once it is done, if it failed."""

    def __init__(self, work: Callable[[], object], name: str) -> None:
        self.error: OSError | None = None
        self._work = work
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._work()
        except OSError as exc:
            self.error = exc

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def wait(self) -> None:
        """Until it is done (any thread); OSError if it failed."""
        self._thread.join()
        if self.error is not None:
            raise self.error


@dataclass(frozen=True)
class SyncPoint:
    """An fsync to do: the last segment's file, the directory if it changed, the offset
    everything below which is durable once it is done, and the flush of the segment
    before the last if one is still under way (it covers records below ``target`` too)."""

    fd: int
    directory: Path | None
    target: int
    flush: Flush | None = None


def run_sync(point: SyncPoint) -> None:
    """Do the fsync of a :class:`SyncPoint` (any thread); OSError if it fails."""
    if point.flush is not None:
        point.flush.wait()
    os.fsync(point.fd)
    if point.directory is not None:
        fsync_dir(point.directory)


def write_all(fd: int, data: bytes | memoryview, at: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, at)
        view = view[n:]
        at += n


def write_chunks(fd: int, chunks: Sequence[bytes | memoryview], at: int, crc: int) -> int:
    """Write ``chunks`` back to back at ``at``: large pieces gathered by the kernel as they
    are (not copied here), runs of small ones joined first (a piece costs the kernel more
    than its copy); the CRC-32 ``crc`` carried on over what was written."""
    pieces = coalesce(chunks, VIEW_BODY)
    for start in range(0, len(pieces), IOV_MAX):
        part = pieces[start:start + IOV_MAX]
        n = os.pwritev(fd, part, at)
        size = sum(map(len, part))
        if n < size:  # a short write (a full disk, say): the rest one piece at a time
            write_all(fd, b"".join(part)[n:], at + n)
        at += size
    for piece in pieces:
        crc = crc32(piece, crc)
    return crc


#: Pieces one pwritev takes (the kernel's UIO_MAXIOV).
IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024


def write_file(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically and durably (write, fsync, rename, fsync dir)."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_all(fd, data, 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)
