"""A pure-Python reference ring, for property tests of the C ring only."""

from __future__ import annotations


class RefRing:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.data = bytearray()

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
        del self.data[:n]
        return out

    def peek(self, n: int) -> bytes:
        return bytes(self.data[:n])

    def skip(self, n: int) -> int:
        n = min(n, len(self.data))
        del self.data[:n]
        return n

    def put_frame(self, body: bytes) -> bool:
        if len(body) + 4 > self.free:
            return False
        self.data += len(body).to_bytes(4, "big") + body
        return True

    def take_frames(self, max_count: int, max_bytes: int, max_body: int) -> list[bytes]:
        frames: list[bytes] = []
        total = 0
        while len(frames) < max_count and len(self.data) >= 4:
            n = int.from_bytes(self.data[:4], "big")
            if n > max_body or len(self.data) - 4 < n or total + n > max_bytes:
                break
            frames.append(bytes(self.data[4:4 + n]))
            del self.data[:4 + n]
            total += n
        return frames
