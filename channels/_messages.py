"""Messages made of pieces, sans-I/O: :class:`Gather` (one message whose large pieces
are copied straight into a link, never joined first) and :class:`Batch` (messages joined
once, copied into several links), and how pieces are joined (:func:`coalesce`,
:func:`gather`).  The frame codec (:mod:`._codec`) moves them into rings.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from pump import ConfigError

from ._ring import JoinedBodies

#: Most body bytes joined for one batched put (kept under malloc's mmap threshold).
JOIN_MAX = 1 << 16

#: A message of pieces is kept as pieces from this many bytes on: below, joining them
#: costs less than moving each; above :data:`JOIN_MAX`, no batch of frames holds one.
GATHER_MIN = JOIN_MAX + 1


class Gather:
    """One message given as pieces that go back to back: the encoder copies each piece
    into the ring, so a large message (a header before bodies held elsewhere) is never
    joined into one bytes object first.  The pieces must not change until it is sent.
    Build one with :func:`gather`, which joins what is too small to gain from it."""

    __slots__ = ("pieces", "size")

    def __init__(self, pieces: Sequence[bytes | memoryview]) -> None:
        self.pieces = list(pieces)
        self.size = sum(map(len, self.pieces))
        if self.size < GATHER_MIN:
            raise ConfigError(f"a Gather holds at least {GATHER_MIN} bytes, not {self.size}: "
                             f"join smaller messages (gather() does)")

    def __len__(self) -> int:
        return self.size

    def __bytes__(self) -> bytes:
        return b"".join(self.pieces)

    def __repr__(self) -> str:
        return f"<Gather of {len(self.pieces)} pieces, {self.size} bytes>"


_ONLY_BYTES = frozenset((bytes,))


def _as_bytes(message: object) -> bytes:
    """A Batch's message as bytes: bytes as they are, bytes-like copied."""
    if type(message) is bytes:
        return message
    if not isinstance(message, (bytearray, memoryview)):
        raise TypeError(f"a Batch holds bytes, bytearray or memoryview messages, not "
                        f"{type(message).__name__}")
    return bytes(message)


class Batch:
    """Messages joined once for sending on several links: ``send_many(batch)`` on each of
    Q queues copies the frames into each link's ring straight from one joined buffer,
    so fanning a batch out costs one join and no per-message work per link.  Each
    queue delivers the messages as if they were sent one by one.  Bytes-like messages
    are copied to bytes; a :class:`Gather` cannot be one of them."""

    __slots__ = ("messages", "joined")

    def __init__(self, messages: Sequence[bytes | bytearray | memoryview]) -> None:
        given = list(messages)
        if set(map(type, given)) - _ONLY_BYTES:  # one pass in C when all are bytes
            given = [_as_bytes(m) for m in given]
        msgs = cast(list[bytes], given)
        #: The messages, in order (bytes).
        self.messages = msgs
        #: The messages joined, for the encoder.
        self.joined = JoinedBodies(msgs)

    def longer_than(self, limit: int) -> bool:
        """Whether a message is longer than ``limit`` bytes (a queue's max_message_size):
        at once when all of them together are not."""
        return self.joined.offsets[-1] > limit and self.joined.longest() > limit

    def __len__(self) -> int:
        return len(self.messages)

    @property
    def offsets(self) -> list[int]:
        """Where each message starts in the joined bodies; the last entry is their total."""
        return self.joined.offsets

    def __repr__(self) -> str:
        return f"<Batch of {len(self.messages)} messages, {self.offsets[-1]} bytes>"


#: Pieces shorter than this are joined with their neighbours by :func:`coalesce`.
SMALL_PIECE = 4096


def coalesce(pieces: Sequence[bytes | memoryview], small: int = SMALL_PIECE
             ) -> list[bytes | memoryview]:
    """``pieces`` with every run of pieces shorter than ``small`` joined into one: a
    large piece stays as it is (not copied), while moving many small ones one by one
    costs more than copying them together."""
    if max(map(len, pieces), default=0) < small:  # all small (the common case): one join
        return [b"".join(pieces)]
    out: list[bytes | memoryview] = []
    run: list[bytes | memoryview] = []
    for piece in pieces:
        if len(piece) < small:
            run.append(piece)
            continue
        if run:
            out.append(b"".join(run))
            run = []
        out.append(piece)
    if run:
        out.append(b"".join(run))
    return out


def gather(pieces: Sequence[bytes | memoryview]) -> bytes | Gather:
    """A message of ``pieces`` back to back: a :class:`Gather` of its large pieces (and
    of its runs of small ones, joined) when it is large and has any, else the pieces
    joined."""
    if sum(map(len, pieces)) < GATHER_MIN:
        return b"".join(pieces)
    kept = coalesce(pieces)
    return Gather(kept) if len(kept) > 1 else bytes(kept[0])  # joined once, by coalesce
