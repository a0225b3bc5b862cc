"""A topic's durable log: append-only segments, sparse indexes, recovery after a crash.

``<dir>/segments/<20-digit base offset>.seg`` hold the records
(:mod:`._record`); a sealed segment (not the last) also has a ``.idx``: its
sparse index (one entry every :data:`INDEX_INTERVAL` bytes: offset, file
position, timestamp) and a checksummed footer, so a restart reads only the
last segment whole.  Offsets count messages from 0 and never repeat.

Durability is the caller's policy: :meth:`TopicLog.append` hands the bytes to
the OS in one ``write``; :meth:`TopicLog.sync` makes everything appended so
far durable (one ``fsync`` for however many appends: group commit) and says
up to which offset.  A full segment is sealed (fsynced, its index written) before
the next append, or in a thread while appends go on to the next segment
(``flush_in_thread``; the next sync waits for it).  A failed write is cut back, so
nothing half-written stays, and raises :class:`StoreError`; a failed ``fsync`` is not retried
("fsyncgate": the kernel may have dropped the pages) -- the log refuses every
later write until it is opened again, and recovery reads what really is on
disk.  A file that cannot be opened for want of descriptors is no failed fsync (nothing
was done, nothing lost): the next segment is tried again at the next write, the last one
growing meanwhile, and the directory's fsync at the next sync (whose replies wait).

Opening recovers and verifies: a record torn by a crash at the tail of the
last segment is cut (the bytes cut are logged); a sealed segment is taken on
its index only if the checksum of the whole segment, kept in the index, still
matches, and is read whole (and fsynced: a killed process may have been sealing
it) otherwise; a corrupt record anywhere is reported
with its file, byte position and the offsets it hides (:class:`Corruption`),
and reading goes on after it.  Damage that appears while the log is open is
found when it is read, reported the same way and skipped.

Opening the segment files, sealing them and recovery are in :mod:`._segment`; the index's
format and the reading of a segment's bytes (each record checked, damage skipped) in
:mod:`._scan`; the newest records kept in memory in :mod:`._tail`; durable file writes
and fsyncs in :mod:`._files`.  :class:`TopicLog` stays one class in one module, although
long: it is the hot path of every publish and every read (``append``, ``read``), and
each of its writes (an append, a replica's copies, a cut) changes the segment list, the
tail, the epochs and the sync state together, which read straight through here.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
import time
from collections.abc import Callable, Sequence
from itertools import accumulate
from pathlib import Path
from typing import Any

from pump import ConfigError

from ._copies import encode_produced, scan_copies
from ._epochs import EPOCHS, Epochs
from ._files import (
    Flush,
    SyncPoint,
    fsync_dir,
    out_of_files,
    run_sync,
    write_all,
    write_chunks,
    write_file,
)
from ._record import (
    DEFAULT_MAX_BODY,
    RECORD_OVERHEAD,
    SEGMENT_HEADER,
    BadRecord,
    Entry,
    FormatError,
    Produced,
    Record,
    StoreError,
    decode,
    encode_batch,
)
from ._scan import (
    INDEX_INTERVAL,
    Corruption,
    offset_at,
    resync,
    scan_segment,
)
from ._segment import SealedFiles, Segment, create_segment, open_segments, rescan, seal
from ._tail import Kept, ReadBack, Tail
from ._written import Written

log = logging.getLogger("rdvpump.mq")

#: A segment is sealed and a new one started past this size.
DEFAULT_SEGMENT_BYTES = 64 << 20
#: Bytes of bodies of the newest records kept in memory, so consumers that keep up are
#: served without reading the file back (and checking each record again).
DEFAULT_TAIL_BYTES = 8 << 20
#: Bytes of bodies of the records read back from the files last, kept for the readers
#: behind that read the same stretch next (:class:`~._tail.ReadBack`).
READ_BACK_BYTES = 4 << 20


class TopicLog:
    """One topic's records on disk.

    ``segment_bytes`` bounds a segment; ``max_body`` the body of one record.
    ``clock()`` gives the time in seconds for timestamps (which never go
    backwards within a log).  ``flush_in_thread``: a sealed segment is fsynced and
    indexed in a thread while appends go on to the next one (else on the caller's
    thread, before the next append: deterministic, but the caller waits for the disk).
    ``kept``: the budget its tail and read-back share with other logs (a server's; one
    of its own unless given, :data:`~._tail.KEPT_BYTES`).
    """

    def __init__(self, directory: str | os.PathLike[str], *,
                 segment_bytes: int = DEFAULT_SEGMENT_BYTES, max_body: int = DEFAULT_MAX_BODY,
                 clock: Callable[[], float] = time.time,
                 tail_bytes: int = DEFAULT_TAIL_BYTES, flush_in_thread: bool = False,
                 kept: Kept | None = None) -> None:
        if segment_bytes < SEGMENT_HEADER.size + RECORD_OVERHEAD:
            raise ConfigError(f"segment_bytes must be at least "
                             f"{SEGMENT_HEADER.size + RECORD_OVERHEAD}, got {segment_bytes}")
        self.directory = Path(directory)
        self.segment_bytes = segment_bytes
        self.max_record = RECORD_OVERHEAD + 2 * 255 + max_body
        self.max_body = max_body
        self.clock = clock
        self.segments: list[Segment] = []
        #: The newest records, as appended, for readers that keep up.
        if kept is None:
            kept = Kept()
        self.tail = Tail(tail_bytes, kept)
        #: What the last reads of the files gave, for the next readers of that stretch.
        self.read_back = ReadBack(READ_BACK_BYTES if tail_bytes > 0 else 0, kept)
        #: The newest appends as written, for a master's copies frames (made once a
        #: replica follows: a topic costs nothing more until then).
        self.written: Written | None = None
        #: Corrupt stretches found when opening, in order, then any found when reading.
        self.corruptions: list[Corruption] = []
        #: Bytes cut from the tail when opening (a record torn by a crash).
        self.cut_bytes = 0
        #: Why the log refuses writes (a failed fsync), or None.
        self.failed: str | None = None
        self.flush_in_thread = flush_in_thread
        #: The flush of the segment sealed last, while it may be under way, and the
        #: offset below which it makes every record durable.
        self._flush: Flush | None = None
        self._flush_upto = 0
        #: The segment that flush seals (its file open until the flush is done), and
        #: the sealed segment open to be read.
        self._sealing: Segment | None = None
        self._sealed = SealedFiles()
        #: A roll failed (out of files, say) and has not worked since.
        self._roll_refused = False
        self._durable = 0
        self._dir_dirty = False
        self._segdir = self.directory / "segments"
        try:
            self._segdir.mkdir(parents=True, exist_ok=True)
            self._open()
            #: The master epochs its records were written under (:mod:`._epochs`).
            self.epochs = Epochs.read(self.directory)
        except FormatError:
            self.close()
            raise
        except OSError as exc:  # the segments opened are closed: a refusal leaks nothing
            self.close()
            raise StoreError(f"{self.directory}: cannot open the queue: "
                             f"{exc.strerror or exc}") from exc
        self._durable = self.next_offset

    # -- state -------------------------------------------------------------------------

    #: On disk: what is fsynced survives a crash.
    persistent = True

    @property
    def start_offset(self) -> int:
        """The oldest offset still held."""
        return self.segments[0].base

    @property
    def next_offset(self) -> int:
        """The offset the next record gets."""
        return self.segments[-1].next_offset

    @property
    def durable_offset(self) -> int:
        """Every record below this offset has been fsynced (by :meth:`sync`, a roll, or an
        earlier run)."""
        flush = self._flush
        if flush is not None and flush.done and flush.error is None:
            self._take_flush()
        return self._durable

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self.segments)

    # -- opening -----------------------------------------------------------------------

    def _open(self) -> None:
        opened = open_segments(self._segdir, self.max_record, int(self.clock() * 1000))
        self.segments = opened.segments
        self.corruptions.extend(opened.corruptions)
        self.cut_bytes = opened.cut_bytes
        self._dir_dirty = True  # a new directory or segment: the first sync covers it

    def _create(self, base: int, *, sync: bool = True) -> Segment:
        segment = create_segment(self._segdir, base, int(self.clock() * 1000),
                                 self.segments[-1].max_ts, sync=sync)
        self._dir_dirty = True
        return segment

    # -- writing -----------------------------------------------------------------------

    def append(self, messages: Sequence[Entry] | Produced, *, keep: bool = True) -> int:
        """Store ``(tag, producer id, sequence, body)`` messages in order, or a
        :class:`~._record.Produced` of them; the offset of the first.  The bytes reach the OS
        in one write (gathered, or a run's encoded in C); call :meth:`sync` for disk.
        ``keep``: kept in memory for readers too (the tail); without, what it held goes
        (reads then take the file): a topic no consumer reads now.  :class:`StoreError`
        (nothing stored) if the write fails or the log has failed."""
        self._check_writable()
        if not messages:
            return self.next_offset
        segment = self.segments[-1]
        now = max(int(self.clock() * 1000), segment.max_ts)
        first, start = segment.next_offset, segment.size
        chunks: list[bytes | memoryview] | Any
        if isinstance(messages, Produced):
            chunks, ends, crc = encode_produced(messages, first, now, segment.crc, self.max_body)
            try:
                write_all(segment.fd, chunks, start)
            except OSError as exc:
                self._undo(segment, exc)
        else:
            chunks, lengths = encode_batch(first, now, messages, self.max_body)
            try:
                crc = write_chunks(segment.fd, chunks, start, segment.crc)
            except OSError as exc:
                self._undo(segment, exc)
            ends = list(accumulate(lengths))
        self._index_run(segment, first, start, ends, [now] * len(ends))
        segment.size = start + ends[-1]
        segment.crc = crc
        segment.next_offset = first + len(ends)
        segment.max_ts = now
        written = self.written
        if written is not None and written.wanted:
            written.keep(first, chunks, ends)
        if keep and self.tail.limit > 0:
            self.tail.keep(first, now, messages)
        else:  # no reader here: nothing is kept for one
            if self.tail.records:
                self.tail.clear()
            if self.read_back.runs:
                self.read_back.clear()
        if segment.size >= self.segment_bytes:
            self._roll_written()
        return first

    def append_copies(self, data: bytes | memoryview, *, keep: bool = True) -> int:
        """Store records another log wrote, as they are (a replica of its master's):
        ``data`` is whole records back to back in this format (:mod:`._record`), the
        first at :attr:`next_offset`, each offset one more than the one before and no
        timestamp lower than the one before.  Every record's checksum is checked before
        anything is written; the count of records stored.  :class:`StoreError` (nothing
        stored) naming the first record that is damaged, cut short or out of line, or if
        the write fails.  ``keep``: the records are kept in memory for readers too (the
        tail); without, what it held goes (reads then take the file), and no record is
        made of the bytes: a replica no consumer reads."""
        self._check_writable()
        segment = self.segments[-1]
        if not keep:  # no reader here: nothing is kept for one
            if self.tail.records:
                self.tail.clear()
            if self.read_back.runs:
                self.read_back.clear()
        keep = keep and self.tail.limit > 0
        found = scan_copies(data, max_record=self.max_record, max_body=self.max_body,
                            expected=segment.next_offset, min_ts=segment.max_ts,
                            records=keep)
        if found.fault is not None:  # checked in order: the first fault is named
            raise StoreError(f"{self._copied_at(found.fault_at, len(data))}: {found.fault}; "
                             f"nothing stored")
        ends = found.ends
        if not ends:
            return 0
        self._forget_written()  # its records no longer follow the appends it holds
        try:
            crc = write_chunks(segment.fd, [data], segment.size, segment.crc)
        except OSError as exc:
            self._undo(segment, exc)
        first, start = segment.next_offset, segment.size
        self._index_run(segment, first, start, ends, found.timestamps)
        segment.size = start + len(data)
        segment.crc = crc
        segment.next_offset = first + len(ends)
        segment.max_ts = found.timestamps[-1]
        if keep:
            assert found.records is not None
            self.tail.keep_records(found.records)
        if segment.size >= self.segment_bytes:
            self._roll_written()
        return len(ends)

    @staticmethod
    def _index_run(segment: Segment, first: int, start: int, ends: Sequence[int],
                   timestamps: Sequence[int]) -> None:
        """The sparse index's entries for records written at ``start`` (the first at
        offset ``first``, each ending ``ends[i]`` bytes after ``start``): one at the first
        record that starts :data:`INDEX_INTERVAL` bytes or more after the last entry,
        found by bisection (small records are many to an entry)."""
        add, base, last = segment.index.append, segment.base, segment.last_indexed
        need = last + INDEX_INTERVAL - start  # where the next entry's record starts, at least
        if need <= 0:
            add((first - base, start, timestamps[0]))
            last, need = start, INDEX_INTERVAL
        j, count = 0, len(ends)
        while (j := bisect.bisect_left(ends, need, j)) + 1 < count:
            before = ends[j]  # record j + 1 starts there
            add((first + j + 1 - base, start + before, timestamps[j + 1]))
            last, need, j = start + before, before + INDEX_INTERVAL, j + 1
        segment.last_indexed = last

    def _copied_at(self, pos: int, size: int) -> str:
        return f"{self.directory}: a copied record at byte {pos} of {size}"

    def begin_epoch(self, epoch: int) -> None:
        """This log's records are written under master epoch ``epoch`` from its next
        offset on (kept on disk before it returns)."""
        if self.epochs.begin(epoch, self.next_offset):
            write_file(self.directory / EPOCHS, self.epochs.encode())

    def adopt_epochs(self, epochs: Epochs) -> None:
        """The master's epochs (this replica's records are its master's)."""
        if epochs.entries != self.epochs.entries:
            self.epochs = epochs
            write_file(self.directory / EPOCHS, epochs.encode())

    def truncate(self, offset: int) -> int:
        """Cut every record from ``offset`` on (a replica's tail that its master's history
        replaced): later segments are deleted, the one holding ``offset`` is cut there and
        is the last again, the epochs that began past it go; durable when it returns.  The
        count of records cut; :class:`StoreError` (nothing cut) below the oldest held."""
        if offset >= self.next_offset:
            return 0
        self._take_flush()
        if self.failed is not None or offset < self.start_offset:
            raise StoreError(f"{self.directory}: cannot cut from offset {offset}: " + (
                self.failed or f"the oldest record held is {self.start_offset}"))
        cut = self.next_offset - offset
        keep = next(i for i in range(len(self.segments) - 1, -1, -1)
                    if i == 0 or self.segments[i].base < offset)
        segment = self.segments[keep]
        pos = self._position(segment, offset)
        buf = os.pread(self._sealed.fd(segment), segment.size - pos, pos)
        at = 0
        try:
            while (found := decode(buf, at, self.max_record)) is not None \
                    and found[0].offset < offset:
                at = found[1]
        except BadRecord as exc:
            raise StoreError(f"{segment.path}: cannot cut from offset {offset}: a damaged "
                             f"record before it ({exc})") from None
        if segment is not self.segments[-1]:
            self._sealed.writable(segment)  # the last again
        for gone in self.segments[keep + 1:]:
            self._sealed.close(gone)
            gone.path.unlink()
            gone.index_path.unlink(missing_ok=True)
        del self.segments[keep + 1:]
        segment.index_path.unlink(missing_ok=True)  # the last segment has none
        fsync_dir(self._segdir)
        os.ftruncate(segment.fd, pos + at)
        os.fsync(segment.fd)
        segment.size, segment.bad = pos + at, []
        rescan(segment, self.max_record)
        self.tail.clear()
        self.read_back.clear()  # (the records cut may be among what was read)
        self._forget_written()
        self._durable = self.next_offset
        self.epochs.cut(offset)
        write_file(self.directory / EPOCHS, self.epochs.encode())
        return cut

    def _undo(self, segment: Segment, exc: OSError) -> None:
        reason = exc.strerror or str(exc)
        try:
            os.ftruncate(segment.fd, segment.size)
        except OSError as again:
            self.failed = f"a write failed ({reason}) and could not be undone ({again.strerror})"
            raise StoreError(f"{self.directory}: {self.failed}") from exc
        raise StoreError(f"{segment.path}: write failed, nothing stored: {reason}") from exc

    def sync(self) -> int:
        """fsync what was appended; the durable offset.  A failure is final for this log
        (see the module)."""
        point = self.prepare_sync()
        try:
            run_sync(point)
        except OSError as exc:
            return self.finish_sync(point, exc)
        return self.finish_sync(point, None)

    def prepare_sync(self) -> SyncPoint:
        """What an fsync must cover now; :func:`run_sync` may then run in another thread
        while appends go on, and :meth:`finish_sync` (back here) records the outcome."""
        if self.failed is not None:
            raise StoreError(f"{self.directory}: refusing writes: {self.failed}")
        point = SyncPoint(self.segments[-1].fd, self._segdir if self._dir_dirty else None,
                          self.next_offset, self._flush)
        self._dir_dirty = False
        return point

    def finish_sync(self, point: SyncPoint, error: OSError | None) -> int:
        if error is not None:
            if out_of_files(error):  # the directory not opened: not fsynced, nothing lost
                self._dir_dirty = True
                flush = point.flush
                if flush is not None and flush is self._flush and flush.error is not None:
                    self._take_flush()  # it failed so too: nothing more to wait for
                raise StoreError(f"{self.directory}: not made durable now ("
                                 f"{error.strerror or error}): tried again at the next sync")
            raise self._fsync_failed(error) from error
        if point.flush is not None and point.flush is self._flush:
            self._flush = None  # done, and covered by the target
            self._sealed_now()
        self._durable = max(self._durable, point.target)
        return self._durable

    def _roll(self) -> None:
        """Seal the last segment (fsynced, its index written) and start a new one.

        With ``flush_in_thread`` the fsyncs (the sealed segment's, the new one's header)
        and the index are a :class:`Flush` of their own, which also fsyncs the
        directory.  A crash of the machine meanwhile may leave the sealed segment
        without its index (opening reads it whole and fsyncs it) or, like the last one,
        short of what was not yet on disk (opening reports the records lost and keeps
        the rest)."""
        segment = self.segments[-1]
        self._take_flush()  # the one before: done long ago, a whole segment ago
        if self.flush_in_thread:
            # the new segment's header is fsynced there too: an fsync here would wait on
            # the disk behind the sealed segment's
            new = self._create(segment.next_offset, sync=False)
            segdir = self._segdir

            def flush() -> None:
                os.fsync(segment.fd)
                os.fsync(new.fd)  # its header, before the directory names it
                if not seal(segment):  # the index, fsynced with the directory
                    fsync_dir(segdir)  # the directory all the same

            self._flush = Flush(flush, f"mq seal {segment.path.name}")
            self._flush_upto = segment.next_offset
            self._sealing = segment
            self.segments.append(new)
            return
        try:
            os.fsync(segment.fd)
        except OSError as exc:
            raise self._fsync_failed(exc, " (sealing a segment)") from exc
        self._durable = max(self._durable, segment.next_offset)
        self.segments.append(self._create(segment.next_offset))
        seal(segment)
        self._sealed.close(segment)
        self._sync_dir()

    def _roll_written(self) -> None:
        """Roll once a write has stored its records (they are stored whatever happens
        here): a next segment that cannot be made (out of files, say; nothing changed) is
        tried again at the next write, the last segment growing past its size
        meanwhile.  :class:`StoreError` if an fsync failed (the log refuses writes)."""
        try:
            self._roll()
        except StoreError:
            raise
        except OSError as exc:
            if not self._roll_refused:  # once, not at every write until it works
                log.warning("%s: cannot start the next segment (%s): the last one grows "
                            "until it can", self.directory, exc.strerror or exc)
            self._roll_refused = True
            return
        if self._roll_refused:
            self._roll_refused = False
            log.warning("%s: the next segment started", self.directory)

    def _sync_dir(self) -> None:
        """fsync the segments' directory on the pump (a roll's, with no flush thread);
        the directory stays to fsync if it cannot be opened (out of files: nothing was
        fsynced, nothing lost); :class:`StoreError` if its fsync failed."""
        try:
            fsync_dir(self._segdir)
        except OSError as exc:
            if out_of_files(exc):
                return
            raise self._fsync_failed(exc, " (the segments' directory)") from exc
        self._dir_dirty = False

    def _take_flush(self) -> None:
        """Wait for the flush of the segment sealed last, if one is under way, and take
        its outcome: its records are durable, or the log refuses writes from now on."""
        flush, self._flush = self._flush, None
        if flush is None:
            return
        try:
            flush.wait()
        except OSError as exc:
            if out_of_files(exc):  # the directory not fsynced: the next sync does it
                self._dir_dirty = True
                return
            raise self._fsync_failed(exc, " (sealing a segment)") from exc
        finally:
            self._sealed_now()
        self._durable = max(self._durable, self._flush_upto)

    def _sealed_now(self) -> None:
        """The flush of the segment sealed last is over: its file is closed (opened
        again when it is read)."""
        segment, self._sealing = self._sealing, None
        if segment is not None and not (self.segments and segment is self.segments[-1]):
            self._sealed.close(segment)

    def _fsync_failed(self, error: OSError, where: str = "") -> StoreError:
        """The log refuses writes from now on (never retried: see the module); logged,
        and the error to raise."""
        self.failed = f"fsync failed: {error.strerror or error}"
        log.error("%s: %s%s; the queue refuses writes until it is opened again",
                  self.directory, self.failed, where)
        return StoreError(f"{self.directory}: {self.failed}")

    def _check_writable(self) -> None:
        """:class:`StoreError` if the log has failed (a flush that failed included)."""
        flush = self._flush
        if self.failed is None and (flush is None or flush.error is None):
            return
        if self.failed is None:
            self._take_flush()  # raises if the flush failed, but for want of files
            if self.failed is None:
                return
        raise StoreError(f"{self.directory}: refusing writes: {self.failed}")

    # -- reading -----------------------------------------------------------------------

    def want_written(self) -> None:
        """Keep the next appends as written (:meth:`Written.want
        <._written.Written.want>`): a replica follows."""
        if self.written is None:
            self.written = Written()
        self.written.want()

    def written_since(self, offset: int, max_bytes: int, max_count: int
                      ) -> tuple[list[bytes | memoryview], int, int] | None:
        """:meth:`Written.since <._written.Written.since>` of its newest appends."""
        written = self.written
        return None if written is None else written.since(offset, max_bytes, max_count)

    def release_written(self, offset: int) -> None:
        """Every replica was sent the records below ``offset``: their appends as written
        are not kept for them (:meth:`Written.release <._written.Written.release>`)."""
        if self.written is not None:
            self.written.release(offset)

    def _forget_written(self) -> None:
        if self.written is not None:
            self.written.clear()

    def release(self, offset: int) -> None:
        """Every reader served from memory has read the records below ``offset``: they
        are no longer kept there (:meth:`Tail.release <._tail.Tail.release>`)."""
        self.tail.release(offset)
        self.read_back.release(offset)

    def read(self, offset: int, *, max_count: int = 256, max_bytes: int = 1 << 20
             ) -> list[Record]:
        """Records from ``offset`` on (from the oldest held if it is older), at most
        ``max_count`` and about ``max_bytes`` of bodies (at least one record); offsets lost
        to corruption are skipped."""
        offset = max(offset, self.start_offset)
        kept = self.tail.read(offset, max_count, max_bytes)
        if kept is not None:
            return kept
        again = self.read_back.read(offset, max_count, max_bytes)
        if again is not None:  # read from the files a moment ago: the rest from there
            kept, size = again
            if len(kept) >= max_count or size >= max_bytes:
                return kept
            return kept + self._read_files(kept[-1].offset + 1, max_count - len(kept),
                                           max_bytes - size)
        return self._read_files(offset, max_count, max_bytes)

    def _read_files(self, offset: int, max_count: int, max_bytes: int) -> list[Record]:
        out: list[Record] = []
        budget = [max_count, max_bytes]
        i = max(0, bisect.bisect_right([s.base for s in self.segments], offset) - 1)
        for segment in self.segments[i:]:
            if offset < segment.next_offset:
                self._read_segment(segment, offset, out, budget)
            if budget[0] <= 0 or budget[1] <= 0:
                break
        self.read_back.keep(out)
        return out

    def _read_segment(self, segment: Segment, offset: int, out: list[Record],
                      budget: list[int]) -> None:
        pos = self._position(segment, offset)
        want = 64 << 10
        while pos < segment.size and budget[0] > 0 and budget[1] > 0:
            skip = next((end for start, end in segment.bad if start <= pos < end), None)
            if skip is not None:
                pos = skip
                continue
            buf = os.pread(self._sealed.fd(segment), min(segment.size - pos, max(want, budget[1])),
                           pos)
            at = 0
            while at < len(buf) and budget[0] > 0 and budget[1] > 0:
                if len(buf) - at >= RECORD_OVERHEAD:
                    # the good records from here, checked in one C call; what stopped it
                    # (a record the buffer cuts, damage) is decode's below
                    first = offset_at(buf, at)
                    scanned = scan_copies(buf, start=at, max_record=self.max_record,
                                          max_body=self.max_record, expected=first,
                                          min_ts=0, records=True,
                                          limit=budget[0] + max(0, offset - first))
                    if scanned.records:
                        for record, end in zip(scanned.records, scanned.ends, strict=True):
                            if record.offset >= offset:
                                if budget[0] <= 0 or budget[1] <= 0:
                                    break
                                out.append(record)
                                budget[0] -= 1
                                budget[1] -= len(record.body)
                            at = end
                        continue
                try:
                    found = decode(buf, at, self.max_record)
                except BadRecord as exc:
                    if not any(start <= pos + at < end for start, end in segment.bad):
                        self._damaged(segment, pos + at, str(exc))
                    break
                if found is None:
                    break
                record, end = found
                if record.offset >= offset:
                    out.append(record)
                    budget[0] -= 1
                    budget[1] -= len(record.body)
                at = end
            if at == 0 and not any(start <= pos < end for start, end in segment.bad):
                if len(buf) >= segment.size - pos:
                    self._damaged(segment, pos, "a record runs past the end of the segment")
                    continue
                want = len(buf) * 2  # one record larger than what was read
            pos += at

    def _damaged(self, segment: Segment, pos: int, reason: str) -> None:
        """Damage found while reading (it came after the log was opened): reported like
        damage found at open, and skipped from now on."""
        buf = os.pread(self._sealed.fd(segment), segment.size, 0)
        expected = segment.base
        if pos > SEGMENT_HEADER.size:  # the offset the bad record should have had
            before = scan_segment(buf[:pos], segment.base, self.max_record, last=True)
            expected = before.next_offset
        resume = resync(buf, pos, expected, self.max_record)
        end = segment.size if resume is None else resume
        last = (offset_at(buf, resume) - 1 if resume is not None
                else segment.next_offset - 1)
        corruption = Corruption(str(segment.path), pos, end, reason, expected, last)
        log.error("%s (found while reading)", corruption)
        self.corruptions.append(corruption)
        segment.bad.append((pos, end))
        segment.bad.sort()

    def _position(self, segment: Segment, offset: int) -> int:
        pos = segment.index.position_of(offset - segment.base)
        return SEGMENT_HEADER.size if pos is None else pos

    def offset_for_time(self, timestamp_ms: int) -> int:
        """The first offset stored at or after ``timestamp_ms`` (the next offset if none)."""
        for segment in self.segments:
            if segment.max_ts < timestamp_ms or segment.next_offset == segment.base:
                continue
            before = segment.index.offset_before(timestamp_ms)
            offset = segment.base + (0 if before is None else before)
            while True:
                records = self.read(offset, max_count=256)
                if not records:
                    break
                for record in records:
                    if record.timestamp >= timestamp_ms:
                        return record.offset
                offset = records[-1].offset + 1
        return self.next_offset

    # -- retention ---------------------------------------------------------------------

    def retain(self, *, max_bytes: int | None = None, max_age: float | None = None) -> int:
        """Delete the oldest whole segments (never the last) while the log is larger than
        ``max_bytes`` or their newest record is older than ``max_age`` seconds; how many
        records went."""
        now_ms = int(self.clock() * 1000)
        gone = 0
        if len(self.segments) > 1:  # the segment sealed last may go too
            with contextlib.suppress(StoreError):  # logged; writes are refused from now on
                self._take_flush()
        while len(self.segments) > 1:
            oldest = self.segments[0]
            too_big = max_bytes is not None and self.size_bytes > max_bytes
            too_old = max_age is not None and oldest.max_ts < now_ms - max_age * 1000
            if not (too_big or too_old):
                break
            self.segments.pop(0)
            self._sealed.close(oldest)
            oldest.path.unlink()
            oldest.index_path.unlink(missing_ok=True)
            gone += oldest.next_offset - oldest.base
        if gone:
            self.read_back.release(self.start_offset)
            fsync_dir(self._segdir)
            self._forget_written()  # none of it is older than what is held, as read finds
        return gone

    def close(self) -> None:
        with contextlib.suppress(StoreError):  # logged; opening again reads what is on disk
            self._take_flush()
        for segment in self.segments:
            with contextlib.suppress(OSError):
                self._sealed.close(segment)
        self.segments = []
        self.tail.clear()
        self.read_back.clear()
