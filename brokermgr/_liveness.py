"""Liveness tables, sans-I/O: who reported, over which connection, and until when.

Fed reports, connection losses and scans with the time as an argument; never
reads a clock, never touches a socket.  As in RocketMQ's NameServer, a dropped
connection removes its entries at once and the periodic scan is only the
backstop for entries that are connected but silent.  The name service keeps
its brokers in one (keyed by broker id) and a tracker its servers (keyed by
``broker:port``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from pump import ConfigError

#: Seconds between two expiry scans of a liveness table (name service and trackers alike).
DEFAULT_SCAN_INTERVAL = 10.0

#: The connection of an entry that never drops and never expires (a tracker's own server).
PINNED: object = object()

V = TypeVar("V")


@dataclass
class LivenessEntry(Generic[V]):
    """What a table holds for one key: the latest value and when it was seen."""

    key: str
    value: V
    version: int
    since: float  # first report over this connection
    last_seen: float
    connection: object = field(default=None, compare=False, repr=False)


class LivenessTable(Generic[V]):
    """Entries by key, each with a version, refreshed by reports and dropped by silence.

    ``report`` keeps the value of the highest version: a report of a lower
    version than the one held is stale and changes nothing; a report of the
    same or a higher version replaces the value and proves the entry alive.
    """

    def __init__(self, *, expiry: float,
                 expiry_of: Callable[[V], float] | None = None) -> None:
        if not expiry > 0:
            raise ConfigError(f"expiry must be positive, got {expiry!r}")
        self.expiry = expiry
        #: An entry's own expiry, from its value (at most :attr:`expiry`); None: the table's.
        self.expiry_of = expiry_of
        self._entries: dict[str, LivenessEntry[V]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def report(self, key: str, value: V, *, now: float, version: int = 0,
               connection: object = None) -> bool:
        """A report of ``key``; True if the table changed (a new key, or a new value)."""
        held = self._entries.get(key)
        if held is None:
            self._entries[key] = LivenessEntry(key, value, version, now, now, connection)
            return True
        if version < held.version:
            return False
        changed = version > held.version or value != held.value
        held.value = value
        held.version = version
        held.last_seen = now
        if connection is not held.connection:
            held.connection = connection
            held.since = now
        return changed

    def remove(self, key: str) -> bool:
        """Forget ``key`` (a clean shutdown); True if it was there."""
        return self._entries.pop(key, None) is not None

    def connection_lost(self, connection: object) -> list[str]:
        """The fast path: drop every entry that reported over that connection."""
        gone = [k for k, e in self._entries.items() if e.connection is connection]
        for key in gone:
            del self._entries[key]
        return gone

    def scan(self, now: float) -> list[str]:
        """The backstop: drop entries not seen within the expiry (pinned ones stay)."""
        own = self.expiry_of
        gone = [k for k, e in self._entries.items()
                if e.connection is not PINNED and now - e.last_seen > (
                    self.expiry if own is None else min(self.expiry, own(e.value)))]
        for key in gone:
            del self._entries[key]
        return gone

    def get(self, key: str) -> LivenessEntry[V] | None:
        return self._entries.get(key)

    def entries(self) -> list[LivenessEntry[V]]:
        """Every entry, by key."""
        return [self._entries[k] for k in sorted(self._entries)]

    def values(self) -> dict[str, V]:
        """Every value, by key in order."""
        return {k: self._entries[k].value for k in sorted(self._entries)}
