"""Records in C (``native/records.c``): a producer's run encoded in one call
(:func:`encode_produced`), and a replica's frame of copies checked in one call: every
record's length, checksum and flags, its offset in line and its timestamp in order, as
:meth:`TopicLog.append_copies <._log.TopicLog.append_copies>` stores them.  A log's
files read back are checked the same way (:meth:`TopicLog.read <._log.TopicLog.read>`:
what stops the scan, a record the read cut or damage, is then :func:`~._record.decode`'s
to tell).

The checks are :func:`~._record.decode`'s and the log's, in the same order, with the same
words for what is wrong; the C code only takes the Python interpreter's work per record
out of them (the CRC-32 is folded with carry-less multiplies where the CPU has them,
the same values as ``zlib.crc32``).  The records themselves (for the log's tail) are
made from what the scan found, without reading the bytes again.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from typing import Any

from pump import ConfigError

from ._record import RECORD_OVERHEAD, Produced, Record, names
from ._records import ffi, lib

__all__ = ["Copies", "encode_produced", "scan_copies"]

assert lib.RS_OVERHEAD == RECORD_OVERHEAD, "native/records.h and the record format differ"

#: What stopped a scan, in the words :func:`~._record.decode` and the log use.
_DAMAGE = {lib.RS_TRUNCATED: "the bytes end inside it", lib.RS_CHECKSUM: "checksum mismatch"}


class _Scratch:
    """The arrays a scan writes, kept for the next (a frame of copies is at most a few
    MiB: one entry per record, grown when a frame holds more).  One for the process: the
    logs of a process are written from its pump's one thread."""

    def __init__(self) -> None:
        self.size = 0
        self.stop = ffi.new("rs_stop *")
        self.crc = ffi.new("uint32_t *")
        self._grow(1024)

    def _grow(self, size: int) -> None:
        self.size = size
        self.ends: Any = ffi.new("uint64_t[]", size)
        self.bodies: Any = ffi.new("uint64_t[]", size)
        self.ts: Any = ffi.new("uint64_t[]", size)
        self.seqs: Any = ffi.new("uint64_t[]", size)

    def fit(self, size: int) -> _Scratch:
        if size > self.size:
            self._grow(max(size, 2 * self.size))
        return self


_scratch = _Scratch()


#: Memory for encoded runs, not cleared first (every byte is written).
_uncleared = ffi.new_allocator(should_clear_after_alloc=False)


def encode_produced(produced: Produced, first: int, timestamp: int, crc: int,
                    max_body: int) -> tuple[Any, Sequence[int], int]:
    """The records of ``produced`` from offset ``first``, all at ``timestamp``, as
    :func:`~._record.encode_batch` makes them, back to back in one buffer: ``(buffer,
    where each record ends in it, the CRC-32 ``crc`` carried on over it)``.
    :class:`~pump.ConfigError` for a body over ``max_body`` or a tag or producer id over
    255 bytes."""
    packed, tag_len, producer_len = names(produced.tag, produced.producer)
    sizes = produced.sizes
    count, longest = len(sizes), max(sizes)
    if longest > max_body:
        raise ConfigError(f"a body of {longest} bytes exceeds the queue's maximum of "
                          f"{max_body}")
    head = RECORD_OVERHEAD + len(packed)
    total = head * count + len(produced.body)
    out = _uncleared("unsigned char[]", total)
    ends = _scratch.fit(count).ends
    crc_io = _scratch.crc
    crc_io[0] = crc
    body = produced.body
    lib.rs_encode(out, body if type(body) is bytes else ffi.from_buffer(body),
                  ffi.new("uint32_t[]", sizes), count, packed, tag_len, producer_len, first,
                  timestamp, produced.sequence, crc_io, ends)
    if sizes.count(longest) == count:  # one length: where each ends, with no list
        length = head + longest
        return ffi.buffer(out), range(length, total + 1, length), crc_io[0]
    return ffi.buffer(out), ffi.unpack(ends, count), crc_io[0]


class Copies:
    """What :func:`scan_copies` found: the good records in a row from the start (``ends``:
    where each ends; ``timestamps``; ``records`` when asked for), and what is wrong with
    the bytes after them (None: nothing) with where that record starts."""

    __slots__ = ("ends", "timestamps", "records", "fault", "fault_at")

    def __init__(self, ends: list[int], timestamps: list[int], records: list[Record] | None,
                 fault: str | None, fault_at: int) -> None:
        self.ends = ends
        self.timestamps = timestamps
        self.records = records
        self.fault = fault
        self.fault_at = fault_at


def scan_copies(data: bytes | memoryview, *, max_record: int, max_body: int,
                expected: int, min_ts: int, records: bool, start: int = 0,
                limit: int | None = None) -> Copies:
    """Check the records of ``data`` (back to back from ``start``), the first at offset
    ``expected`` and none before ``min_ts``, at most ``limit`` of them: see
    :class:`Copies` (where each ends, and where the bad one starts, counted from
    ``data``'s start); with ``records``, the :class:`~._record.Record` of each good one
    too (their bodies are slices of ``data``, copied once)."""
    buf = data if type(data) is bytes else bytes(data)
    size = len(buf) - start
    s = _scratch.fit(size // RECORD_OVERHEAD + 1)
    stop = s.stop
    at = buf if not start else ffi.cast("const unsigned char *", ffi.from_buffer(buf)) + start
    count = lib.rs_scan(at, size, max_record, max_body, expected, min_ts, s.ends,
                        s.bodies, s.ts, s.seqs, s.size if limit is None else min(limit, s.size),
                        stop)
    ends: list[int] = ffi.unpack(s.ends, count)
    if start:
        ends = [end + start for end in ends]
    timestamps: list[int] = ffi.unpack(s.ts, count)
    fault = _fault(stop, max_body, expected + count, timestamps[-1] if count else min_ts)
    made = None
    if records:
        bodies: list[int] = ffi.unpack(s.bodies, count)
        if start:
            bodies = [body + start for body in bodies]
        made = _records(buf, start, expected, count, ends, bodies, timestamps,
                        ffi.unpack(s.seqs, count), bool(stop.same_names))
    return Copies(ends, timestamps, made, fault, ends[-1] if count else start)


def _fault(stop: Any, max_body: int, expected: int, latest: int) -> str | None:
    kind = stop.fault
    if kind == lib.RS_OK:
        return None
    if kind in _DAMAGE:
        return _DAMAGE[kind]
    if kind == lib.RS_LENGTH:
        return f"record length {stop.length} out of range"
    if kind == lib.RS_FLAGS:
        return f"unknown flags {stop.flags:#x}"
    if kind == lib.RS_OFFSET:
        return f"offset {stop.offset}, {expected} expected"
    if kind == lib.RS_TIMESTAMP:
        return f"timestamp {stop.timestamp} before {latest}"
    return f"a body of {stop.body} bytes exceeds the queue's maximum of {max_body}"


def _records(buf: bytes, start: int, first: int, count: int, ends: list[int],
             bodies: list[int], timestamps: list[int], sequences: list[int],
             same_names: bool) -> list[Record]:
    if not count:
        return []
    if same_names:  # one producer's run: its names decoded once
        tag, producer = _names(buf, start, bodies[0])
        return list(map(Record, range(first, first + count), timestamps, sequences,
                        repeat(tag, count), repeat(producer, count),
                        map(buf.__getitem__, map(slice, bodies, ends))))
    made = []
    names_were, tag, producer = b"", None, ""
    for i in range(count):
        body_at, end = bodies[i], ends[i]
        names = buf[start + RECORD_OVERHEAD:body_at]
        if names != names_were or not i:
            names_were = names
            tag, producer = _names(buf, start, body_at)
        made.append(Record(first + i, timestamps[i], sequences[i], tag, producer,
                           buf[body_at:end]))
        start = end
    return made


def _names(buf: bytes, start: int, body_at: int) -> tuple[str | None, str]:
    """The tag and producer id of the record at ``start`` whose body starts at
    ``body_at``."""
    tag_len = buf[start + 33]
    at = start + RECORD_OVERHEAD
    tag = buf[at:at + tag_len].decode(errors="replace") if tag_len else None
    return tag, buf[at + tag_len:body_at].decode(errors="replace")
