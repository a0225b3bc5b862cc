"""A segment's sparse index in memory: an entry every :data:`~._scan.INDEX_INTERVAL` bytes
of log, ``(offset - base, position, timestamp)``, held as three arrays of machine integers.

Every segment a log keeps holds its index for as long as it is kept, so the index is
what a log's memory grows with as it stores.  An entry as a tuple of three ints held
about 160 bytes (3.9 % of the bytes stored, measured: a server taking 1 KiB messages
at 256,000 a second grew by some 9 MB a second) and was one more object for the cyclic
collector to walk at every full collection.  Here an entry is 16 bytes (0.4 %, 0.5 %
measured with the arrays' spare room) and no object at all.
"""

from __future__ import annotations

import bisect
import struct
from array import array
from collections.abc import Iterable, Iterator
from itertools import starmap

__all__ = ["INDEX_ENTRY", "SparseIndex"]

#: An entry in an index file: offset - base, position, timestamp.
INDEX_ENTRY = struct.Struct("<IIQ")


def _unsigned(code: str, size: int) -> str:
    if array(code).itemsize != size:  # pragma: no cover - every platform CPython runs on
        raise RuntimeError(f"array({code!r}) is not {size} bytes here")
    return code


_U32 = _unsigned("I", 4)
_U64 = _unsigned("Q", 8)


class SparseIndex:
    """Entries in the order they were added (offsets and positions rising): where a
    read by offset starts in the segment, and which part a read by time looks in."""

    __slots__ = ("offsets", "positions", "times")

    def __init__(self, entries: Iterable[tuple[int, int, int]] = ()) -> None:
        #: offset - base of each entry's record
        self.offsets = array(_U32)
        #: where that record starts in the segment
        self.positions = array(_U32)
        #: its timestamp (ms)
        self.times = array(_U64)
        for entry in entries:
            self.append(entry)

    def append(self, entry: tuple[int, int, int]) -> None:
        offset, position, timestamp = entry
        self.offsets.append(offset)
        self.positions.append(position)
        self.times.append(timestamp)

    def position_of(self, relative: int) -> int | None:
        """Where the last entry at or before ``relative`` (an offset less the segment's
        base) starts; None when the first entry is past it."""
        i = bisect.bisect_right(self.offsets, relative) - 1
        return self.positions[i] if i >= 0 else None

    def offset_before(self, timestamp_ms: int) -> int | None:
        """The relative offset of the last entry stored before ``timestamp_ms``; None when
        there is none."""
        i = bisect.bisect_left(self.times, timestamp_ms) - 1
        return self.offsets[i] if i >= 0 else None

    @property
    def last_position(self) -> int | None:
        return self.positions[-1] if self.positions else None

    def to_bytes(self) -> bytes:
        """The entries as the index file holds them (:data:`INDEX_ENTRY` each)."""
        return b"".join(starmap(INDEX_ENTRY.pack, zip(self.offsets, self.positions,
                                                      self.times, strict=True)))

    @classmethod
    def from_bytes(cls, data: bytes | memoryview) -> SparseIndex:
        """Entries packed as :meth:`to_bytes` packs them (a whole number of them)."""
        return cls(INDEX_ENTRY.iter_unpack(data))

    def __len__(self) -> int:
        return len(self.offsets)

    def __iter__(self) -> Iterator[tuple[int, int, int]]:
        return zip(self.offsets, self.positions, self.times, strict=True)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SparseIndex):
            return (self.offsets == other.offsets and self.positions == other.positions
                    and self.times == other.times)
        if isinstance(other, list):
            return list(self) == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return f"<SparseIndex of {len(self)} entries>"
