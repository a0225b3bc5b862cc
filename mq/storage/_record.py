"""The on-disk format of a topic's log, version 1, sans-I/O (docs/mq-format.md).

A segment file starts with a 32-byte header, then holds records back to back:

    header: magic b"RDVPQSEG" (8) | version u32 | base offset u64 | created ms u64 | crc u32
    record: length u32 | crc u32 | offset u64 | timestamp ms u64 | sequence u64
            | flags u8 | tag length u8 | producer length u8 | reserved u8
            | tag | producer id | body

Integers are little-endian.  ``length`` counts the whole record, itself
included; ``crc`` is CRC-32 (zlib) of every byte after it, header fields and
body alike (zbus checked only the header, RocketMQ only the body).

:func:`crc32` is zlib-ng's: the same CRC-32, with the same values as ``zlib.crc32``,
many times faster on large bodies (folded with carry-less multiplies), which
matters when every byte stored is checked once going in and once coming out.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

from zlib_ng.zlib_ng import crc32 as crc32  # re-exported: one CRC for every mq file

from channels import split_bodies
from pump import ConfigError, RdvpumpError

FORMAT_VERSION = 1
MAGIC = b"RDVPQSEG"
SEGMENT_HEADER = struct.Struct("<8sIQQI")
RECORD_HEADER = struct.Struct("<IIQQQBBBB")
#: Bytes of a record besides its tag, producer id and body.
RECORD_OVERHEAD = RECORD_HEADER.size
#: Largest body a record holds by default (the link's default max message size).
DEFAULT_MAX_BODY = 16 << 20


#: A message to store: ``(tag, producer id, sequence, body)``.
Entry = tuple[str | None, str, int, bytes | memoryview]


@dataclass(slots=True)
class Produced:
    """Messages of one producer with one tag and consecutive sequences, their bodies back
    to back (as a produce request brings them, each under
    :data:`~._files.VIEW_BODY` bytes): a log stores them in one C call
    (:func:`~._copies.encode_produced`) where a list of :data:`Entry` takes a Python loop a
    message, and its tail cuts the bodies only when it keeps them."""

    tag: str | None
    producer: str
    sequence: int  # the first message's; one more each
    body: bytes | memoryview  # the bodies back to back
    sizes: Sequence[int]  # each body's length

    def __len__(self) -> int:
        return len(self.sizes)

    def entries(self) -> list[Entry]:
        """The messages as :data:`Entry` tuples."""
        bodies = split_bodies(self.body, list(self.sizes))
        return [(self.tag, self.producer, self.sequence + i, body)
                for i, body in enumerate(bodies)]


class StoreError(RdvpumpError, OSError):
    """A queue's files cannot be read or written as they should; the message says why."""


class FormatError(StoreError):
    """A file of another format or version."""


@dataclass(slots=True)
class Record:
    """One stored message (read-only by convention: a plain slotted class is several
    times cheaper to create than a frozen dataclass, and the log creates one per
    message)."""

    offset: int
    timestamp: int  # ms since the epoch, never lower than the record before
    sequence: int  # the producer's
    tag: str | None
    producer: str
    body: bytes | memoryview  # a view of the produce request while the log's tail holds it

    @property
    def size(self) -> int:
        return (RECORD_OVERHEAD + len(self.tag.encode() if self.tag else b"")
                + len(self.producer.encode()) + len(self.body))


def segment_header(base_offset: int, created_ms: int) -> bytes:
    head = SEGMENT_HEADER.pack(MAGIC, FORMAT_VERSION, base_offset, created_ms, 0)
    return head[:-4] + struct.pack("<I", crc32(head[:-4]))


def read_segment_header(data: bytes, where: str) -> tuple[int, int]:
    """``(base offset, created ms)`` of a segment header; :class:`FormatError` otherwise."""
    if len(data) < SEGMENT_HEADER.size:
        raise FormatError(f"{where}: {len(data)} bytes, shorter than a segment header")
    magic, version, base, created, crc = SEGMENT_HEADER.unpack_from(data)
    if magic != MAGIC:
        raise FormatError(f"{where}: not an rdvpump queue segment (magic {magic!r})")
    if version != FORMAT_VERSION:
        raise FormatError(f"{where}: on-disk format version {version}; this rdvpump reads "
                          f"version {FORMAT_VERSION} only")
    if crc32(data[:SEGMENT_HEADER.size - 4]) != crc:
        raise FormatError(f"{where}: segment header checksum mismatch")
    return base, created


#: A record's length and CRC, then the fields the CRC covers before the tag.
_LENGTH_CRC = struct.Struct("<II")
_FIELDS = struct.Struct("<QQQBBBB")


def names(tag: str | None, producer: str) -> tuple[bytes, int, int]:
    """A record's tag and producer id as stored (``tag bytes + producer bytes``) and their
    lengths; ValueError for either over 255 bytes."""
    tag_bytes = tag.encode() if tag else b""
    producer_bytes = producer.encode()
    if len(tag_bytes) > 255 or len(producer_bytes) > 255:
        raise ConfigError("a tag and a producer id are at most 255 bytes each")
    return tag_bytes + producer_bytes, len(tag_bytes), len(producer_bytes)


def encode_batch(first: int, timestamp: int,
                 messages: Sequence[Entry], max_body: int
                 ) -> tuple[list[bytes | memoryview], list[int]]:
    """Records for ``(tag, producer id, sequence, body)`` messages from offset ``first``:
    the pieces to write back to back (bodies are not copied) and each record's length.
    ValueError for a body over ``max_body`` or a tag or producer id over 255 bytes."""
    chunks: list[bytes | memoryview] = []
    lengths: list[int] = []
    add, pack_fields, pack_length_crc, crc = (
        chunks.append, _FIELDS.pack, _LENGTH_CRC.pack, crc32)
    tag_was: object = ()  # matches no tag: the first message encodes its names
    producer_was = ""
    packed, tag_len, producer_len = b"", 0, 0
    offset = first
    for tag, producer, sequence, body in messages:
        if len(body) > max_body:
            raise ConfigError(f"a body of {len(body)} bytes exceeds the queue's maximum of "
                             f"{max_body}")
        if tag is not tag_was or producer is not producer_was:
            packed, tag_len, producer_len = names(tag, producer)  # once per run of them
            tag_was, producer_was = tag, producer
        head = pack_fields(offset, timestamp, sequence, 0, tag_len, producer_len, 0) + packed
        length = 8 + len(head) + len(body)
        add(pack_length_crc(length, crc(body, crc(head))))
        add(head)
        add(body)
        lengths.append(length)
        offset += 1
    return chunks, lengths


def encode_records(records: Sequence[Record], max_body: int
                   ) -> tuple[list[bytes | memoryview], list[int]]:
    """Records as stored, each with its own offset and timestamp: the bytes the log that
    holds them wrote, for another to store as they are (a replica's)."""
    chunks: list[bytes | memoryview] = []
    lengths: list[int] = []
    start = 0
    while start < len(records):  # runs of one timestamp and consecutive offsets
        end = start + 1
        first = records[start]
        while end < len(records) and records[end].timestamp == first.timestamp and (
                records[end].offset == first.offset + end - start):
            end += 1
        more, sizes = encode_batch(first.offset, first.timestamp,
                                   [(r.tag, r.producer, r.sequence, r.body)
                                    for r in records[start:end]], max_body)
        chunks += more
        lengths += sizes
        start = end
    return chunks, lengths


class BadRecord(RdvpumpError):
    """What is wrong with the bytes where a record should start."""


def decode(buf: bytes | memoryview, pos: int, max_record: int) -> tuple[Record, int] | None:
    """The record at ``pos`` and where the next one starts; None if the buffer ends
    inside it (more bytes may come, or the tail is torn); :class:`BadRecord` if the bytes
    there are not a valid record."""
    end = len(buf)
    if end - pos < RECORD_OVERHEAD:
        return None
    (length, crc, offset, timestamp, sequence, flags, tag_len, producer_len,
     _) = RECORD_HEADER.unpack_from(buf, pos)
    if length < RECORD_OVERHEAD + tag_len + producer_len or length > max_record:
        raise BadRecord(f"record length {length} out of range")
    if end - pos < length:
        return None
    if crc32(memoryview(buf)[pos + 8:pos + length]) != crc:  # checked where it lies
        raise BadRecord("checksum mismatch")
    if flags != 0:
        raise BadRecord(f"unknown flags {flags:#x}")
    start = pos + RECORD_OVERHEAD
    tag = bytes(buf[start:start + tag_len]).decode(errors="replace") if tag_len else None
    start += tag_len
    producer = bytes(buf[start:start + producer_len]).decode(errors="replace")
    start += producer_len
    return Record(offset, timestamp, sequence, tag, producer,
                  bytes(buf[start:pos + length])), pos + length
