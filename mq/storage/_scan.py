"""A segment's bytes read back: each record checked, damage found and skipped, the
sparse index rebuilt (sans-I/O but for :func:`segment_crc`); and the format of a
sealed segment's index.

A sealed segment's ``.idx`` holds one entry every :data:`INDEX_INTERVAL` bytes of
the segment (offset - base, file position, timestamp) and a footer with the
segment's size, next offset, newest timestamp and the CRC-32 of the whole segment,
itself checksummed: a restart takes a sealed segment on its index only when that
CRC still matches.  Reading a segment whole (:func:`scan_segment`) is what recovery
and ``rdvpump mq verify`` do otherwise.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

from ._index import INDEX_ENTRY, SparseIndex
from ._record import (
    FORMAT_VERSION,
    MAGIC,
    SEGMENT_HEADER,
    BadRecord,
    FormatError,
    crc32,
    decode,
    read_segment_header,
)

__all__ = ["INDEX_ENTRY", "INDEX_FOOTER", "INDEX_INTERVAL", "INDEX_MAGIC", "INDEX_VERSION",
           "Corruption", "Scan", "header_base", "offset_at", "resync", "scan_segment",
           "segment_crc"]

#: Bytes of log between two entries of a sparse index (Kafka's index.interval.bytes).
INDEX_INTERVAL = 4096
#: magic, version, base, next offset, size, max ts, CRC-32 of the whole segment, crc
INDEX_FOOTER = struct.Struct("<8sIQQQQII")
INDEX_MAGIC = b"RDVPQIDX"
#: 2: the footer holds the segment's checksum (version 1 indexes are rebuilt from the
#: segment, which is then verified record by record).
INDEX_VERSION = 2
#: Bytes read at a time to check a sealed segment's checksum.
CHECK_CHUNK = 8 << 20
#: Records a corrupt stretch may hide before reading gives up looking past it.
RESYNC_SPAN = 4096


@dataclass(frozen=True)
class Corruption:
    """A stretch of a segment that holds no valid record: where it is, why, and the
    offsets of the messages it hides (``first`` to ``last``; ``last`` is None when
    nothing tells where they end)."""

    file: str
    position: int
    end: int  # where reading goes on (the file's size if nothing follows)
    reason: str
    first: int
    last: int | None

    @property
    def offsets(self) -> str:
        if self.last is None:
            return f"offsets from {self.first} on"
        if self.last < self.first:
            return "no offset"
        return f"offset {self.first}" if self.last == self.first else (
            f"offsets {self.first} to {self.last}")

    def __str__(self) -> str:
        return (f"{self.file}: corrupt data at byte {self.position} ({self.reason}); "
                f"{self.end - self.position} bytes skipped, hiding {self.offsets}")


@dataclass
class Scan:
    """What reading a segment whole found (:func:`scan_segment`): its sparse index, its
    newest timestamp, the offset after its last valid record, the stretches with no
    valid record in them ``(position, end, reason, first offset hidden, next valid
    offset or None)``, and where a torn tail starts (the last segment only)."""

    index: SparseIndex
    max_ts: int
    next_offset: int
    bad: list[tuple[int, int, str, int, int | None]]
    torn: tuple[int, str] | None = None
    records: int = 0


def scan_segment(buf: bytes, base: int, max_record: int, *, last: bool) -> Scan:
    """Read the records of a segment's bytes ``buf`` (its header included) one by one,
    checking each, sans-I/O.  In the last segment a record that no valid one follows
    is a torn tail (a crash cut it short); anywhere else it is damage."""
    scan = Scan(SparseIndex(), 0, base, [])
    pos = SEGMENT_HEADER.size
    expected = base
    last_indexed = -INDEX_INTERVAL
    while pos < len(buf):
        try:
            found = decode(buf, pos, max_record)
            if found is not None and found[0].offset < expected:
                raise BadRecord(f"offset {found[0].offset} where {expected} or later belongs")
            if found is None and not last:
                raise BadRecord("a sealed segment ends inside a record")
        except BadRecord as exc:
            resume = resync(buf, pos, expected, max_record)
            if resume is None and last:
                scan.torn = (pos, str(exc))
                break
            end = len(buf) if resume is None else resume
            following = None if resume is None else offset_at(buf, resume)
            scan.bad.append((pos, end, str(exc), expected, following))
            if following is not None:
                expected = following
            pos = end
            continue
        if found is None:  # the last segment ends inside a record
            scan.torn = (pos, "a record torn at the tail")
            break
        record, end = found
        if pos - last_indexed >= INDEX_INTERVAL:
            scan.index.append((record.offset - base, pos, record.timestamp))
            last_indexed = pos
        scan.max_ts = max(scan.max_ts, record.timestamp)
        scan.records += 1
        expected = record.offset + 1
        pos = end
    scan.next_offset = expected
    return scan


def header_base(data: bytes, path: Path) -> tuple[int, str | None]:
    """A segment's base offset, from its header; when the header is damaged, from the
    file's name, with what is wrong (the records after it can still be read).
    :class:`FormatError` for a segment of another format version, or a header whose
    base disagrees with the name."""
    try:
        base, _ = read_segment_header(data, str(path))
    except FormatError as exc:
        # ours (magic and version), with a header checksum that fails: damage; anything
        # else is no segment of this format, and is refused
        if not (len(data) >= SEGMENT_HEADER.size and data[:8] == MAGIC
                and SEGMENT_HEADER.unpack_from(data)[1] == FORMAT_VERSION
                and path.stem.isdigit() and len(path.stem) == 20):
            raise
        return int(path.stem), str(exc).removeprefix(f"{path}: ")
    if path.stem != f"{base:020d}":
        raise FormatError(f"{path}: its header says base offset {base}")
    return base, None


def offset_at(buf: bytes, pos: int) -> int:
    """The offset of the (valid) record at ``pos``."""
    return int(struct.unpack_from("<Q", buf, pos + 8)[0])


def segment_crc(fd: int, size: int) -> int:
    """CRC-32 of a segment file's first ``size`` bytes, read a chunk at a time."""
    crc, pos = 0, 0
    while pos < size:
        chunk = os.pread(fd, min(CHECK_CHUNK, size - pos), pos)
        if not chunk:
            raise OSError(f"the file ends at byte {pos}, before {size}")
        crc = crc32(chunk, crc)
        pos += len(chunk)
    return crc


def resync(buf: bytes, pos: int, expected: int, max_record: int) -> int | None:
    """Where the next valid record after a bad one at ``pos`` starts; None if none does.

    Looks for the bytes of the next offsets (a record holds its offset at +8)
    rather than trying every position; gives up after a few offsets found
    nowhere (offsets are consecutive, so the later ones are not there either).
    """
    misses = 0
    for k in range(RESYNC_SPAN):
        needle = struct.pack("<Q", expected + k)
        at = buf.find(needle, pos + 9)
        if at < 0:
            misses += 1
            if misses > 8:
                return None
            continue
        while at >= 0:
            try:
                found = decode(buf, at - 8, max_record)
            except BadRecord:
                found = None
            if found is not None and found[0].offset >= expected:
                return at - 8
            at = buf.find(needle, at + 1)
    return None
