"""A memory-only topic's log: a bounded ring with the disk log's reading interface."""

from __future__ import annotations

import bisect
import time
from collections import deque
from collections.abc import Callable, Sequence

from pump import ConfigError

from ._files import SyncPoint
from ._record import Entry, Produced, Record
from ._scan import Corruption

#: Messages a memory-only topic keeps by default (the oldest go first).
DEFAULT_RING_COUNT = 100_000
#: Bytes of bodies a memory-only topic keeps by default.
DEFAULT_RING_BYTES = 64 << 20


class MemoryLog:
    """The newest messages of a memory-only topic, at most ``max_count`` and ``max_bytes``
    of bodies; older ones are dropped (counted in :attr:`dropped`)."""

    def __init__(self, *, max_count: int = DEFAULT_RING_COUNT,
                 max_bytes: int = DEFAULT_RING_BYTES,
                 clock: Callable[[], float] = time.time) -> None:
        if max_count < 1 or max_bytes < 1:
            raise ConfigError("a ring keeps at least one message and one byte")
        self.max_count = max_count
        self.max_bytes = max_bytes
        self.clock = clock
        self._records: deque[Record] = deque()
        self._bytes = 0
        self._next = 0
        self._last_ts = 0
        #: Messages dropped from the ring to make room.
        self.dropped = 0

    #: Nothing of a memory topic is durable: produces never wait for an fsync.
    persistent = False

    @property
    def corruptions(self) -> list[Corruption]:
        return []

    @property
    def start_offset(self) -> int:
        return self._records[0].offset if self._records else self._next

    @property
    def next_offset(self) -> int:
        return self._next

    @property
    def durable_offset(self) -> int:
        return self._next  # nothing more durable is promised for memory

    def append(self, messages: Sequence[Entry] | Produced, *, keep: bool = True) -> int:
        """Store messages (in memory: ``keep`` changes nothing); the first one's offset."""
        if isinstance(messages, Produced):
            messages = messages.entries()
        first = self._next
        now = max(int(self.clock() * 1000), self._last_ts)
        self._last_ts = now
        for tag, producer, sequence, body in messages:
            self._records.append(Record(self._next, now, sequence, tag, producer, bytes(body)))
            self._bytes += len(body)
            self._next += 1
        while len(self._records) > self.max_count or (
                self._bytes > self.max_bytes and len(self._records) > 1):
            self._bytes -= len(self._records.popleft().body)
            self.dropped += 1
        return first

    def sync(self) -> int:
        return self._next

    def prepare_sync(self) -> SyncPoint | None:
        return None

    def finish_sync(self, point: SyncPoint, error: OSError | None) -> int:
        return self._next

    def retain(self, *, max_bytes: int | None = None, max_age: float | None = None
               ) -> int:
        """Nothing: a ring keeps its own bounds (``max_count``, ``max_bytes``)."""
        return 0

    def want_written(self) -> None:
        """Nothing is kept as written: its records are read."""

    def written_since(self, offset: int, max_bytes: int, max_count: int) -> None:
        """Nothing is written: its records are read."""
        return None

    def release_written(self, offset: int) -> None:
        """Nothing is kept as written: its records are read."""

    def release(self, offset: int) -> None:
        """Nothing to let go: its records are all in memory, as many as its ring holds."""

    def read(self, offset: int, *, max_count: int = 256, max_bytes: int = 1 << 20
             ) -> list[Record]:
        records = self._records
        if not records:
            return []
        i = max(0, offset - records[0].offset)
        out: list[Record] = []
        size = 0
        while i < len(records) and len(out) < max_count and (not out or size < max_bytes):
            out.append(records[i])
            size += len(records[i].body)
            i += 1
        return out

    def offset_for_time(self, timestamp_ms: int) -> int:
        stamps = [r.timestamp for r in self._records]
        i = bisect.bisect_left(stamps, timestamp_ms)
        return self._records[i].offset if i < len(stamps) else self._next

    def close(self) -> None:
        self._records.clear()
