"""Tracking on a broker: the MQ-server and tracker roles, and the client that builds routes.

Everything runs on the broker's pump and talks over the framework's own
message queues: a tracking broker listens on one rendezvous port (15555 by
default, zbus's port) and every message is one JSON object with a ``cmd``:

* ``{"cmd": "track_pub", "serverInfo": ..., "live": true}`` -- a server
  publishes *its own* ServerInfo to a tracker: when the link opens, on every
  change and every ``report_interval``.  ``"live": false`` on clean shutdown.
* ``{"cmd": "track_sub"}`` -- a client subscribes; the tracker answers at
  once with ``{"cmd": "track_pub", "trackerInfo": ...}`` and again on each
  change of its table (a full snapshot, as zbus).
* ``{"cmd": "tracker"}`` and ``{"cmd": "server"}`` -- one-shot queries,
  answered with ``{"cmd": "tracker", "trackerInfo": ...}`` and
  ``{"cmd": "server", "serverInfo": ...}``.

A request that is not JSON closes that link with a protocol error; a request
of the wrong shape gets ``{"cmd": "error", "status": 400, "error": ...}`` and
the link stays.  The rules of the notes hold by construction: a server never
subscribes (it only publishes), it publishes only its own ServerInfo (a
tracker refuses a ``track_pub`` whose server is not the broker at the other
end of the link), and a tracker never forwards a ServerInfo to its own
trackers, so two brokers tracking each other cannot loop.

Liveness (unlike zbus): a tracker drops a server at once when the link it
published over drops, and also when no report arrived within ``expiry``
(checked every ``scan_interval``), so a hung but connected server goes too.
"""

from __future__ import annotations

import json
import logging
import os
import ssl
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import trio

from channels import MessageQueue, MessageTooLargeError, QueueListener
from pump import Timer

from .._broker import Broker
from .._liveness import DEFAULT_SCAN_INTERVAL
from .info import (
    ConsumeGroupInfo,
    InfoError,
    ServerAddress,
    ServerInfo,
    TopicInfo,
    TrackerInfo,
    VersionCounter,
    parse_address,
)
from .routes import DEFAULT_VOTE_FACTOR, RouteChange, RouteTable
from .select import RoundRobin, Selector, all_servers

log = logging.getLogger("rdvpump.tracking")

DEFAULT_TRACK_PORT = 15555
DEFAULT_REPORT_INTERVAL = 30.0
#: Seconds without a report before a tracker drops a server (three report intervals).
DEFAULT_SERVER_EXPIRY = 90.0
DEFAULT_RETRY = 3.0
SERVER_VERSION = "rdvpump-tracking-1"
#: The name a process's first tracker also answers to (``rdvpump routes --tracker HOST:PORT``).
TRACKER_ALIAS = "@tracker"
ROLES = ("server", "tracker", "both")


def encode(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()


SENT, FULL, GONE = "sent", "full", "gone"


def _send(queue: MessageQueue, data: bytes, cmd: str, what: str) -> str:
    """Queue one message: SENT; FULL past the high-water mark (nothing queued, the
    queue calls ``drained()`` later); GONE if the link is closed or was closed here
    because the message can never fit."""
    try:
        queue.send(data)
        return SENT
    except MessageTooLargeError:
        # A snapshot too big for one message: this link cannot carry it; close it, loudly.
        log.warning("%s: a %s message of %d bytes exceeds the link's maximum message size",
                    what, cmd, len(data))
        queue.abort(f"a {cmd} message of {len(data)} bytes exceeds the maximum message size")
    except trio.WouldBlock:
        return FULL
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass  # closing already; its closed() follows
    return GONE


# ----------------------------------------------------------------------------------------
# the tracker's table, sans-I/O


@dataclass
class _Tracked:
    info: ServerInfo
    last_report: float
    connection: object


#: The connection of a tracker's own server (role "both"): never lost, never expires.
LOCAL = object()


class TrackedServers:
    """A tracker's servers: their latest ServerInfo, when they last reported, over which link."""

    def __init__(self, *, expiry: float = DEFAULT_SERVER_EXPIRY) -> None:
        if not expiry > 0:
            raise ValueError(f"expiry must be positive, got {expiry!r}")
        self.expiry = expiry
        self._servers: dict[str, _Tracked] = {}

    def __len__(self) -> int:
        return len(self._servers)

    def __contains__(self, address: object) -> bool:
        return address in self._servers

    def report(self, info: ServerInfo, *, now: float, connection: object) -> bool:
        """A server reported; True if the table changed (new server or newer info).

        Any report, even of a version already held, proves the server alive.
        """
        address = info.server_address.address
        held = self._servers.get(address)
        if held is None:
            self._servers[address] = _Tracked(info, now, connection)
            return True
        held.last_report = now
        held.connection = connection
        if info.info_version > held.info.info_version:
            held.info = info
            return True
        return False

    def remove(self, address: str) -> bool:
        return self._servers.pop(address, None) is not None

    def connection_lost(self, connection: object) -> list[str]:
        gone = [a for a, t in self._servers.items() if t.connection is connection]
        for address in gone:
            del self._servers[address]
        return gone

    def scan(self, now: float) -> list[str]:
        gone = [a for a, t in self._servers.items()
                if t.connection is not LOCAL and now - t.last_report > self.expiry]
        for address in gone:
            del self._servers[address]
        return gone

    def table(self) -> dict[str, ServerInfo]:
        return {a: t.info for a, t in sorted(self._servers.items())}

    def last_report(self, address: str) -> float | None:
        t = self._servers.get(address)
        return None if t is None else t.last_report


# ----------------------------------------------------------------------------------------
# the broker side: server and tracker roles


class TrackNode:
    """A broker's tracking roles on one rendezvous port: MQ server, tracker, or both.

    ``trackers`` are the addresses (``"broker:port"``) this server publishes
    to.  ``state_dir`` keeps the InfoVersion epochs so versions keep
    increasing across restarts (without it they start over; see
    :class:`VersionCounter`).  Call :meth:`close` for a clean shutdown
    (trackers are told ``live: false``).
    """

    def __init__(self, broker: Broker, *, role: str = "both", port: int = DEFAULT_TRACK_PORT,
                 trackers: Iterable[str] = (), state_dir: str | os.PathLike[str] | None = None,
                 report_interval: float = DEFAULT_REPORT_INTERVAL,
                 expiry: float = DEFAULT_SERVER_EXPIRY,
                 scan_interval: float = DEFAULT_SCAN_INTERVAL,
                 retry: float = DEFAULT_RETRY) -> None:
        if role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
        for name, value in (("report_interval", report_interval), ("expiry", expiry),
                            ("scan_interval", scan_interval), ("retry", retry)):
            if not value > 0:
                raise ValueError(f"{name} must be positive, got {value!r}")
        self.broker = broker
        self.pump = broker.pump
        self.role = role
        self.is_server = role in ("server", "both")
        self.is_tracker = role in ("tracker", "both")
        ssl_on = broker.manager.net.tls_server is not None
        self.address = ServerAddress(f"{broker.id}:{port}", ssl_on)
        self.report_interval = report_interval
        self.scan_interval = scan_interval
        self.retry = retry
        state = None if state_dir is None else Path(state_dir)
        self._server_versions = VersionCounter(
            None if state is None else state / f"{broker.id}.server.epoch")
        self._tracker_versions = VersionCounter(
            None if state is None else state / f"{broker.id}.tracker.epoch")
        self.topics: dict[str, TopicInfo] = {}
        self.tracked = TrackedServers(expiry=expiry)
        self.subscribers: list[_Session] = []
        self._snapshot: bytes | None = None
        self.publishers: list[_Publisher] = []
        #: Messages by cmd this node sent and received (tests check the rules with these).
        self.sent: dict[str, int] = {}
        self.received: dict[str, int] = {}
        self._closed = False
        self._scan_timer: Timer | None = None
        self._report_timer: Timer | None = None
        self.server_info = self._make_server_info([ServerAddress(t) for t in trackers])
        self.tracker_version = self._tracker_versions.next()
        broker.listen(port, self)
        if self.is_tracker:
            if self.is_server:
                self.tracked.report(self.server_info, now=self.pump.now(), connection=LOCAL)
            self._scan_timer = self.pump.call_later(scan_interval, self._scan)
        if self.is_server:
            for tracker in self.server_info.tracker_list:
                self.publishers.append(_Publisher(self, tracker))
            for publisher in self.publishers:
                publisher.connect()
            self._report_timer = self.pump.call_later(report_interval, self._report)

    def __repr__(self) -> str:
        return f"<TrackNode {self.address} role={self.role}>"

    # -- the server role: topics and consume groups ------------------------------------

    def _now_ms(self) -> int:
        return int(self.pump.now() * 1000)

    def _require_server(self) -> None:
        if not self.is_server:
            raise RuntimeError(f"{self.address} is a tracker only; it serves no topics")

    def declare_topic(self, name: str, *, mask: int = 0, creator: str | None = None) -> TopicInfo:
        """Declare (or re-declare with a new mask) a topic; its default group is its name."""
        self._require_server()
        if not isinstance(name, str) or not name:
            raise ValueError(f"a topic name must be a non-empty string, got {name!r}")
        now = self._now_ms()
        old = self.topics.get(name)
        if old is None:
            topic = TopicInfo(self.address, name, SERVER_VERSION, mask, 0, 0,
                              (ConsumeGroupInfo(name, name, created_time=now,
                                                last_updated_time=now),),
                              creator, now, now)
        else:
            topic = replace(old, mask=mask, last_updated_time=now)
        self.topics[name] = topic
        self._changed()
        return topic

    def remove_topic(self, name: str) -> None:
        self._require_server()
        if self.topics.pop(name, None) is None:
            raise KeyError(f"no topic {name!r} on {self.address}")
        self._changed()

    def declare_group(self, topic: str, group: str, *, mask: int = 0,
                      filter: str | None = None) -> ConsumeGroupInfo:
        self._require_server()
        info = self._topic(topic)
        if filter is not None and len(filter.encode()) > 127:
            raise ValueError("a group filter is at most 127 bytes")
        now = self._now_ms()
        old = info.group(group)
        new = ConsumeGroupInfo(topic, group, mask, filter, 0 if old is None else old.message_count,
                               0 if old is None else old.consumer_count,
                               () if old is None else old.consumer_list,
                               created_time=now if old is None else old.created_time,
                               last_updated_time=now)
        groups = tuple(g for g in info.consume_group_list if g.group_name != group) + (new,)
        self.topics[topic] = replace(info, consume_group_list=groups, last_updated_time=now)
        self._changed()
        return new

    def remove_group(self, topic: str, group: str) -> None:
        self._require_server()
        info = self._topic(topic)
        if info.group(group) is None:
            raise KeyError(f"topic {topic!r} on {self.address} has no group {group!r}")
        groups = tuple(g for g in info.consume_group_list if g.group_name != group)
        self.topics[topic] = replace(info, consume_group_list=groups,
                                     last_updated_time=self._now_ms())
        self._changed()

    def update_group(self, topic: str, group: str, *, message_count: int | None = None,
                     consumers: Iterable[str] | None = None) -> None:
        """New message count or consumer list of a group; the topic's totals follow."""
        self._require_server()
        info = self._topic(topic)
        old = info.group(group)
        if old is None:
            raise KeyError(f"topic {topic!r} on {self.address} has no group {group!r}")
        now = self._now_ms()
        new = replace(old, last_updated_time=now,
                      message_count=old.message_count if message_count is None else message_count,
                      consumer_list=old.consumer_list if consumers is None else tuple(consumers))
        new = replace(new, consumer_count=len(new.consumer_list))
        groups = tuple(new if g.group_name == group else g for g in info.consume_group_list)
        self.topics[topic] = replace(
            info, consume_group_list=groups, last_updated_time=now,
            message_depth=max((g.message_count for g in groups), default=0),
            consumer_count=sum(g.consumer_count for g in groups))
        self._changed()

    def _topic(self, name: str) -> TopicInfo:
        try:
            return self.topics[name]
        except KeyError:
            raise KeyError(f"no topic {name!r} on {self.address}") from None

    def _make_server_info(self, trackers: list[ServerAddress] | None = None) -> ServerInfo:
        return ServerInfo(self.address, self._server_versions.next(), SERVER_VERSION,
                          tuple(trackers if trackers is not None else
                                self.server_info.tracker_list),
                          dict(sorted(self.topics.items())))

    def _changed(self) -> None:
        """The server's ServerInfo changed: new version, published to trackers and, as its
        own tracker, to subscribers."""
        self.server_info = self._make_server_info()
        for publisher in self.publishers:
            publisher.publish()
        if self.is_tracker:
            self.tracked.report(self.server_info, now=self.pump.now(), connection=LOCAL)
            self._tracker_changed()

    def _report(self) -> None:
        for publisher in self.publishers:
            publisher.publish()
        self._report_timer = self.pump.call_later(self.report_interval, self._report)

    # -- the tracker role --------------------------------------------------------------

    def tracker_info(self) -> TrackerInfo:
        return TrackerInfo(self.address, self.tracker_version, SERVER_VERSION,
                           self.tracked.table())

    def _tracker_changed(self) -> None:
        self.tracker_version = self._tracker_versions.next()
        self._snapshot = None
        for session in list(self.subscribers):
            session.send_snapshot()

    def snapshot(self) -> bytes:
        """The current TrackerInfo as a ``track_pub`` message, encoded once per version."""
        if self._snapshot is None:
            self._snapshot = encode({"cmd": "track_pub",
                                     "trackerInfo": self.tracker_info().to_json()})
        return self._snapshot

    def _scan(self) -> None:
        gone = self.tracked.scan(self.pump.now())
        for address in gone:
            log.info("tracker %s: server %s expired: no report within %s s", self.address,
                     address, self.tracked.expiry)
            self.pump.emit("expire", broker=self.broker.id, peer=address)
        if gone:
            self._tracker_changed()
        self._scan_timer = self.pump.call_later(self.scan_interval, self._scan)

    # -- links -------------------------------------------------------------------------

    def accepted(self, queue: MessageQueue) -> None:
        queue.set_listener(_Session(self, queue))

    def _count(self, table: dict[str, int], cmd: str) -> None:
        table[cmd] = table.get(cmd, 0) + 1

    def close(self) -> None:
        """Clean shutdown: trackers hear ``live: false``, every tracking link closes."""
        if self._closed:
            return
        self._closed = True
        for timer in (self._scan_timer, self._report_timer):
            if timer is not None:
                timer.cancel()
        for publisher in self.publishers:
            publisher.close()
        for session in list(self.subscribers):
            session.queue.close()
        if self.broker.ports and self.address.port in self.broker.ports:
            self.broker.unbind(self.address.port)


class _Session(QueueListener):
    """One inbound link to a tracking broker: a publishing server, a subscriber or a query."""

    def __init__(self, node: TrackNode, queue: MessageQueue) -> None:
        self.node = node
        self.queue = queue
        #: A snapshot is owed: the last one did not fit under the high-water mark.
        self.behind = False

    def send(self, obj: dict[str, Any]) -> None:
        """A reply to a request; a client that does not read its replies is dropped."""
        cmd = str(obj["cmd"])
        self.node._count(self.node.sent, cmd)
        outcome = _send(self.queue, encode(obj), cmd, f"client {self.queue.remote_id}")
        if outcome == FULL:
            self.queue.abort("client does not read its replies")
        if outcome != SENT:
            self._leave()

    def send_snapshot(self) -> None:
        """The current TrackerInfo to a subscriber.  Snapshots are coalesced: while one
        is still queued past the high-water mark, the latest goes when it drains."""
        if self.behind:
            return
        self.node._count(self.node.sent, "track_pub")
        outcome = _send(self.queue, self.node.snapshot(), "track_pub",
                        f"subscriber {self.queue.remote_id}")
        if outcome == FULL:
            self.behind = True
        elif outcome == GONE:
            self._leave()

    def drained(self) -> None:
        if self.behind:
            self.behind = False
            self.send_snapshot()

    def received(self, message: bytes) -> None:
        try:
            request = json.loads(message)
            if not isinstance(request, dict):
                raise ValueError("not a JSON object")
        except (ValueError, RecursionError) as exc:
            self.queue.abort(f"protocol error: bad tracking message: {exc}")
            return
        cmd = request.get("cmd")
        self.node._count(self.node.received, str(cmd))
        try:
            self._handle(cmd, request)
        except (InfoError, ValueError) as exc:
            self.send({"cmd": "error", "status": 400, "error": str(exc)})

    def _handle(self, cmd: object, request: dict[str, Any]) -> None:
        node = self.node
        if cmd == "track_pub":
            if not node.is_tracker:
                raise ValueError(f"{node.address} is not a tracker")
            info = ServerInfo.from_json(request.get("serverInfo"))
            if info.server_address.broker_id != self.queue.remote_id:
                # Only a server may speak for itself; nothing is cascaded.
                self.queue.abort(f"protocol error: broker {self.queue.remote_id!r} published "
                                 f"the ServerInfo of {info.server_address.address!r}")
                return
            if info.server_address.address == node.address.address and node.is_server:
                raise ValueError("a server's own entry is not published to it")
            if request.get("live", True) is False:
                if node.tracked.remove(info.server_address.address):
                    node._tracker_changed()
                return
            if node.tracked.report(info, now=node.pump.now(), connection=self):
                node._tracker_changed()
        elif cmd == "track_sub":
            if not node.is_tracker:
                raise ValueError(f"{node.address} is not a tracker")
            if self not in node.subscribers:
                node.subscribers.append(self)
            self.send_snapshot()
        elif cmd == "tracker":
            if not node.is_tracker:
                raise ValueError(f"{node.address} is not a tracker")
            self.send({"cmd": "tracker", "trackerInfo": node.tracker_info().to_json()})
        elif cmd == "server":
            if not node.is_server:
                raise ValueError(f"{node.address} is not a server")
            self.send({"cmd": "server", "serverInfo": node.server_info.to_json()})
        else:
            raise ValueError(f"unknown cmd {cmd!r}")

    def _leave(self) -> None:
        if self in self.node.subscribers:
            self.node.subscribers.remove(self)

    def closed(self, reason: str) -> None:
        self._leave()
        gone = self.node.tracked.connection_lost(self)
        for address in gone:
            log.info("tracker %s: server %s dropped: its link closed (%s)", self.node.address,
                     address, reason)
            self.node.pump.emit("drop", broker=self.node.broker.id, peer=address, reason=reason)
        if gone:
            self.node._tracker_changed()


class _Outbound(QueueListener):
    """A link this broker dials and keeps: reconnect ``retry`` seconds after a loss."""

    def __init__(self, broker: Broker, address: ServerAddress, retry: float) -> None:
        self.broker = broker
        self.address = address
        self.retry = retry
        self.queue: MessageQueue | None = None
        self.last_refusal: str | None = None
        self.connects = 0
        self._timer: Timer | None = None
        self._closing = False
        self._attempted = trio.Event()

    async def attempted(self) -> None:
        """Wait for the outcome of the next connect attempt (connected or refused)."""
        await self._attempted.wait()

    def _outcome(self) -> None:
        self._attempted.set()
        self._attempted = trio.Event()

    def connect(self) -> None:
        if self._closing or self.broker.closed:
            return
        self._timer = None
        broker_id, port = parse_address(self.address.address)
        self.broker.connect(broker_id, port, self)

    def connected(self, queue: MessageQueue) -> None:
        if self._closing:
            queue.close()
            return
        self.queue = queue
        self.connects += 1
        self.last_refusal = None
        queue.set_listener(self)
        self.opened()
        self._outcome()

    def refused(self, reason: str) -> None:
        self.last_refusal = reason
        self._outcome()
        self._again(reason)

    def closed(self, reason: str) -> None:
        self.queue = None
        self.lost(reason)
        self._again(reason)

    def _again(self, reason: str) -> None:
        if self._closing or self.broker.closed:
            return
        log.info("%s: %s; again in %s s", self.address, reason, self.retry)
        self._timer = self.broker.pump.call_later(self.retry, self.connect)

    def close(self) -> None:
        self._closing = True
        if self._timer is not None:
            self._timer.cancel()
        if self.queue is not None:
            self.goodbye(self.queue)
            self.queue.close()

    def send(self, obj: dict[str, Any]) -> str:
        if self.queue is None:
            return GONE
        cmd = str(obj["cmd"])
        return _send(self.queue, encode(obj), cmd, f"tracking peer {self.address}")

    def _reply(self, message: bytes, what: str) -> dict[str, Any] | None:
        """A reply as a JSON object; None when it was an error reply (logged) or
        malformed (the link is closed with the reason)."""
        try:
            reply = json.loads(message)
            if not isinstance(reply, dict):
                raise InfoError("not a JSON object")
        except (ValueError, RecursionError) as exc:
            self._bad(what, exc)
            return None
        if reply.get("cmd") == "error":
            log.warning("%s: %s", self.address, reply.get("error"))
            return None
        return reply

    def _bad(self, what: str, exc: BaseException) -> None:
        if self.queue is not None:
            self.queue.abort(f"protocol error: bad {what}: {exc}")

    # for subclasses
    def opened(self) -> None: ...

    def lost(self, reason: str) -> None: ...

    def goodbye(self, queue: MessageQueue) -> None: ...


class _Publisher(_Outbound):
    """A server's link to one of its trackers: ``track_pub`` of its own ServerInfo only."""

    def __init__(self, node: TrackNode, tracker: ServerAddress) -> None:
        super().__init__(node.broker, tracker, node.retry)
        self.node = node
        self.behind = False

    def opened(self) -> None:
        self.behind = False
        self.publish()

    def publish(self, live: bool = True) -> None:
        """Our ServerInfo to the tracker; coalesced like snapshots (the latest wins)."""
        if self.queue is not None and not self.behind:
            self.node._count(self.node.sent, "track_pub")
            outcome = self.send({"cmd": "track_pub", "live": live,
                                 "serverInfo": self.node.server_info.to_json()})
            self.behind = outcome == FULL

    def drained(self) -> None:
        if self.behind:
            self.behind = False
            self.publish()

    def goodbye(self, queue: MessageQueue) -> None:
        self.publish(live=False)

    def received(self, message: bytes) -> None:
        try:
            reply = json.loads(message)
        except ValueError:
            reply = None
        if isinstance(reply, dict) and reply.get("cmd") == "error":
            log.warning("tracker %s refused our report: %s", self.address, reply.get("error"))
        elif self.queue is not None:
            self.queue.abort("protocol error: a tracker sent a publisher something unexpected")


# ----------------------------------------------------------------------------------------
# the client side


class RouteClient:
    """A client's route table, fed by trackers (dynamic) and static servers.

    ``add_tracker(address)`` subscribes to a tracker (``track_sub``) and merges
    each TrackerInfo; when the link drops the tracker's votes go
    (``remove_tracker``) and it is dialled again every ``retry`` seconds.
    ``add_server(address)`` pins a server and fetches its ServerInfo over a
    link of its own.  ``on_change(change)`` callbacks run after every update
    that changed something; ``await changed()`` waits for the next one.
    """

    def __init__(self, broker: Broker, *, vote_factor: float = DEFAULT_VOTE_FACTOR,
                 retry: float = DEFAULT_RETRY) -> None:
        if not retry > 0:
            raise ValueError(f"retry must be positive, got {retry!r}")
        self.broker = broker
        self.retry = retry
        self.routes = RouteTable(vote_factor=vote_factor)
        self.trackers: dict[str, _Subscription] = {}
        self.servers: dict[str, _ServerQuery] = {}
        self.ssl_cert_files: dict[str, str] = {}
        self.callbacks: list[Callable[[RouteChange], object]] = []
        self._event = trio.Event()

    # -- the API of the notes ----------------------------------------------------------

    def add_tracker(self, address: str) -> None:
        """Track the servers ``address`` tracks (dynamic routes)."""
        if address in self.trackers:
            return
        sub = _Subscription(self, ServerAddress(address))
        self.trackers[address] = sub
        sub.connect()

    def remove_tracker(self, address: str) -> None:
        sub = self.trackers.pop(address, None)
        if sub is not None:
            sub.close()
            self._apply(self.routes.remove_tracker(address))

    def add_server(self, address: str) -> None:
        """Route to ``address`` whatever the trackers say (static routes)."""
        if address in self.servers:
            return
        query = _ServerQuery(self, ServerAddress(address))
        self.servers[address] = query
        query.connect()

    def remove_server(self, address: str) -> None:
        query = self.servers.pop(address, None)
        if query is not None:
            query.close()
        self._apply(self.routes.remove_server(address))

    def add_ssl_cert_file(self, address: str, cert_file: str | os.PathLike[str]) -> None:
        """Reach the server at ``address`` over TLS, trusting the certificate(s) in
        ``cert_file`` (PEM; a CA or the server's own certificate).

        Every link this process dials to that broker then uses TLS checked
        against that file; no client certificate is presented on those links.
        """
        broker_id, _ = parse_address(address)
        path = os.fspath(cert_file)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"certificate file {path!r} does not exist")
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=path)
        self.broker.manager.net.tls_for[broker_id] = context
        self.ssl_cert_files[address] = path

    # -- selection ---------------------------------------------------------------------

    def select(self, topic: str, selector: Selector, key: bytes | str | None = None
               ) -> list[str]:
        return selector(self.routes, topic, key)

    def on_change(self, callback: Callable[[RouteChange], object]) -> None:
        self.callbacks.append(callback)

    async def changed(self) -> None:
        """Wait for the next change of the route table (or a fresh TrackerInfo)."""
        await self._event.wait()

    def close(self) -> None:
        for sub in self.trackers.values():
            sub.close()
        for query in self.servers.values():
            query.close()

    # -- internals ---------------------------------------------------------------------

    def _apply(self, change: RouteChange, *, notify: bool = False) -> None:
        """Run the callbacks if the table changed; wake ``changed()`` waiters if it did
        or ``notify`` (a fresh TrackerInfo that changed nothing)."""
        if change:
            for callback in list(self.callbacks):
                callback(change)
        if change or notify:
            self._event.set()
            self._event = trio.Event()


class _Subscription(_Outbound):
    """A client's ``track_sub`` link to one tracker."""

    def __init__(self, client: RouteClient, tracker: ServerAddress) -> None:
        super().__init__(client.broker, tracker, client.retry)
        self.client = client

    def opened(self) -> None:
        self.send({"cmd": "track_sub"})

    def received(self, message: bytes) -> None:
        reply = self._reply(message, "TrackerInfo")
        if reply is None:
            return
        try:
            info = TrackerInfo.from_json(reply.get("trackerInfo"),
                                         known=self.client.routes.server_table.get)
        except (ValueError, RecursionError) as exc:
            self._bad("TrackerInfo", exc)
            return
        change = self.client.routes.update_tracker(self.address.address, info)
        self.client._apply(change, notify=not change.stale)

    def lost(self, reason: str) -> None:
        self.client._apply(self.client.routes.remove_tracker(self.address.address))


class _ServerQuery(_Outbound):
    """A client's link to a static server: its ServerInfo on every (re)connect."""

    def __init__(self, client: RouteClient, server: ServerAddress) -> None:
        super().__init__(client.broker, server, client.retry)
        self.client = client

    def opened(self) -> None:
        self.send({"cmd": "server"})

    def received(self, message: bytes) -> None:
        reply = self._reply(message, "ServerInfo")
        if reply is None:
            return
        try:
            info = ServerInfo.from_json(reply.get("serverInfo"))
            if info.server_address.address != self.address.address:
                raise InfoError(f"asked {self.address.address}, got the ServerInfo of "
                                f"{info.server_address.address}")
        except (ValueError, RecursionError) as exc:
            self._bad("ServerInfo", exc)
            return
        if self.address.address in self.client.servers:
            self.client._apply(self.client.routes.update_server(info, static=True))


class Producer:
    """The routing half of a producer: which server(s) a message for ``topic`` goes to.

    ``selector`` defaults to zbus's producer rule (:class:`RoundRobin`).
    """

    def __init__(self, client: RouteClient, topic: str, selector: Selector | None = None
                 ) -> None:
        self.client = client
        self.topic = topic
        self.selector: Selector = selector if selector is not None else RoundRobin()

    def servers(self, key: bytes | str | None = None) -> list[str]:
        return self.client.select(self.topic, self.selector, key)


class Consumer(Producer):
    """The routing half of a consumer: the servers to consume ``topic`` from (default: all)."""

    def __init__(self, client: RouteClient, topic: str, selector: Selector | None = None
                 ) -> None:
        super().__init__(client, topic, selector if selector is not None else all_servers)
