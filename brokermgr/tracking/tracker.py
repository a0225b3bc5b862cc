"""The tracker role of tracking: the servers a broker tracks, and its subscribers.

Servers report over links they dialled (``track_pub``); the tracker keeps
each one's latest ServerInfo in a liveness table and drops it at once when
that link drops, and when no report came within ``expiry`` (checked every
``scan_interval``), so a hung but connected server goes too.  Subscribers
(``track_sub``) get the whole TrackerInfo at once, then only what changed
(:mod:`.feed`: deltas numbered per subscription, large sets in pieces), or
zbus's whole TrackerInfo after every change if they did not ask for deltas.
Behind a slow subscriber, changes coalesce: at most one set is queued past
the high-water mark, and the changes after it are merged (the latest
ServerInfo of each server wins), so memory stays bounded by the table.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Mapping

from channels import MessageQueue
from pump import ConfigError, Pump
from pump.schema import Kind

from .._liveness import PINNED, LivenessTable
from .._rpc import Sent, encode, send
from . import feed
from .info import ServerAddress, ServerInfo, TrackerInfo, VersionCounter
from .server import SERVER_VERSION

log = logging.getLogger("rdvpump.tracking")

#: Seconds without a report before a tracker drops a server (three report intervals).
DEFAULT_SERVER_EXPIRY = 90.0


class Subscriber:
    """One subscriber's link: the pieces queued for it and the changes it is owed."""

    def __init__(self, queue: MessageQueue, deltas: bool, split: bool = False,
                 patches: bool = False) -> None:
        self.queue = queue
        #: It asked for deltas (else: zbus's whole TrackerInfo after every change).
        self.deltas = deltas
        #: It reads a ServerInfo split over pieces (:func:`.feed.entry_parts`).
        self.split = split
        #: It reads a server it holds as a patch of what it holds (:func:`.feed.patch`).
        self.patches = patches
        #: What it was sent of each server (kept for one that reads patches).
        self.holds: dict[str, ServerInfo] = {}
        #: The seq of the last set queued for it.
        self.seq = 0
        #: Messages (pieces) not yet accepted by its queue.
        self.outbox: deque[bytes] = deque()
        #: A full snapshot is owed (first, after a resync; every change without deltas).
        self.owe_full = True
        #: Changes owed since the last set queued: address -> ServerInfo, or None if it left.
        self.pending: dict[str, ServerInfo | None] = {}

    @property
    def behind(self) -> bool:
        """Something is owed that its queue does not take yet."""
        return bool(self.outbox)


class TrackerRole:
    """The servers a broker tracks and the clients subscribed to them.

    ``count(cmd, nbytes)`` counts what is sent.  ``piece_bytes`` bounds the
    messages of a feed (the link's max_message_size if that is smaller).
    """

    def __init__(self, pump: Pump, broker_id: str, address: ServerAddress, *,
                 versions: VersionCounter, expiry: float, scan_interval: float,
                 count: Callable[[str, int], object],
                 piece_bytes: int = feed.PIECE_BYTES) -> None:
        if piece_bytes <= feed.OVERHEAD:
            raise ConfigError(f"piece_bytes must exceed {feed.OVERHEAD}, got {piece_bytes}")
        self.pump = pump
        self.broker_id = broker_id
        self.address = address
        self.scan_interval = scan_interval
        self.count = count
        self.piece_bytes = piece_bytes
        self._versions = versions
        self.version = versions.next()
        self.tracked: LivenessTable[ServerInfo] = LivenessTable(expiry=expiry)
        self.subscribers: dict[MessageQueue, Subscriber] = {}
        self._snapshot: bytes | None = None
        # (budget, split) -> this version's snapshot
        self._pieces: dict[tuple[int, bool], feed.PieceSet] = {}
        self._entries: dict[str, tuple[ServerInfo, bytes]] = {}  # encoded once per ServerInfo
        # and cut for split subscribers, once per ServerInfo and budget
        self._parts: dict[str, tuple[ServerInfo, int, list[bytes]]] = {}
        # the last patch made of each server: from, to, and it (subscribers share them)
        self._patches: dict[str, tuple[ServerInfo, ServerInfo, bytes]] = {}
        self._scan_timer = pump.call_every(scan_interval, self._scan)

    def tracker_info(self) -> TrackerInfo:
        return TrackerInfo(self.address, self.version, SERVER_VERSION, self.tracked.values())

    def snapshot(self) -> bytes:
        """The current TrackerInfo as one zbus ``track_pub`` message, encoded once per version."""
        if self._snapshot is None:
            self._snapshot = encode({"cmd": "track_pub",
                                     "trackerInfo": self.tracker_info().to_json()})
        return self._snapshot

    # -- what servers report -----------------------------------------------------------

    def report(self, info: ServerInfo, connection: object) -> None:
        """A server's ServerInfo (``connection``: its link, or the node itself when the
        node is its own server: pinned, it never expires)."""
        address = info.server_address.address
        if self.tracked.report(address, info, now=self.pump.now(),
                               version=info.info_version, connection=connection):
            self._changed({address: info})

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
            self._changed({address: None})

    def connection_lost(self, connection: object, reason: str) -> None:
        gone = self.tracked.connection_lost(connection)
        for address in gone:
            log.info("tracker %s: server %s dropped: its link closed (%s)", self.address,
                     address, reason)
            self.pump.emit(Kind.DROP, broker=self.broker_id, peer=address, reason=reason)
        if gone:
            self._changed(dict.fromkeys(gone))

    def _scan(self) -> None:
        gone = self.tracked.scan(self.pump.now())
        for address in gone:
            log.info("tracker %s: server %s expired: no report within %s s", self.address,
                     address, self.tracked.expiry)
            self.pump.emit(Kind.EXPIRE, broker=self.broker_id, peer=address)
        if gone:
            self._changed(dict.fromkeys(gone))

    def _changed(self, changes: dict[str, ServerInfo | None]) -> None:
        self.version = self._versions.next()
        self._snapshot = None
        self._pieces.clear()
        # this change as a delta, by budget and split
        shared: dict[tuple[int, bool], feed.PieceSet | None] = {}
        for subscriber in list(self.subscribers.values()):
            if not subscriber.deltas:
                subscriber.owe_full = True
            elif not subscriber.owe_full:
                if subscriber.outbox or subscriber.pending:
                    subscriber.pending.update(changes)
                else:
                    if subscriber.patches:  # its own: against what it holds
                        pieces = self._delta(changes, self._budget(subscriber), subscriber)
                    else:
                        key = (self._budget(subscriber), subscriber.split)
                        if key not in shared:
                            shared[key] = self._delta(changes, key[0], subscriber)
                        pieces = shared[key]
                    if pieces is None:
                        self._too_large(subscriber, "a ServerInfo does not fit in a piece")
                        continue
                    self._queue(subscriber, pieces, changes)
            self._flush(subscriber)

    # -- encoding ----------------------------------------------------------------------

    def _entry(self, address: str, info: ServerInfo) -> bytes:
        held = self._entries.get(address)
        if held is None or held[0] is not info:
            held = self._entries[address] = (info, feed.entry(address, info))
        return held[1]

    def _encoded(self, address: str, info: ServerInfo, budget: int,
                 subscriber: Subscriber) -> list[bytes]:
        """``address``'s entry for ``subscriber``: whole, or in parts if it reads them."""
        if not subscriber.split:
            return [self._entry(address, info)]
        whole = self._entry(address, info)
        if len(whole) + 1 <= budget:
            return [whole]
        held = self._parts.get(address)
        if held is None or held[0] is not info or held[1] != budget:
            held = self._parts[address] = (info, budget, feed.entry_parts(address, info,
                                                                           budget))
        return held[2]

    def _patch(self, address: str, held: ServerInfo, info: ServerInfo) -> bytes:
        made = self._patches.get(address)
        if made is None or made[0] is not held or made[1] is not info:
            made = self._patches[address] = (held, info, feed.patch(address, held, info))
        return made[2]

    def _budget(self, subscriber: Subscriber) -> int:
        return min(self.piece_bytes, subscriber.queue.max_message_size) - feed.OVERHEAD

    def _full(self, subscriber: Subscriber) -> feed.PieceSet | None:
        budget = self._budget(subscriber)
        key = (budget, subscriber.split)
        pieces = self._pieces.get(key)
        if pieces is None:
            table = self.tracked.values()
            for held in (self._entries, self._parts, self._patches):
                for address in [a for a in held if a not in table]:
                    del held[address]
            header = self.tracker_info().to_json()
            del header["serverTable"]
            try:
                pieces = feed.snapshot_pieces(
                    header, [e for a in sorted(table)
                             for e in self._encoded(a, table[a], budget, subscriber)], budget)
            except feed.PieceTooLarge as exc:
                self._too_large(subscriber, exc)
                return None
            self._pieces[key] = pieces
        return pieces

    def _delta(self, changes: dict[str, ServerInfo | None], budget: int,
               subscriber: Subscriber) -> feed.PieceSet | None:
        entries: list[bytes] = []
        patches: list[bytes] = []
        try:
            for address, info in sorted(changes.items()):
                if info is None:
                    continue
                held = subscriber.holds.get(address) if subscriber.patches else None
                if held is not None:
                    patch = self._patch(address, held, info)
                    if len(patch) + 1 <= budget:
                        patches.append(patch)
                        continue
                entries.extend(self._encoded(address, info, budget, subscriber))
            return feed.delta_pieces(
                self.version, entries,
                sorted(a for a, info in changes.items() if info is None), budget, patches)
        except feed.PieceTooLarge as exc:
            self._too_large(subscriber, exc)
            return None

    def _too_large(self, subscriber: Subscriber, exc: Exception | str) -> None:
        if subscriber.queue not in self.subscribers:
            return  # closed already
        log.warning("tracker %s: subscriber %s: %s", self.address, subscriber.queue.remote_id,
                    exc)
        self.unsubscribe(subscriber.queue)
        subscriber.queue.abort(f"a message exceeds the maximum message size: {exc}")

    # -- subscribers -------------------------------------------------------------------

    def subscribe(self, queue: MessageQueue, *, deltas: bool = False,
                  split: bool = False, patches: bool = False) -> None:
        """A ``track_sub``: a full snapshot now (again, if this is a resync); ``split``:
        it reads a ServerInfo larger than a piece in parts; ``patches``: a server it holds
        as a patch."""
        subscriber = self.subscribers.get(queue)
        if subscriber is None:
            subscriber = self.subscribers[queue] = Subscriber(queue, deltas, split, patches)
        subscriber.deltas = deltas
        subscriber.split = split
        subscriber.patches = patches
        subscriber.owe_full = True
        subscriber.pending.clear()
        self._flush(subscriber)

    def unsubscribe(self, queue: MessageQueue) -> None:
        self.subscribers.pop(queue, None)

    def _queue(self, subscriber: Subscriber, pieces: feed.PieceSet,
               changes: Mapping[str, ServerInfo | None] | None = None) -> None:
        """Queue a set: a delta of ``changes``, or (None) a full snapshot of the table."""
        subscriber.seq += 1
        subscriber.outbox.extend(pieces.numbered(subscriber.seq))
        if not subscriber.patches:
            return
        holds = subscriber.holds
        if changes is None:
            holds.clear()
            holds.update(self.tracked.values())
            return
        for address, info in changes.items():
            if info is None:
                holds.pop(address, None)
            else:
                holds[address] = info

    def _flush(self, subscriber: Subscriber) -> None:
        """Send what the subscriber is owed, as far as its queue takes it; the rest goes
        when it drains (:meth:`drained`)."""
        while True:
            outbox = subscriber.outbox
            while outbox:
                message = outbox[0]
                cmd = "track_delta" if message.startswith(b'{"cmd":"track_delta"') else "track_pub"
                outcome = send(subscriber.queue, message,
                               what=f"subscriber {subscriber.queue.remote_id}")
                if outcome is Sent.FULL:
                    return
                if outcome is Sent.GONE:
                    self.unsubscribe(subscriber.queue)
                    return
                self.count(cmd, len(message))
                outbox.popleft()
            if subscriber.owe_full:
                subscriber.owe_full = False
                subscriber.pending.clear()
                if not subscriber.deltas:
                    outbox.append(self.snapshot())
                    continue
                pieces = self._full(subscriber)
            elif subscriber.pending:
                changes, subscriber.pending = subscriber.pending, {}
                pieces = self._delta(changes, self._budget(subscriber), subscriber)
                if pieces is None:
                    return  # too large: that link is closed
                self._queue(subscriber, pieces, changes)
                continue
            else:
                return
            if pieces is None:
                return  # too large: that link is closed
            self._queue(subscriber, pieces)

    def drained(self, queue: MessageQueue) -> None:
        subscriber = self.subscribers.get(queue)
        if subscriber is not None:
            self._flush(subscriber)

    def close(self) -> None:
        self._scan_timer.cancel()
        for subscriber in list(self.subscribers.values()):
            subscriber.queue.close()
