"""A broker's tracking port: the server role, the tracker role, or both, on one rendezvous port.

Every message is one JSON object with a ``cmd``:

* ``{"cmd": "track_pub", "serverInfo": ..., "live": true}`` -- a server
  publishes *its own* ServerInfo to a tracker: when the link opens, on every
  change and every ``report_interval``.  ``"live": false`` on clean shutdown.
  After the first on a link, ``{"cmd": "track_pub", "live": true, "patch": {"base":
  B, "serverInfo": ..., "removed": [topic]}}``: what changed since the one of
  InfoVersion B it sent (:func:`.feed.patch_value`); a tracker that does not hold B
  refuses it (409, ``whole``) and the server sends the whole one.
* ``{"cmd": "track_sub", "deltas": true, "split": true, "patches": true}`` -- a client
  subscribes; the tracker answers at once with a full snapshot and then with what
  changed (:mod:`.feed`; ``split``: a ServerInfo larger than a piece comes in parts;
  ``patches``: a server it holds comes as the topics that changed).
  Without ``deltas``: zbus's full snapshot ``{"cmd": "track_pub", "trackerInfo":
  ...}`` on each change.
* ``{"cmd": "server_sub"}`` -- a client watches a server (a static server of
  its route table): ``{"cmd": "server", "serverInfo": ...}`` at once and
  after every change.
* ``{"cmd": "tracker"}`` and ``{"cmd": "server"}`` -- one-shot queries,
  answered with ``{"cmd": "tracker", "trackerInfo": ...}`` and
  ``{"cmd": "server", "serverInfo": ...}`` (with the request's ``seq``).

Other commands go to the node's extensions (:meth:`TrackNode.extend`: the
MQ server adds ``produce``, ``consume``, ``ack`` and the rest on the same
port, as zbus serves them).  Requests are served by the service protocol
(:mod:`brokermgr._service`): one that is not JSON closes that link with a
protocol error; one of the wrong shape gets the error envelope
``{"cmd": "error", "status": 400, "error": ..., "for": cmd}`` and the link stays.  Three
rules hold by construction: a server never
subscribes (it only publishes), it publishes only its own ServerInfo (a
tracker refuses a ``track_pub`` whose server is not the broker at the other
end of the link), and a tracker never forwards a ServerInfo to its own
trackers, so two brokers tracking each other cannot loop.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from channels import MessageQueue
from pump import ConfigError

from .._broker import Broker
from .._groups import GroupMember
from .._link import DEFAULT_RETRY
from .._liveness import DEFAULT_SCAN_INTERVAL
from .._rpc import ServiceSession
from .._service import (
    Call,
    Command,
    CommandTable,
    Fields,
    ReplyObject,
    ServiceError,
    Status,
    require_member,
)
from . import feed
from .client import DEFAULT_TRACK_PORT
from .info import ConsumeGroupInfo, ServerAddress, ServerInfo, TopicInfo, VersionCounter
from .server import DEFAULT_REPORT_INTERVAL, ServerRole
from .tracker import DEFAULT_SERVER_EXPIRY, TrackerRole

log = logging.getLogger("rdvpump.tracking")

ROLES = ("server", "tracker", "both")
#: The name a process's first tracker also answers to (``rdvpump routes --tracker HOST:PORT``).
TRACKER_ALIAS = "@tracker"


class Extension(Protocol):
    """More commands on a tracking port (the MQ server): ``handle`` gets each request
    whose ``cmd`` is in ``commands``, with the link it came on."""

    commands: frozenset[str]

    def handle(self, queue: MessageQueue, request: dict[str, Any]) -> None: ...
    def drained(self, queue: MessageQueue) -> None: ...
    def closed(self, queue: MessageQueue, reason: str) -> None: ...


@dataclass(frozen=True, slots=True)
class TrackPub:
    info: ServerInfo
    live: bool = True


@dataclass(frozen=True, slots=True)
class TrackSub:
    deltas: bool = False
    split: bool = False
    patches: bool = False


@dataclass(frozen=True, slots=True)
class ServerSub:
    pass


@dataclass(frozen=True, slots=True)
class TrackerQuery:
    pass


@dataclass(frozen=True, slots=True)
class ServerQuery:
    pass


def _track_pub(fields: Fields) -> TrackPub:
    return TrackPub(fields.parsed("serverInfo", ServerInfo.from_json),
                    fields.boolean("live", True))


def _track_sub(fields: Fields) -> TrackSub:
    return TrackSub(fields.boolean("deltas", False), fields.boolean("split", False),
                    fields.boolean("patches", False))


#: The commands of tracking itself.
TRACKING_COMMANDS = frozenset({"track_pub", "track_sub", "server_sub", "tracker", "server"})


class TrackNode:
    """A broker's tracking roles on one rendezvous port: server, tracker, or both.

    ``trackers`` are the addresses (``"broker:port"``) the server role
    publishes to.  ``state_dir`` keeps the InfoVersion epochs so versions
    keep increasing across restarts whatever the clock does (without it they
    start from the wall clock; `broker run` says so; see
    :class:`~.info.VersionCounter`).  :attr:`server` and :attr:`tracker` are
    the roles (None when not taken).  ``group`` is the server's place in a replicated
    group, published in its ServerInfo (route tables send writes to masters only).  Call
    :meth:`close` for a clean shutdown (trackers are told ``live: false``).
    """

    def __init__(self, broker: Broker, *, role: str = "both", port: int = DEFAULT_TRACK_PORT,
                 trackers: Iterable[str] = (), state_dir: str | os.PathLike[str] | None = None,
                 report_interval: float = DEFAULT_REPORT_INTERVAL,
                 expiry: float = DEFAULT_SERVER_EXPIRY,
                 scan_interval: float = DEFAULT_SCAN_INTERVAL,
                 retry: float = DEFAULT_RETRY, group: GroupMember | None = None) -> None:
        if role not in ROLES:
            raise ConfigError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
        for name, value in (("report_interval", report_interval), ("expiry", expiry),
                            ("scan_interval", scan_interval), ("retry", retry)):
            if not value > 0:
                raise ConfigError(f"{name} must be positive, got {value!r}")
        self.broker = broker
        self.pump = broker.pump
        self.role = role
        self.address = ServerAddress(f"{broker.id}:{port}",
                                     broker.manager.serves_tls)
        #: Messages by cmd this node sent and received (tests check the rules with these),
        #: and the bytes it sent by cmd.
        self.sent: dict[str, int] = {}
        self.sent_bytes: dict[str, int] = {}
        self.received: dict[str, int] = {}
        self.extensions: list[Extension] = []
        self._closed = False
        state = None if state_dir is None else Path(state_dir)

        def counter(kind: str) -> VersionCounter:
            return VersionCounter(None if state is None else state / f"{broker.id}.{kind}.epoch")

        self.server: ServerRole | None = None
        self.tracker: TrackerRole | None = None
        if role in ("server", "both"):
            self.server = ServerRole(broker, self.address, trackers,
                                     versions=counter("server"),
                                     report_interval=report_interval, retry=retry,
                                     changed=self._server_changed, count=self.count_sent,
                                     group=group)
        if role in ("tracker", "both"):
            self.tracker = TrackerRole(self.pump, broker.id, self.address,
                                       versions=counter("tracker"), expiry=expiry,
                                       scan_interval=scan_interval, count=self.count_sent)
        self.commands = CommandTable("tracking", {
            "track_pub": Command(self._parse_track_pub, self._track_pub),
            "track_sub": Command(_track_sub, self._track_sub),
            "server_sub": Command(lambda fields: ServerSub(), self._server_sub),
            "tracker": Command(lambda fields: TrackerQuery(), self._tracker_query),
            "server": Command(lambda fields: ServerQuery(), self._server_query),
        })
        assert self.commands.names == TRACKING_COMMANDS
        broker.listen(port, self)
        if self.server is not None:
            if self.tracker is not None:
                self.tracker.report_local(self.server.info, notify=False)
            self.server.start()

    def __repr__(self) -> str:
        return f"<TrackNode {self.address} role={self.role}>"

    @property
    def is_server(self) -> bool:
        return self.server is not None

    @property
    def is_tracker(self) -> bool:
        return self.tracker is not None

    def count_sent(self, cmd: str, nbytes: int = 0) -> None:
        self.sent[cmd] = self.sent.get(cmd, 0) + 1
        self.sent_bytes[cmd] = self.sent_bytes.get(cmd, 0) + nbytes

    def _server_changed(self, info: ServerInfo) -> None:
        if self.tracker is not None:  # a tracker tracks its own server too
            self.tracker.report_local(info)

    # -- the server role's API ---------------------------------------------------------

    def _require_server(self) -> ServerRole:
        if self.server is None:
            raise ConfigError(f"{self.address} is a tracker only; it serves no topics")
        return self.server

    @property
    def server_info(self) -> ServerInfo:
        return self._require_server().info

    def declare_topic(self, name: str, *, mask: int = 0, creator: str | None = None) -> TopicInfo:
        """Declare (or re-declare with a new mask) a topic; its default group is its name."""
        return self._require_server().declare_topic(name, mask=mask, creator=creator)

    def remove_topic(self, name: str) -> None:
        self._require_server().remove_topic(name)

    def declare_group(self, topic: str, group: str, *, mask: int = 0,
                      filter: str | None = None) -> ConsumeGroupInfo:
        return self._require_server().declare_group(topic, group, mask=mask, filter=filter)

    def remove_group(self, topic: str, group: str) -> None:
        self._require_server().remove_group(topic, group)

    def update_group(self, topic: str, group: str, *, message_count: int | None = None,
                     consumers: Iterable[str] | None = None) -> None:
        """New message count or consumer list of a group; the topic's totals follow."""
        self._require_server().update_group(topic, group, message_count=message_count,
                                            consumers=consumers)

    def extend(self, extension: Extension) -> None:
        """Serve ``extension.commands`` on this port too."""
        taken = set(TRACKING_COMMANDS).union(*(e.commands for e in self.extensions))
        if taken & extension.commands:
            raise ConfigError(f"commands already served on {self.address}: "
                             f"{sorted(taken & extension.commands)}")
        self.extensions.append(extension)

    # -- links -------------------------------------------------------------------------

    def accepted(self, queue: MessageQueue) -> None:
        queue.set_listener(_TrackerSession(self, queue))

    def close(self) -> None:
        """Clean shutdown: trackers hear ``live: false``, every tracking link closes."""
        if self._closed:
            return
        self._closed = True
        if self.server is not None:
            self.server.close()
        if self.tracker is not None:
            self.tracker.close()
        if self.address.port in self.broker.ports:
            self.broker.unbind(self.address.port)


    # -- the commands ----------------------------------------------------------------

    def _tracker_role(self) -> TrackerRole:
        if self.tracker is None:
            raise ServiceError(Status.BAD_REQUEST, f"{self.address} is not a tracker")
        return self.tracker

    def _server_role(self) -> ServerRole:
        if self.server is None:
            raise ServiceError(Status.BAD_REQUEST, f"{self.address} is not a server")
        return self.server

    def _parse_track_pub(self, fields: Fields) -> TrackPub:
        """:func:`_track_pub`, each topic the server reported unchanged since its last
        report taken from that report instead of parsed again."""
        tracker = self.tracker
        if tracker is None:
            return _track_pub(fields)

        def held_of(value: Any) -> ServerInfo | None:
            if isinstance(value, dict):
                try:
                    address = ServerAddress.from_json(value.get("serverAddress")).address
                except ValueError:
                    return None
                entry = tracker.tracked.get(address)
                return None if entry is None else entry.value
            return None

        def parse(value: Any) -> ServerInfo:
            return ServerInfo.from_json(value, previous=held_of(value))

        def parse_patch(value: Any) -> ServerInfo:
            info = value.get("serverInfo") if isinstance(value, dict) else None
            try:
                return feed.patched(held_of(info), value, "patch")
            except feed.PatchBase as exc:
                raise ServiceError(Status.CONFLICT, f"track_pub: {exc}: send the whole "
                                   "ServerInfo", whole=True) from None

        live = fields.boolean("live", True)
        if fields.obj.get("patch") is not None:
            return TrackPub(fields.parsed("patch", parse_patch), live)
        return TrackPub(fields.parsed("serverInfo", parse), live)

    def _track_pub(self, request: TrackPub, call: Call) -> ReplyObject | None:
        tracker, queue, info = self._tracker_role(), call.queue, request.info
        assert queue is not None
        if info.server_address.broker_id != queue.remote_id:
            # Only a server may speak for itself; nothing is cascaded.
            queue.protocol_error(f"broker {queue.remote_id!r} published the "
                                 f"ServerInfo of {info.server_address.address!r}")
            return None
        require_member(queue, queue.remote_id, cmd="track_pub", always=False)
        if info.server_address.address == self.address.address and self.is_server:
            raise ServiceError(Status.BAD_REQUEST,
                               "a server's own entry is not published to it")
        if request.live:
            tracker.report(info, queue)
        else:
            tracker.leave(info.server_address.address)
        return None

    def _track_sub(self, request: TrackSub, call: Call) -> ReplyObject | None:
        assert call.queue is not None
        self._tracker_role().subscribe(call.queue, deltas=request.deltas, split=request.split,
                                       patches=request.patches)
        return None

    def _server_sub(self, request: ServerSub, call: Call) -> ReplyObject | None:
        assert call.queue is not None
        self._server_role().watch(call.queue)
        return None

    def _tracker_query(self, request: TrackerQuery, call: Call) -> ReplyObject:
        return {"cmd": "tracker", "trackerInfo": self._tracker_role().tracker_info().to_json()}

    def _server_query(self, request: ServerQuery, call: Call) -> ReplyObject:
        return {"cmd": "server", "serverInfo": self._server_role().info.to_json()}


class _TrackerSession(ServiceSession):
    """One inbound link to a tracking broker: a publishing server, a subscriber or a query."""

    what = "tracking message"

    def __init__(self, node: TrackNode, queue: MessageQueue) -> None:
        super().__init__(queue, node.commands)
        self.node = node

    def handle(self, request: dict[str, Any]) -> None:
        cmd = request.get("cmd")
        received = self.node.received
        received[str(cmd)] = received.get(str(cmd), 0) + 1
        for extension in self.node.extensions:
            if cmd in extension.commands:
                extension.handle(self.queue, request)
                return
        super().handle(request)

    def reply(self, request: dict[str, Any], obj: dict[str, Any]) -> bool:
        self.node.count_sent(str(obj["cmd"]))
        sent = super().reply(request, obj)
        if not sent and self.node.tracker is not None:
            self.node.tracker.unsubscribe(self.queue)
        return sent

    def drained(self) -> None:
        if self.node.tracker is not None:
            self.node.tracker.drained(self.queue)
        if self.node.server is not None:
            self.node.server.drained(self.queue)
        for extension in self.node.extensions:
            extension.drained(self.queue)

    def closed(self, reason: str) -> None:
        for extension in self.node.extensions:
            extension.closed(self.queue, reason)
        if self.node.server is not None:
            self.node.server.unwatch(self.queue)
        tracker = self.node.tracker
        if tracker is not None:
            tracker.unsubscribe(self.queue)
            tracker.connection_lost(self.queue, reason)
