"""The name service's liveness table, sans-I/O: who is registered, where, and until when.

Fed registrations, heartbeats, connection losses and scans with the time as an
argument; never reads a clock, never touches a socket.  As in RocketMQ's
NameServer, a dropped connection removes its brokers at once and the periodic
scan is only the backstop for brokers that are connected but silent.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rdv import Address

#: Seconds between two expiry scans of a liveness table (name service and trackers alike).
DEFAULT_SCAN_INTERVAL = 10.0


@dataclass
class BrokerRecord:
    broker_id: str
    address: Address
    version: int
    topics: tuple[str, ...]
    registered_at: float
    last_heartbeat: float
    connection: object = field(default=None, compare=False, repr=False)

    def age(self, now: float) -> float:
        return now - self.registered_at

    def to_dict(self, now: float) -> dict[str, object]:
        return {"id": self.broker_id, "address": list(self.address), "version": self.version,
                "topics": list(self.topics), "age": round(self.age(now), 3),
                "since_heartbeat": round(now - self.last_heartbeat, 3)}


class LivenessTable:
    """Registered brokers of one universe, by id."""

    def __init__(self, *, expiry: float) -> None:
        if not expiry > 0:
            raise ValueError(f"expiry must be positive, got {expiry!r}")
        self.expiry = expiry
        self._records: dict[str, BrokerRecord] = {}

    def __len__(self) -> int:
        return len(self._records)

    def __contains__(self, broker_id: object) -> bool:
        return broker_id in self._records

    def register(self, broker_id: str, address: Address, *, now: float, version: int = 0,
                 topics: tuple[str, ...] = (), connection: object = None) -> BrokerRecord:
        """Register or refresh (a heartbeat is a registration).  Returns the record.

        A registration with a lower version than the one held is stale and
        changes nothing but is not an error.
        """
        record = self._records.get(broker_id)
        if record is not None and version < record.version:
            return record
        if record is None or record.address != tuple(address) or record.connection is not \
                connection:
            record = BrokerRecord(broker_id, Address(address[0], int(address[1])), version, topics,
                                  registered_at=now, last_heartbeat=now, connection=connection)
            self._records[broker_id] = record
        else:
            record.version = version
            record.topics = topics
            record.last_heartbeat = now
        return record

    def unregister(self, broker_id: str) -> bool:
        """Clean shutdown of a broker; True if it was registered."""
        return self._records.pop(broker_id, None) is not None

    def connection_lost(self, connection: object) -> list[str]:
        """The fast path: drop every broker registered over that connection."""
        gone = [i for i, r in self._records.items() if r.connection is connection]
        for broker_id in gone:
            del self._records[broker_id]
        return gone

    def scan(self, now: float) -> list[str]:
        """The backstop: drop brokers with no heartbeat within the expiry."""
        gone = [i for i, r in self._records.items() if now - r.last_heartbeat > self.expiry]
        for broker_id in gone:
            del self._records[broker_id]
        return gone

    def lookup(self, broker_id: str) -> Address | None:
        record = self._records.get(broker_id)
        return None if record is None else record.address

    def records(self) -> list[BrokerRecord]:
        return sorted(self._records.values(), key=lambda r: r.broker_id)
