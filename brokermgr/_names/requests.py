"""The name service's requests, each a frozen dataclass with its parser over the service
protocol's :class:`~brokermgr._service.Fields`; a registration as ``list`` shows it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rdv import Address

from .._groups import GroupMember, GroupProgress
from .._liveness import LivenessEntry
from .._service import Fields

#: The longest heartbeat interval a registration may state (a day).
MAX_HEARTBEAT = 86400.0


@dataclass(frozen=True)
class BrokerRecord:
    """What a broker registers: where it listens, the topics it serves, and its place in
    a replicated group if it has one."""

    broker_id: str
    address: Address
    topics: tuple[str, ...] = ()
    group: GroupMember | None = None
    progress: GroupProgress | None = None
    #: Its place in an MQ cluster: name, type, the root it follows, epoch, state version.
    cluster: tuple[tuple[str, Any], ...] | None = None
    #: Where its process serves Prometheus metrics (``HOST:PORT``), if it does.
    metrics: str | None = None
    #: Seconds between its heartbeats, as it says: how a reader tells a late one.
    heartbeat: float | None = None


@dataclass(frozen=True, slots=True)
class Registration:
    """One broker of a ``register`` (or ``heartbeat``) request."""

    record: BrokerRecord
    version: int = 0


@dataclass(frozen=True, slots=True)
class Register:
    brokers: tuple[Registration, ...]


@dataclass(frozen=True, slots=True)
class Unregister:
    ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Lookup:
    id: str


@dataclass(frozen=True, slots=True)
class ListBrokers:
    pass


@dataclass(frozen=True, slots=True)
class RouteQuery:
    topic: str


@dataclass(frozen=True, slots=True)
class GroupQuery:
    name: str


@dataclass(frozen=True, slots=True)
class Switch:
    group: str
    to: str


@dataclass(frozen=True, slots=True)
class Claim:
    group: str
    id: str
    epoch: int


def _registration(item: Any) -> Registration:
    broker_id = item["id"]
    if not isinstance(broker_id, str) or not broker_id:
        raise ValueError("its id must be a non-empty string")
    topics = item.get("topics", [])
    if not isinstance(topics, list) or not all(isinstance(t, str) for t in topics):
        raise ValueError("its topics must be a list of strings")
    version = item.get("version", 0)
    if type(version) is not int or version < 0:
        raise ValueError("its version must be a non-negative integer")
    group = None if item.get("group") is None else GroupMember.from_json(item["group"])
    progress = None if item.get("progress") is None else GroupProgress.from_json(
        item["progress"])
    metrics = item.get("metrics")
    if metrics is not None and (not isinstance(metrics, str) or len(metrics) > 300):
        raise ValueError("its metrics must be a HOST:PORT string")
    heartbeat = item.get("heartbeat")
    if heartbeat is not None and (type(heartbeat) not in (int, float)
                                  or not 0 < heartbeat <= MAX_HEARTBEAT):
        raise ValueError(f"its heartbeat must be seconds, more than 0 and at most "
                         f"{MAX_HEARTBEAT:g}")
    return Registration(BrokerRecord(broker_id, Address.of(item["address"]), tuple(topics),
                                     group, progress, _cluster(item.get("cluster")),
                                     metrics, None if heartbeat is None else float(heartbeat)),
                        version)


#: A cluster registration's fields and the types they take.
_CLUSTER_FIELDS = {"name": (str,), "type": (str,), "root": (str, type(None)), "epoch": (int,),
                   "version": (int,)}


def _cluster(value: Any) -> tuple[tuple[str, Any], ...] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != set(_CLUSTER_FIELDS):
        raise ValueError(f"its cluster must be an object of {', '.join(_CLUSTER_FIELDS)}")
    for key, types in _CLUSTER_FIELDS.items():
        if type(value[key]) not in types:
            raise ValueError(f"its cluster's {key} is not a {types[0].__name__}")
    return tuple((key, value[key]) for key in _CLUSTER_FIELDS)


def _broker_id(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError("not a non-empty string")
    return value


def parse_register(fields: Fields) -> Register:
    return Register(tuple(fields.items("brokers", _registration,
                                       what="a broker's id, address, version and topics")))


def parse_unregister(fields: Fields) -> Unregister:
    return Unregister(tuple(fields.items("ids", _broker_id, what="a broker id")))


def parse_lookup(fields: Fields) -> Lookup:
    return Lookup(fields.string("id"))


def parse_route(fields: Fields) -> RouteQuery:
    return RouteQuery(fields.string("topic"))


def parse_group(fields: Fields) -> GroupQuery:
    return GroupQuery(fields.string("name"))


def parse_switch(fields: Fields) -> Switch:
    return Switch(fields.string("group"), fields.string("to"))


def parse_claim(fields: Fields) -> Claim:
    return Claim(fields.string("group"), fields.string("id"),
                 fields.epoch("epoch", None, low=1))


def record_dict(entry: LivenessEntry[BrokerRecord], now: float) -> dict[str, object]:
    """A registration as the ``list`` reply carries it."""
    r = entry.value
    row: dict[str, object] = {
        "id": r.broker_id, "address": list(r.address), "version": entry.version,
        "topics": list(r.topics), "age": round(now - entry.since, 3),
        "since_heartbeat": round(now - entry.last_seen, 3)}
    if r.group is not None:
        row["group"] = r.group.to_json()
    if r.progress is not None:
        row["progress"] = r.progress.to_json()
    if r.cluster is not None:
        row["cluster"] = dict(r.cluster)
    if r.metrics is not None:
        row["metrics"] = r.metrics
    if r.heartbeat is not None:
        row["heartbeat"] = r.heartbeat
    return row
