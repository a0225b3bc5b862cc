"""The tracker role of tracking: the servers a broker tracks, and its subscribers.

Servers report over links they dialled (``track_pub``); the tracker keeps
each one's latest ServerInfo in a liveness table and drops it at once when
that link drops, and when no report came within ``expiry`` (checked every
``scan_interval``), so a hung but connected server goes too.  Subscribers
(``track_sub``) get the whole TrackerInfo at once and after every change;
snapshots behind a slow subscriber coalesce (the latest wins).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from channels import MessageQueue
from pump import Pump

from .._liveness import PINNED, LivenessTable
from .._rpc import Sent, encode, send
from .info import ServerAddress, ServerInfo, TrackerInfo, VersionCounter
from .server import SERVER_VERSION

log = logging.getLogger("rdvpump.tracking")

#: Seconds without a report before a tracker drops a server (three report intervals).
DEFAULT_SERVER_EXPIRY = 90.0


class Subscriber:
    """One subscriber's link: snapshots are owed to it while it reads slowly."""

    def __init__(self, queue: MessageQueue) -> None:
        self.queue = queue
        #: A snapshot is owed: the last one did not fit under the high-water mark.
        self.behind = False


class TrackerRole:
    """The servers a broker tracks and the clients subscribed to them.

    ``count(cmd)`` counts what is sent.
    """

    def __init__(self, pump: Pump, broker_id: str, address: ServerAddress, *,
                 versions: VersionCounter, expiry: float, scan_interval: float,
                 count: Callable[[str], None]) -> None:
        self.pump = pump
        self.broker_id = broker_id
        self.address = address
        self.scan_interval = scan_interval
        self.count = count
        self._versions = versions
        self.version = versions.next()
        self.tracked: LivenessTable[ServerInfo] = LivenessTable(expiry=expiry)
        self.subscribers: dict[MessageQueue, Subscriber] = {}
        self._snapshot: bytes | None = None
        self._scan_timer = pump.call_later(scan_interval, self._scan)

    def tracker_info(self) -> TrackerInfo:
        return TrackerInfo(self.address, self.version, SERVER_VERSION, self.tracked.values())

    def snapshot(self) -> bytes:
        """The current TrackerInfo as a ``track_pub`` message, encoded once per version."""
        if self._snapshot is None:
            self._snapshot = encode({"cmd": "track_pub",
                                     "trackerInfo": self.tracker_info().to_json()})
        return self._snapshot

    # -- what servers report -----------------------------------------------------------

    def report(self, info: ServerInfo, connection: object) -> None:
        """A server's ServerInfo (``connection``: its link, or the node itself when the
        node is its own server: pinned, it never expires)."""
        if self.tracked.report(info.server_address.address, info, now=self.pump.now(),
                               version=info.info_version, connection=connection):
            self._changed()

    def report_local(self, info: ServerInfo, *, notify: bool = True) -> None:
        """The node's own server (pinned: it never drops or expires); ``notify=False``
        seeds the table without a new tracker version."""
        if notify:
            self.report(info, PINNED)
        else:
            self.tracked.report(info.server_address.address, info, now=self.pump.now(),
                                version=info.info_version, connection=PINNED)

    def leave(self, address: str) -> None:
        """A server said ``live: false``."""
        if self.tracked.remove(address):
            self._changed()

    def connection_lost(self, connection: object, reason: str) -> None:
        gone = self.tracked.connection_lost(connection)
        for address in gone:
            log.info("tracker %s: server %s dropped: its link closed (%s)", self.address,
                     address, reason)
            self.pump.emit("drop", broker=self.broker_id, peer=address, reason=reason)
        if gone:
            self._changed()

    def _scan(self) -> None:
        gone = self.tracked.scan(self.pump.now())
        for address in gone:
            log.info("tracker %s: server %s expired: no report within %s s", self.address,
                     address, self.tracked.expiry)
            self.pump.emit("expire", broker=self.broker_id, peer=address)
        if gone:
            self._changed()
        self._scan_timer = self.pump.call_later(self.scan_interval, self._scan)

    def _changed(self) -> None:
        self.version = self._versions.next()
        self._snapshot = None
        for subscriber in list(self.subscribers.values()):
            self.send_snapshot(subscriber)

    # -- subscribers -------------------------------------------------------------------

    def subscribe(self, queue: MessageQueue) -> None:
        subscriber = self.subscribers.setdefault(queue, Subscriber(queue))
        self.send_snapshot(subscriber)

    def unsubscribe(self, queue: MessageQueue) -> None:
        self.subscribers.pop(queue, None)

    def send_snapshot(self, subscriber: Subscriber) -> None:
        """The current TrackerInfo to a subscriber, unless one is still queued past the
        high-water mark: then the latest goes when it drains (:meth:`drained`)."""
        if subscriber.behind:
            return
        self.count("track_pub")
        outcome = send(subscriber.queue, self.snapshot(),
                       what=f"subscriber {subscriber.queue.remote_id}")
        if outcome is Sent.FULL:
            subscriber.behind = True
        elif outcome is Sent.GONE:
            self.unsubscribe(subscriber.queue)

    def drained(self, queue: MessageQueue) -> None:
        subscriber = self.subscribers.get(queue)
        if subscriber is not None and subscriber.behind:
            subscriber.behind = False
            self.send_snapshot(subscriber)

    def close(self) -> None:
        self._scan_timer.cancel()
        for subscriber in list(self.subscribers.values()):
            subscriber.queue.close()
