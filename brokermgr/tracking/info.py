"""What trackers track, as in zbus: server, tracker, topic and consume-group infos.

Carried as JSON with zbus's field names (camelCase, reference section 2,
"JSON shapes"), so a zbus 0.8/0.9 dump reads the same.  An address here is a
rendezvous address in the universe, ``"<broker id>:<port>"``: a server is
reached by connecting to that broker and port, through memory in one process
or through the name service across processes.

:class:`VersionCounter` makes InfoVersions that keep increasing across a
restart: an epoch in the high bits (persisted and bumped at every start, or
read from the wall clock when there is nowhere to persist it) and a counter
in the low bits.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pump import RdvpumpError
from rdv import BrokerPort

from .._groups import GroupMember

#: Topic mask bits (zbus 0.9's numbering; zbus changed them between versions).
MASK_MEMORY = 1
MASK_RPC = 2
MASK_PROXY = 4
MASK_PAUSE = 8
MASK_EXCLUSIVE = 16
MASK_DELETE_ON_EXIT = 32

#: How a ServerInfo goes on the wire: compact, keys sorted (the same info, the same bytes).
JSON_ENCODER = json.JSONEncoder(separators=(",", ":"), sort_keys=True)

#: Bits of an InfoVersion given to the counter; the epoch sits above them.
COUNTER_BITS = 32


class InfoError(RdvpumpError, ValueError):
    """A tracking message or field that does not have the expected shape."""


def _get(obj: dict[str, Any], key: str, kind: type | tuple[type, ...], default: Any = ...,
         where: str = "") -> Any:
    if key not in obj or obj[key] is None:
        if default is ...:
            raise InfoError(f"{where}: missing field {key!r}")
        return default
    value = obj[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise InfoError(f"{where}: field {key!r} must be {names}, got {value!r}")
    return value


def _object(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        raise InfoError(f"{where}: missing field")
    if not isinstance(value, dict):
        raise InfoError(f"{where}: expected a JSON object, got {type(value).__name__}")
    return value


def _int(obj: dict[str, Any], key: str, where: str, *, required: bool = False) -> int:
    value = _get(obj, key, int, ... if required else 0, where)
    if value < 0:
        raise InfoError(f"{where}: field {key!r} must not be negative, got {value}")
    return int(value)


@dataclass(frozen=True, order=True)
class ServerAddress:
    """Where a server (or tracker) is reached: ``"<broker id>:<port>"``, and whether over TLS."""

    address: str
    ssl_enabled: bool = False

    def __post_init__(self) -> None:
        _split(self.address)

    @property
    def broker_id(self) -> str:
        return _split(self.address)[0]

    @property
    def port(self) -> int:
        return _split(self.address)[1]

    def to_json(self) -> dict[str, Any]:
        return {"address": self.address, "sslEnabled": self.ssl_enabled}

    @classmethod
    def from_json(cls, value: Any, where: str = "serverAddress") -> ServerAddress:
        obj = _object(value, where)
        try:
            return cls(_get(obj, "address", str, where=where),
                       _get(obj, "sslEnabled", bool, False, where))
        except ValueError as exc:
            raise InfoError(f"{where}: {exc}") from None

    def __str__(self) -> str:
        return f"[SSL]{self.address}" if self.ssl_enabled else self.address


def _split(text: str) -> tuple[str, int]:
    """``"broker:port"`` to ``(broker, port)`` (rdv's one parser); ValueError otherwise."""
    return tuple(BrokerPort.parse(text))  # type: ignore[return-value]


@dataclass(frozen=True)
class ConsumeGroupInfo:
    topic_name: str
    group_name: str
    mask: int = 0
    filter: str | None = None
    message_count: int = 0
    consumer_count: int = 0
    consumer_list: tuple[str, ...] = ()
    creator: str | None = None
    created_time: int = 0
    last_updated_time: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"topicName": self.topic_name, "groupName": self.group_name, "mask": self.mask,
                "filter": self.filter, "messageCount": self.message_count,
                "consumerCount": self.consumer_count, "consumerList": list(self.consumer_list),
                "creator": self.creator, "createdTime": self.created_time,
                "lastUpdatedTime": self.last_updated_time}

    @classmethod
    def from_json(cls, value: Any, where: str = "consumeGroup") -> ConsumeGroupInfo:
        o = _object(value, where)
        consumers = _get(o, "consumerList", list, [], where)
        if not all(isinstance(c, str) for c in consumers):
            raise InfoError(f"{where}: consumerList must hold strings")
        return cls(_get(o, "topicName", str, where=where), _get(o, "groupName", str, where=where),
                   _int(o, "mask", where), _get(o, "filter", str, None, where),
                   _int(o, "messageCount", where), _int(o, "consumerCount", where),
                   tuple(consumers), _get(o, "creator", str, None, where),
                   _int(o, "createdTime", where), _int(o, "lastUpdatedTime", where))


@dataclass(frozen=True)
class TopicInfo:
    server_address: ServerAddress
    topic_name: str
    server_version: str = ""
    mask: int = 0
    message_depth: int = 0
    consumer_count: int = 0
    consume_group_list: tuple[ConsumeGroupInfo, ...] = ()
    creator: str | None = None
    created_time: int = 0
    last_updated_time: int = 0

    def group(self, name: str) -> ConsumeGroupInfo | None:
        for g in self.consume_group_list:
            if g.group_name == name:
                return g
        return None

    def to_json(self) -> dict[str, Any]:
        return {"serverAddress": self.server_address.to_json(),
                "serverVersion": self.server_version, "topicName": self.topic_name,
                "mask": self.mask, "messageDepth": self.message_depth,
                "consumerCount": self.consumer_count,
                "consumeGroupList": [g.to_json() for g in self.consume_group_list],
                "creator": self.creator, "createdTime": self.created_time,
                "lastUpdatedTime": self.last_updated_time}

    def entry(self, name: str) -> bytes:
        """``"name":{TopicInfo}`` as it stands in a ``topicTable`` (encoded once: a server
        reports every topic at every change, and most are as they were)."""
        held: tuple[str, bytes] | None = self.__dict__.get("_entry")
        if held is None or held[0] != name:
            held = (name, JSON_ENCODER.encode({name: self.to_json()})[1:-1].encode())
            object.__setattr__(self, "_entry", held)
        return held[1]

    @classmethod
    def from_json(cls, value: Any, where: str = "topic") -> TopicInfo:
        o = _object(value, where)
        name = _get(o, "topicName", str, where=where)
        groups = _get(o, "consumeGroupList", list, [], where)
        return cls(ServerAddress.from_json(o.get("serverAddress"), f"{where}.serverAddress"),
                   name, _get(o, "serverVersion", str, "", where), _int(o, "mask", where),
                   _int(o, "messageDepth", where), _int(o, "consumerCount", where),
                   tuple(ConsumeGroupInfo.from_json(g, f"{where}.consumeGroupList[{i}]")
                         for i, g in enumerate(groups)),
                   _get(o, "creator", str, None, where), _int(o, "createdTime", where),
                   _int(o, "lastUpdatedTime", where))


@dataclass(frozen=True)
class ServerInfo:
    """One server's own view of itself: its topics, versioned, and its place in a
    replicated group if it has one, with the records it holds over its topics (``group``
    and ``held``: not zbus fields; zbus ignores them)."""

    server_address: ServerAddress
    info_version: int
    server_version: str = ""
    tracker_list: tuple[ServerAddress, ...] = ()
    topic_table: dict[str, TopicInfo] = field(default_factory=dict)
    error: str | None = None
    group: GroupMember | None = None
    held: int | None = None

    def to_json(self) -> dict[str, Any]:
        obj = self.to_json_without_topics()
        obj["topicTable"] = {name: t.to_json() for name, t in self.topic_table.items()}
        return obj

    def encoded(self) -> bytes:
        """:meth:`to_json` as JSON bytes (compact, keys sorted), joined from each topic's
        own encoding (:meth:`TopicInfo.entry`, made once per topic)."""
        value = self.to_json_without_topics()
        head, _, tail = JSON_ENCODER.encode(value).encode().partition(b'"topicTable":{}')
        table = self.topic_table
        topics = b",".join(table[name].entry(name) for name in sorted(table))
        return head + b'"topicTable":{' + topics + b"}" + tail

    def with_topics(self, topics: dict[str, TopicInfo]) -> ServerInfo:
        """This info with ``topics`` as its topic table (``dataclasses.replace`` costs
        twice as much)."""
        return ServerInfo(self.server_address, self.info_version, self.server_version,
                          self.tracker_list, topics, self.error, self.group, self.held)

    def to_json_without_topics(self) -> dict[str, Any]:
        """:meth:`to_json` with an empty ``topicTable`` (one a JSON string cannot hold, so
        the only ``"topicTable":{}`` of its encoding)."""
        obj: dict[str, Any] = {
            "serverAddress": self.server_address.to_json(),
            "serverVersion": self.server_version, "error": self.error,
            "infoVersion": self.info_version,
            "trackerList": [t.to_json() for t in self.tracker_list], "topicTable": {}}
        if self.group is not None:
            obj["group"] = self.group.to_json()
        if self.held is not None:
            obj["held"] = self.held
        return obj

    @property
    def slave(self) -> bool:
        """A replicated group's slave: it takes no writes."""
        return self.group is not None and self.group.role == "slave"

    @classmethod
    def from_json(cls, value: Any, where: str = "serverInfo", *,
                  previous: ServerInfo | None = None) -> ServerInfo:
        """Parse and check a ServerInfo.

        ``previous``, the same server's ServerInfo held from before: a topic whose JSON
        is what that one's was reuses it instead of being parsed again (a server reports
        every topic on every change; usually one of them changed)."""
        o = _object(value, where)
        topics = _object(o.get("topicTable", {}), f"{where}.topicTable")
        known = {} if previous is None else previous.topic_table
        table = {}
        for name, t in topics.items():
            held = known.get(name)
            if held is not None and held.to_json() == t:
                table[name] = held  # as it was: its address included, so its server's
                continue
            info = TopicInfo.from_json(t, f"{where}.topicTable[{name!r}]")
            if info.topic_name != name:
                raise InfoError(f"{where}.topicTable[{name!r}] names topic {info.topic_name!r}")
            table[name] = info
        trackers = _get(o, "trackerList", list, [], where)
        group = None
        if o.get("group") is not None:
            try:
                group = GroupMember.from_json(o["group"])
            except ValueError as exc:
                raise InfoError(f"{where}.group: {exc}") from None
        return cls(ServerAddress.from_json(o.get("serverAddress"), f"{where}.serverAddress"),
                   _int(o, "infoVersion", where, required=True),
                   _get(o, "serverVersion", str, "", where),
                   tuple(ServerAddress.from_json(t, f"{where}.trackerList[{i}]")
                         for i, t in enumerate(trackers)),
                   table, _get(o, "error", str, None, where), group,
                   _int(o, "held", where) if o.get("held") is not None else None)


@dataclass(frozen=True)
class TrackerInfo:
    """A tracker's table of the servers it tracks (each one's own ServerInfo), versioned.

    The list of tracked servers is the keys of ``server_table`` (zbus's
    ``TrackedServerList`` does not exist on the wire either).
    """

    server_address: ServerAddress
    info_version: int
    server_version: str = ""
    server_table: dict[str, ServerInfo] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"serverAddress": self.server_address.to_json(),
                "serverVersion": self.server_version, "infoVersion": self.info_version,
                "serverTable": {k: s.to_json() for k, s in self.server_table.items()}}

    @classmethod
    def from_json(cls, value: Any, where: str = "trackerInfo", *,
                  known: Callable[[str], ServerInfo | None] | None = None) -> TrackerInfo:
        """Parse and check a TrackerInfo.

        ``known(address)`` may return a ServerInfo already held: an entry whose
        infoVersion is not higher reuses it instead of being parsed again (a
        tracker sends full snapshots; usually one server in them is new).
        """
        o = _object(value, where)
        servers = _object(o.get("serverTable", {}), f"{where}.serverTable")
        table = {}
        for key, s in servers.items():
            held = None if known is None else known(key)
            if held is not None and isinstance(s, dict):
                version = s.get("infoVersion")
                if (type(version) is int and version <= held.info_version
                        and s.get("serverAddress") == held.server_address.to_json()):
                    table[key] = held
                    continue
            info = ServerInfo.from_json(s, f"{where}.serverTable[{key!r}]")
            if info.server_address.address != key:
                raise InfoError(f"{where}.serverTable[{key!r}] holds server "
                                f"{info.server_address.address!r}")
            table[key] = info
        return cls(ServerAddress.from_json(o.get("serverAddress"), f"{where}.serverAddress"),
                   _int(o, "infoVersion", where, required=True),
                   _get(o, "serverVersion", str, "", where), table)


class VersionCounter:
    """InfoVersions that increase on every change and across restarts.

    ``epoch << 32 | counter``.  With ``path``, the epoch is read from that
    file, incremented and written back (atomically, fsynced) when the counter
    is created -- never below the wall clock's seconds, so a server that had
    run without a path does not go back either -- and every version of a
    later start is higher than every version of an earlier one whatever the
    clock does.  Without a path, the first version is the wall clock as a
    32.32 fixed-point number of seconds (zbus starts from the clock too):
    versions then keep increasing across a restart as long as the clock moves
    forward between the two starts and the earlier run made fewer than about
    4,300 changes per microsecond it ran -- they depend on the clock, and
    :class:`~.node.TrackNode` says so in a warning.  When the counter runs
    out the epoch is bumped.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, *,
                 clock: Callable[[], float] = time.time) -> None:
        self.path = None if path is None else Path(path)
        self._clock = clock
        if self.path is None:
            start = int(clock() * (1 << COUNTER_BITS))
            self.epoch, self.counter = start >> COUNTER_BITS, start & ((1 << COUNTER_BITS) - 1)
        else:
            self.epoch, self.counter = self._next_epoch(), 0

    def _next_epoch(self) -> int:
        assert self.path is not None
        epoch = 0
        if self.path.exists():
            text = self.path.read_text(encoding="ascii").strip()
            if not text.isdigit():
                raise InfoError(f"{self.path}: version state must be one integer, got {text!r}")
            epoch = int(text)
        epoch = max(epoch + 1, int(self._clock()) + 1)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
        try:
            with os.fdopen(fd, "w", encoding="ascii") as f:
                f.write(f"{epoch}\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return epoch

    @property
    def current(self) -> int:
        return self.epoch << COUNTER_BITS | self.counter

    def next(self) -> int:
        """A version higher than every one handed out before (in this and earlier runs)."""
        self.counter += 1
        if self.counter >> COUNTER_BITS:
            self.epoch = self._next_epoch() if self.path is not None else self.epoch + 1
            self.counter = 1
        return self.current
