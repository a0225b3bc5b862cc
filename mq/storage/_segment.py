"""A log's segment files: created, sealed with their index, and opened again after a
crash (recovery).

Opening takes a sealed segment on its index when the checksum of the whole segment,
kept in the index, still matches, and reads it whole otherwise; the last segment is
always read whole, and a record torn by a crash at its end is cut (the bytes cut are
logged).  Damage anywhere is reported as a :class:`Corruption` naming the file, the
byte position and the offsets it hides, and the records after it are read all the same.
The formats are in :mod:`._record` (records, segment header) and :mod:`._scan` (the
index, the reading of a segment's bytes).

A log keeps its last segment's file open; a sealed one is closed once it is sealed and
opened again to be read (:class:`SealedFiles`: one at a time), so the file descriptors a
log holds do not grow with what it stores.
"""

from __future__ import annotations

import logging
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

from ._files import write_file
from ._index import SparseIndex
from ._record import SEGMENT_HEADER, FormatError, crc32, segment_header
from ._scan import (
    INDEX_ENTRY,
    INDEX_FOOTER,
    INDEX_INTERVAL,
    INDEX_MAGIC,
    INDEX_VERSION,
    Corruption,
    header_base,
    scan_segment,
    segment_crc,
)

__all__ = ["Opened", "SealedFiles", "Segment", "close_file", "create_segment", "open_segments",
           "rescan", "seal"]

log = logging.getLogger("rdvpump.mq")

#: A stretch found by a scan: (position, end, reason, first offset hidden, the offset
#: that follows it or None when the segment's end does).
_Hidden = tuple[int, int, str, int, int | None]


@dataclass
class Segment:
    path: Path
    base: int
    #: The open file (read and write); -1 for a sealed segment closed until it is read
    #: (:class:`SealedFiles`).
    fd: int
    size: int
    next_offset: int
    #: (offset - base, position, timestamp), every INDEX_INTERVAL bytes
    index: SparseIndex = field(default_factory=SparseIndex)
    max_ts: int = 0
    #: (position, end) stretches to skip
    bad: list[tuple[int, int]] = field(default_factory=list)
    last_indexed: int = -INDEX_INTERVAL
    #: CRC-32 of the file's bytes so far (kept as they are written: a sealed segment's
    #: index holds it)
    crc: int = 0

    @property
    def index_path(self) -> Path:
        return self.path.with_suffix(".idx")


def close_file(segment: Segment) -> None:
    """Close the segment's file if it is open."""
    fd, segment.fd = segment.fd, -1
    if fd >= 0:
        os.close(fd)


class SealedFiles:
    """The sealed segment of a log whose file is open to be read: one at a time, the one
    read last (a reader behind goes through the segments in order).  A sealed segment's
    file is opened again when it is read, the one open before closed."""

    __slots__ = ("open",)

    def __init__(self) -> None:
        self.open: Segment | None = None

    def fd(self, segment: Segment) -> int:
        """The segment's file, opened to be read if it is closed."""
        if segment.fd < 0:
            if self.open is not None:
                close_file(self.open)
            segment.fd = os.open(segment.path, os.O_RDONLY)
            self.open = segment
        return segment.fd

    def writable(self, segment: Segment) -> int:
        """The sealed segment's file opened to be written (it is to be the last again)."""
        self.close(segment)
        segment.fd = os.open(segment.path, os.O_RDWR)
        return segment.fd

    def close(self, segment: Segment) -> None:
        """Close the segment's file (it is sealed, or gone)."""
        if self.open is segment:
            self.open = None
        close_file(segment)


@dataclass
class Opened:
    """What :func:`open_segments` found: the segments in order, the damage (each logged
    once), and the bytes cut from the last segment's torn tail."""

    segments: list[Segment]
    corruptions: list[Corruption]
    cut_bytes: int


def create_segment(directory: Path, base: int, now_ms: int, max_ts: int, *,
                   sync: bool = True) -> Segment:
    """A new empty segment file starting at offset ``base``, its header fsynced unless
    ``sync`` is false (the caller then fsyncs it before the directory).  The directory is
    not fsynced: the caller does it with what it writes next."""
    path = directory / f"{base:020d}.seg"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        header = segment_header(base, now_ms)
        os.write(fd, header)
        if sync:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        path.unlink(missing_ok=True)
        raise
    return Segment(path, base, fd, len(header), base, max_ts=max_ts, crc=crc32(header))


def seal(segment: Segment) -> bool:
    """Write a sealed segment's index file: its entries, then a footer with the segment's
    size, next offset, newest timestamp and checksum, and the index's own CRC.  An index
    that cannot be written (out of files, say) is logged, not raised: it only saves
    reading the segment whole when the queue opens, which is then what happens.  True if
    it was written (and the directory fsynced with it)."""
    entries = segment.index.to_bytes()
    footer = INDEX_FOOTER.pack(INDEX_MAGIC, INDEX_VERSION, segment.base,
                               segment.next_offset, segment.size, segment.max_ts,
                               segment.crc, 0)
    body = entries + footer[:-4]
    try:
        write_file(segment.index_path, body + struct.pack("<I", crc32(body)))
    except OSError as exc:
        log.warning("%s: its index not written (%s): the segment is read whole when the "
                    "queue opens", segment.path, exc.strerror or exc)
        return False
    return True


def open_segments(directory: Path, max_record: int, now_ms: int) -> Opened:
    """Open the segments of ``directory`` (one new segment if there are none), the last
    one fsynced: what a killed process left in the page cache is durable when this
    returns.  :class:`FormatError` if two segments overlap; OSError as it comes (every
    file opened here is closed again then)."""
    paths = sorted(directory.glob("*.seg"))
    if not paths:
        return Opened([create_segment(directory, 0, now_ms, 0)], [], 0)
    segments: list[Segment] = []
    found: list[tuple[Segment, _Hidden]] = []
    cut = _torn_header(paths[-1], now_ms)
    try:
        for i, path in enumerate(paths):
            segment, cut_here = _load(path, last=i == len(paths) - 1,
                                      max_record=max_record, found=found)
            segments.append(segment)
            cut += cut_here
            if i < len(paths) - 1:  # sealed: opened again when it is read
                close_file(segment)
        os.fsync(segments[-1].fd)
        for earlier, later in zip(segments, segments[1:], strict=False):
            if later.base < earlier.next_offset:
                raise FormatError(f"{later.path}: starts at offset {later.base}, inside "
                                  f"{earlier.path} (which ends at {earlier.next_offset})")
    except BaseException:
        for segment in segments:
            close_file(segment)
        raise
    corruptions = []
    for segment, hidden in found:
        # damage at the end of a sealed segment hides offsets up to the next one's base
        i = segments.index(segment)
        last = hidden[4]
        if last is None and i + 1 < len(segments):
            last = segments[i + 1].base
        corruption = Corruption(str(segment.path), hidden[0], hidden[1], hidden[2],
                                hidden[3], None if last is None else last - 1)
        log.error("%s", corruption)
        corruptions.append(corruption)
    return Opened(segments, corruptions, cut)


def _torn_header(path: Path, now_ms: int) -> int:
    """A last segment shorter than its header (a crash between the file's creation and
    its header's write: it holds no record) gets its header again, from its name; the
    bytes of the torn header cut (0 if it was whole)."""
    size = path.stat().st_size
    if size >= SEGMENT_HEADER.size:
        return 0
    try:
        base = int(path.stem)
    except ValueError:
        raise FormatError(f"{path}: {size} bytes, shorter than a segment header, and its "
                          f"name is not a segment's base offset") from None
    fd = os.open(path, os.O_RDWR)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, segment_header(base, now_ms), 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    log.warning("%s: a header torn at %d bytes (the process stopped as it created the "
                "segment, before any record): written again", path, size)
    return size


def rescan(segment: Segment, max_record: int) -> None:
    """Read the last segment whole again (after it was cut at a record's end): its index,
    next offset and newest timestamp from what it holds now.  Damage in it was reported
    when it was found."""
    _scan(segment, last=True, max_record=max_record, found=[])


def _load(path: Path, *, last: bool, max_record: int,
          found: list[tuple[Segment, _Hidden]]) -> tuple[Segment, int]:
    """A segment file opened: on its index if it is sealed and the index holds, else read
    whole; with the bytes cut from a torn tail."""
    fd = os.open(path, os.O_RDWR)
    try:
        size = os.fstat(fd).st_size
        base, damage = header_base(os.pread(fd, SEGMENT_HEADER.size, 0), path)
        segment = Segment(path, base, fd, size, base)
        if damage is not None:  # the records after it are read all the same
            found.append((segment, (0, SEGMENT_HEADER.size, damage, base, base)))
        if not last and _load_index(segment):
            return segment, 0
        return segment, _scan(segment, last=last, max_record=max_record, found=found)
    except BaseException:
        os.close(fd)
        raise


def _load_index(segment: Segment) -> bool:
    """Take a sealed segment on its index if the index checks out and the segment's
    checksum still matches the one the index keeps; False: read it whole."""
    try:
        data = segment.index_path.read_bytes()
    except FileNotFoundError:
        return False
    if len(data) < INDEX_FOOTER.size or (len(data) - INDEX_FOOTER.size) % INDEX_ENTRY.size:
        return False
    magic, version, base, next_offset, size, max_ts, seg_crc, crc = (
        INDEX_FOOTER.unpack_from(data, len(data) - INDEX_FOOTER.size))
    if (magic != INDEX_MAGIC or version != INDEX_VERSION or base != segment.base
            or size != segment.size or crc32(data[:-4]) != crc):
        return False
    if segment_crc(segment.fd, segment.size) != seg_crc:
        return False  # damaged since it was sealed: reading it whole says where
    segment.index = SparseIndex.from_bytes(memoryview(data)[:len(data) - INDEX_FOOTER.size])
    segment.next_offset, segment.max_ts = next_offset, max_ts
    segment.crc = seg_crc
    return True


def _scan(segment: Segment, *, last: bool, max_record: int,
          found: list[tuple[Segment, _Hidden]]) -> int:
    """Read a segment whole: rebuild its index, find corrupt stretches, cut a torn tail (the
    bytes cut returned); a sealed segment found whole gets its index written again."""
    buf = os.pread(segment.fd, segment.size, 0)
    scan = scan_segment(buf, segment.base, max_record, last=last)
    segment.index = scan.index
    indexed = scan.index.last_position
    segment.last_indexed = -INDEX_INTERVAL if indexed is None else indexed
    segment.max_ts = scan.max_ts
    segment.next_offset = scan.next_offset
    for pos, end, reason, first, following in scan.bad:
        segment.bad.append((pos, end))
        found.append((segment, (pos, end, reason, first, following)))
    cut = 0
    if scan.torn is not None:
        cut = _cut(segment, *scan.torn)
    segment.crc = crc32(memoryview(buf)[:segment.size])
    if not last:
        # sealed while a killed process was still flushing it: its records may be in
        # the page cache only
        os.fsync(segment.fd)
        if not scan.bad:
            seal(segment)
    return cut


def _cut(segment: Segment, pos: int, why: str) -> int:
    cut = segment.size - pos
    os.ftruncate(segment.fd, pos)
    os.fsync(segment.fd)
    segment.size = pos
    log.warning("%s: cut %d bytes at byte %d, from offset %d on (%s); every record "
                "before them is kept", segment.path, cut, pos, segment.next_offset, why)
    return cut
