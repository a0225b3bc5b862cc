"""The newest appends of a log as they were written (their records' chunks), for a
master's copies frames: a replica that keeps up is sent the very pieces the log wrote,
with no read and no encoding again.

A batch is kept as it was written, with where each of its records ends, so that a frame
can start inside a batch and stop within a byte budget by bisection: as
:func:`~._record.encode_batch` made it (a list of three chunks a record: length and CRC,
header and names, body), or as :func:`~._copies.encode_produced` made it (one buffer).
What is kept is bounded (:data:`KEPT_BATCHES` batches and about :data:`KEPT_BYTES`
bytes, the newest batch always), let go of once every replica was sent it, and
forgotten whenever the log's records stop following its appends (copies stored,
records cut).  Batches are
kept only while someone wants them (a master with replicas says so at each shipment:
:meth:`Written.want`), for the next :data:`KEPT_BATCHES` appends after that (a log with
no replica pays one test an append).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from collections.abc import Sequence
from typing import Any

__all__ = ["KEPT_BATCHES", "KEPT_BYTES", "Written"]

#: The most batches kept.
KEPT_BATCHES = 64
#: About the most bytes of records kept (the newest batch is kept whatever its size).
KEPT_BYTES = 8 << 20

#: Pieces of a record as written: bytes, or a view of the request that brought its body.
Chunk = bytes | memoryview
#: A batch as written: its records' chunks, three a record, or one buffer of them all.
Chunks = list[Chunk] | Any


class Written:
    """The newest batches appended, their offsets consecutive."""

    __slots__ = ("batches", "bytes", "wanted")

    def __init__(self) -> None:
        #: ``(first offset, chunks, ends)``: ``ends[i]`` counts the bytes of the
        #: batch's records up to record ``i`` included.
        self.batches: deque[tuple[int, Chunks, Sequence[int]]] = deque()
        self.bytes = 0
        #: Appends still to keep (0: none is kept; the log calls :meth:`keep` only
        #: while it is not).
        self.wanted = 0

    def keep(self, first: int, chunks: Chunks, ends: Sequence[int]) -> None:
        """A batch just written from offset ``first`` (right after the last one kept, or
        what was kept is forgotten)."""
        self.wanted -= 1
        if not self.wanted:  # no one asked for a while: keep nothing more
            self.clear()
            return
        batches = self.batches
        if batches:
            last_first, _, last_ends = batches[-1]
            if last_first + len(last_ends) != first:
                self.clear()
        batches.append((first, chunks, ends))
        self.bytes += ends[-1]
        while len(batches) > 1 and (len(batches) > KEPT_BATCHES or self.bytes > KEPT_BYTES):
            self.bytes -= batches.popleft()[2][-1]

    def want(self) -> None:
        """Keep the next :data:`KEPT_BATCHES` appends (and go on keeping those kept)."""
        self.wanted = KEPT_BATCHES + 1

    def clear(self) -> None:
        self.batches.clear()
        self.bytes = 0

    def release(self, offset: int) -> None:
        """Let go of the batches whose records are all below ``offset``: every replica
        was sent them (one that asks again reads the log)."""
        batches = self.batches
        while batches and batches[0][0] + len(batches[0][2]) <= offset:
            self.bytes -= batches.popleft()[2][-1]

    def since(self, offset: int, max_bytes: int, max_count: int
              ) -> tuple[list[Chunk], int, int] | None:
        """The chunks of the records from ``offset`` on, as written, about ``max_bytes``
        of records (each taken while fewer bytes came before it, as the log's reads count
        theirs) and at most ``max_count`` records: ``(chunks, count, bytes)``; None if the
        record at ``offset`` is not kept."""
        batches = self.batches
        if not batches or not batches[0][0] <= offset < batches[-1][0] + len(batches[-1][2]):
            return None
        i = len(batches) - 1
        while batches[i][0] > offset:  # a follower that keeps up is in the newest ones
            i -= 1
        chunks: list[Chunk] = []
        count = size = 0
        for j in range(i, len(batches)):
            if size >= max_bytes or count >= max_count:
                break
            first, pieces, ends = batches[j]
            k = offset + count - first  # the first record taken from this batch
            before = ends[k - 1] if k else 0
            # up to the first record with the budget's bytes before it
            stop = min(bisect_left(ends, before + max_bytes - size, k) + 1, len(ends),
                       k + max_count - count)
            if not isinstance(pieces, list):  # one buffer: the records' bytes sliced
                chunks.append(memoryview(pieces)[before:ends[stop - 1]])
            else:
                chunks += pieces[3 * k:3 * stop] if k or stop < len(ends) else pieces
            count += stop - k
            size += ends[stop - 1] - before
            if stop < len(ends):
                break
        return chunks, count, size
