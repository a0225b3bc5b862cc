"""Consume groups' positions on disk: one small file per group, overwritten in place.

``<dir>/groups/<the group's file-name form, mq.storage._names.disk_name>.cursor``: two
slots, the second 512 bytes after the first (544 bytes in all, each slot in a disk
sector of its own).  A slot: magic b"RDVPQCUR" (8) | version u32 (2) | offset u64 |
serial u64 | crc u32 (CRC-32 of what precedes it in the slot).  A cursor is the group's
*ack floor*: every offset below it is acknowledged; the slot that checks out with the
higher serial holds it.

A save writes the next serial into the slot that does not hold the newest, then
fdatasyncs: the other slot is not touched, so a crash leaves the old cursor or the new
one, never a mix, and no file is created, renamed or unlinked.  A file that is missing,
damaged in both slots or of version 1 (24 bytes: magic | version 1 | offset | crc) is
replaced whole, as a new one is made: written to a temporary file, fsynced, renamed over
the old one, and the directory fsynced.  Version 1 files are read as they are.

A server's tick saves the positions that moved through a :class:`CursorSaver`, in a
thread of its own: each save costs an fsync, and a server whose thousand groups all
moved in a second stopped its pump that long each second.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
from collections.abc import Callable, Hashable, Iterable
from pathlib import Path
from queue import SimpleQueue

from ._files import write_all, write_file
from ._names import disk_name
from ._record import FormatError, crc32

log = logging.getLogger("rdvpump.mq")

CURSOR = struct.Struct("<8sIQI")  # version 1, read only
CURSOR_MAGIC = b"RDVPQCUR"
SLOT = struct.Struct("<8sIQQI")
#: where the second slot starts: each slot in a 512-byte sector of its own
SLOT_GAP = 512
CURSOR_BYTES = SLOT_GAP + SLOT.size


class CursorStore:
    """Every group's ack floor for one topic (``saver``: the server's, through which
    saves and removals go, in order with those it writes in its thread)."""

    def __init__(self, directory: str | os.PathLike[str],
                 saver: CursorSaver | None = None) -> None:
        self.directory = Path(directory) / "groups"
        self.directory.mkdir(parents=True, exist_ok=True)
        self.saver = saver
        self._paths: dict[str, Path] = {}

    def _path(self, group: str) -> Path:
        path = self._paths.get(group)
        if path is None:
            path = self._paths[group] = self.path_in(self.directory.parent, group)
        return path

    def path(self, group: str) -> Path:
        """Where the cursor of ``group`` is."""
        return self._path(group)

    @staticmethod
    def path_in(topic_dir: Path, group: str) -> Path:
        """Where a topic's cursor of ``group`` is."""
        return topic_dir / "groups" / f"{disk_name(group)}.cursor"

    def load(self, groups: Iterable[str]) -> dict[str, int]:
        """The cursors of ``groups`` (the topic's, as its ``meta.json`` lists them); a
        missing or damaged file is reported and left out (that group starts again by its
        start rule)."""
        cursors = {}
        for group in groups:
            path = self._path(group)
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                continue
            try:
                cursors[group] = decode_cursor(data, str(path))
            except FormatError as exc:
                log.error("%s; the group starts again by its start rule", exc)
        return cursors

    def save(self, group: str, offset: int) -> None:
        """Save the group's floor now (the caller waits for the fsync)."""
        if self.saver is not None:
            self.saver.write_now(self._path(group), offset)
        else:
            save_cursor(self._path(group), offset)

    def remove(self, group: str) -> None:
        path = self._path(group)
        del self._paths[group]
        if self.saver is not None:
            self.saver.remove_now(path)
        else:
            path.unlink(missing_ok=True)


Writes = list[tuple[Hashable, Path, int]]


class CursorSaver:
    """Cursor files written in a thread of their own.  :meth:`submit` queues writes and
    returns; ``done(errors)`` then runs through ``post`` (which runs a function on the
    server's pump, from any thread) with the failed writes' errors by their keys.

    Each queued write is numbered per file; the thread writes a file only while its
    write is the newest asked for it, and a save or removal made at once on the pump
    (:meth:`write_now`, :meth:`remove_now`) drops the queued ones and waits for the
    thread's write of that file, if one is under way: an older position never replaces
    a newer one, nor brings back a removed group's file.  The pump never waits for the
    thread otherwise.  ``start`` False: no thread (:meth:`run_one` runs the queue's next
    job)."""

    def __init__(self, post: Callable[[Callable[[], None]], object], *,
                 start: bool = True) -> None:
        self._post = post
        self._lock = threading.Lock()
        self._written = threading.Condition(self._lock)
        #: each file's newest write (asked for, not done yet), by its number
        self._newest: dict[Path, int] = {}
        #: the file the thread writes now (without the lock)
        self._writing: Path | None = None
        self._count = 0
        self._jobs: SimpleQueue[tuple[list[tuple[Hashable, Path, int, int]],
                                      Callable[[dict[Hashable, OSError]], None]] | None
                                ] = SimpleQueue()
        #: the thread, started at the first job (a server that saves nothing has none)
        self._thread: threading.Thread | None = None
        self._start = start

    def _number(self, path: Path) -> int:
        self._count += 1
        self._newest[path] = self._count
        return self._count

    def submit(self, writes: Writes,
               done: Callable[[dict[Hashable, OSError]], None]) -> None:
        """Save each ``(key, path, offset)`` in the thread, then ``done(errors)``."""
        with self._lock:
            job = [(key, path, offset, self._number(path)) for key, path, offset in writes]
        self._jobs.put((job, done))
        if self._thread is None and self._start:
            self._thread = threading.Thread(target=self._run, name="mq cursors",
                                            daemon=True)
            self._thread.start()

    def write_now(self, path: Path, offset: int) -> None:
        """Save ``offset`` to ``path`` on the caller's thread (a write queued before it is
        dropped)."""
        with self._lock:
            self._newest.pop(path, None)
            self._written.wait_for(lambda: self._writing != path)
            save_cursor(path, offset)

    def remove_now(self, path: Path) -> None:
        with self._lock:
            self._newest.pop(path, None)
            self._written.wait_for(lambda: self._writing != path)
            path.unlink(missing_ok=True)

    def run_one(self) -> bool:
        """Write the next job's files (waiting for one); False once closed."""
        job = self._jobs.get()
        if job is None:
            return False
        writes, done = job
        errors: dict[Hashable, OSError] = {}
        for key, path, offset, number in writes:
            with self._lock:
                if self._newest.get(path) != number:
                    continue  # a newer write came: this one is not made
                del self._newest[path]
                self._writing = path
            try:
                save_cursor(path, offset)
            except OSError as exc:
                errors[key] = exc
            finally:
                with self._lock:
                    self._writing = None
                    self._written.notify_all()
        self._post(lambda: done(errors))
        return True

    def _run(self) -> None:
        while self.run_one():
            pass

    def close(self) -> None:
        """The writes asked for are made (waited for), and the thread ends."""
        self._jobs.put(None)
        if self._thread is not None:
            self._thread.join()
        else:
            while self.run_one():
                pass


def _slot(offset: int, serial: int) -> bytes:
    head = struct.pack("<8sIQQ", CURSOR_MAGIC, 2, offset, serial)
    return head + struct.pack("<I", crc32(head))


def encode_cursor(offset: int) -> bytes:
    """A new cursor file of ``offset``: both slots hold it (serials 0 and 1)."""
    return _slot(offset, 0).ljust(SLOT_GAP, b"\0") + _slot(offset, 1)


def save_cursor(path: Path, offset: int) -> None:
    """Save ``offset`` to the cursor file ``path``: in place, into the slot that does not
    hold the newest, then fdatasync; a file that is missing, of version 1 or damaged in
    both slots is replaced whole (:func:`~._files.write_file`)."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        write_file(path, encode_cursor(offset))
        return
    try:
        data = os.pread(fd, CURSOR_BYTES + 1, 0)
        _, serial, at = _newest(data) if len(data) == CURSOR_BYTES else (None, None, 0)
        if serial is not None:
            write_all(fd, _slot(offset, serial + 1), SLOT_GAP - at)  # the other slot
            os.fdatasync(fd)
    finally:
        os.close(fd)
    if serial is None:
        write_file(path, encode_cursor(offset))


def _read_slot(data: bytes, at: int) -> tuple[int, int] | None:
    """The offset and serial of the slot at ``at`` of ``data``, if it checks out."""
    slot = data[at:at + SLOT.size]
    magic, version, offset, serial, crc = SLOT.unpack(slot)
    if magic == CURSOR_MAGIC and version == 2 and crc32(slot[:-4]) == crc:
        return offset, serial
    return None


def _newest(data: bytes) -> tuple[int, int, int] | tuple[None, None, int]:
    """The offset, serial and place of the slot of ``data`` (a version 2 file) that
    checks out with the higher serial; ``(None, None, 0)`` if neither does."""
    newest: tuple[int, int, int] | tuple[None, None, int] = (None, None, 0)
    for at in (0, SLOT_GAP):
        slot = _read_slot(data, at)
        if slot is not None and (newest[1] is None or slot[1] > newest[1]):
            newest = (slot[0], slot[1], at)
    return newest


def bad_slots(data: bytes) -> list[int]:
    """Where the slots of a version 2 cursor file's ``data`` that do not check out begin
    (a save that a crash cut short leaves one; the other holds the cursor)."""
    if len(data) != CURSOR_BYTES:
        return []
    return [at for at in (0, SLOT_GAP) if _read_slot(data, at) is None]


def decode_cursor(data: bytes, where: str) -> int:
    """The offset a cursor file's ``data`` holds; FormatError if it holds none."""
    if len(data) == CURSOR_BYTES:
        offset = _newest(data)[0]
        if offset is not None:
            return int(offset)
        slots = [data[at:at + SLOT.size] for at in (0, SLOT_GAP)]
        if all(slot[:8] != CURSOR_MAGIC for slot in slots):
            raise FormatError(f"{where}: not an rdvpump cursor")
        for slot in slots:  # whole, of a version this code does not know
            magic, version, _, _, crc = SLOT.unpack(slot)
            if magic == CURSOR_MAGIC and crc32(slot[:-4]) == crc:
                raise FormatError(f"{where}: cursor format version {version}; this "
                                  f"rdvpump reads 1 and 2")
        raise FormatError(f"{where}: cursor checksum mismatch in both slots")
    if len(data) != CURSOR.size:
        raise FormatError(f"{where}: {len(data)} bytes, not a cursor of {CURSOR_BYTES} "
                          f"(or {CURSOR.size}, version 1)")
    magic, version, offset, crc = CURSOR.unpack(data)
    if magic != CURSOR_MAGIC:
        raise FormatError(f"{where}: not an rdvpump cursor")
    if version != 1:
        raise FormatError(f"{where}: cursor format version {version}; this rdvpump reads "
                          f"1 and 2")
    if crc32(data[:-4]) != crc:
        raise FormatError(f"{where}: cursor checksum mismatch")
    return int(offset)
