"""A pure-Python reference ring, for property tests of the C ring only.

It models what the ring's users see: the bytes held, the room left, where the read
position is (so whether a frame at the head lies in one run of the ring), and the
frame calls the channel's codec makes (``put_batch``, ``put_each``, ``take_next``).
"""

from __future__ import annotations

from collections.abc import Sequence

HEADER = 4


class RefRing:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.data = bytearray()
        #: bytes consumed so far: the read position is this modulo the capacity
        self.taken = 0

    @property
    def used(self) -> int:
        return len(self.data)

    @property
    def free(self) -> int:
        return self.capacity - len(self.data)

    def write(self, b: bytes) -> int:
        n = min(len(b), self.free)
        self.data += b[:n]
        return n

    def read(self, n: int) -> bytes:
        out = bytes(self.data[:n])
        self.skip(n)
        return out

    def skip(self, n: int) -> int:
        n = min(n, len(self.data))
        del self.data[:n]
        self.taken += n
        return n

    def put_frame(self, body: bytes) -> bool:
        if len(body) + HEADER > self.free:
            return False
        self.data += len(body).to_bytes(HEADER, "big") + body
        return True

    def put_batch(self, bodies: Sequence[bytes], start: int, max_bytes: int,
                  max_count: int) -> tuple[int, int]:
        """Frames in order while each fits whole and, after the first, the bodies stay
        within ``max_bytes``; at most ``max_count``, and at most as many as would fit
        were every body as long as the first (the ring's documented estimate)."""
        rest = list(bodies[start:])
        if len(rest) == 1:
            return (1, len(rest[0])) if self.put_frame(rest[0]) else (0, 0)
        first = len(rest[0]) + HEADER
        if first > self.free:
            return 0, 0
        rest = rest[:min(min(self.free, max_bytes) // first + 1, max_count)]
        room, total, k = self.free, 0, 0
        for body in rest:
            if len(body) + HEADER > room or (k > 0 and total + len(body) > max_bytes):
                break
            room -= len(body) + HEADER
            total += len(body)
            k += 1
        for body in rest[:k]:
            self.put_frame(body)
        return k, total

    def put_each(self, bodies: Sequence[bytes], start: int, min_body: int
                 ) -> tuple[int, int]:
        i, done = start, 0
        while i < len(bodies) and len(bodies[i]) > min_body and self.put_frame(bodies[i]):
            done += len(bodies[i])
            i += 1
        return i, done

    def head(self) -> tuple[str, int]:
        """The frame at the head: ("none", -1), ("partial", length) or ("complete",
        length)."""
        if len(self.data) < HEADER:
            return "none", -1
        n = int.from_bytes(self.data[:HEADER], "big")
        return ("complete" if len(self.data) - HEADER >= n else "partial"), n

    def contiguous(self) -> int:
        """Bytes readable in one run from the read position."""
        return min(len(self.data), self.capacity - self.taken % self.capacity)

    def take_frames(self, max_count: int, max_bytes: int, max_body: int) -> list[bytes]:
        frames: list[bytes] = []
        total = 0
        while len(frames) < max_count:
            state, n = self.head()
            if state != "complete" or n > max_body or total + n > max_bytes:
                break
            frames.append(bytes(self.data[HEADER:HEADER + n]))
            self.skip(HEADER + n)
            total += n
        return frames
