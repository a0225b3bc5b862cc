r"""The name service: a BrokerManager served to other processes, like RocketMQ's NameServer.

The service is a broker (``@manager``) listening on rendezvous port 0; clients
reach it through the same handshake (universe and token) and message queues as
any link.  It speaks the service protocol (:mod:`._service`): ``register`` and
``heartbeat`` (the same: a list of brokers), ``unregister``, ``lookup`` and
``list``; the client's links to managers are reconnecting links (:mod:`._link`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from channels import MessageQueue
from pump import ConfigError, Repeating
from pump.schema import Kind
from rdv import Address, RdvNode

from ._broker import DEFAULT_CLOSE_TIMEOUT, BrokerManager, wait_all_sent
from ._groups import STALE_EPOCH, GroupMember, GroupProgress, GroupTables
from ._link import Outcome, ReconnectingLink
from ._liveness import DEFAULT_SCAN_INTERVAL, LivenessEntry, LivenessTable
from ._rpc import ServiceSession
from ._service import Call, Command, CommandTable, Fields, ReplyObject, ServiceError, Status

log = logging.getLogger("rdvpump.names")

MANAGER_ID = "@manager"
#: A manager's refusal of a second live registration of one broker id.
DUPLICATE_ID = "duplicate id"
NAME_PORT = 0
#: Default TCP port of a manager, as RocketMQ's NameServer.
DEFAULT_MANAGER_PORT = 9876
#: Seconds between a broker's registrations (heartbeats), as RocketMQ's brokers.
DEFAULT_HEARTBEAT = 30.0
#: Seconds without a heartbeat before the name service drops a broker, as RocketMQ's.
DEFAULT_BROKER_EXPIRY = 120.0
DEFAULT_LOOKUP_TIMEOUT = 5.0


@dataclass(frozen=True)
class BrokerRecord:
    """What a broker registers: where it listens, the topics it serves, and its place in
    a replicated group if it has one."""

    broker_id: str
    address: Address
    topics: tuple[str, ...] = ()
    group: GroupMember | None = None
    progress: GroupProgress | None = None


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
    return Registration(BrokerRecord(broker_id, Address.of(item["address"]), tuple(topics),
                                     group, progress), version)


def _broker_id(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError("not a non-empty string")
    return value


def _register(fields: Fields) -> Register:
    return Register(tuple(fields.items("brokers", _registration,
                                       what="a broker's id, address, version and topics")))


def _unregister(fields: Fields) -> Unregister:
    return Unregister(tuple(fields.items("ids", _broker_id, what="a broker id")))


def _lookup(fields: Fields) -> Lookup:
    return Lookup(fields.string("id"))


def _route(fields: Fields) -> RouteQuery:
    return RouteQuery(fields.string("topic"))


def _group(fields: Fields) -> GroupQuery:
    return GroupQuery(fields.string("name"))


def _switch(fields: Fields) -> Switch:
    return Switch(fields.string("group"), fields.string("to"))


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
    return row


class NameService:
    """Serves a universe's directory: register, heartbeat, unregister, lookup, list, and
    the routes of replicated groups (``route``, :mod:`._groups`).

    A broker is dropped at once when the connection it registered over drops,
    and otherwise when no heartbeat came within ``expiry`` (checked every
    ``scan_interval``).
    """

    def __init__(self, manager: BrokerManager, *, expiry: float = DEFAULT_BROKER_EXPIRY,
                 scan_interval: float = DEFAULT_SCAN_INTERVAL) -> None:
        if not scan_interval > 0:
            raise ConfigError(f"scan interval must be positive, got {scan_interval!r}")
        self.manager = manager
        self.pump = manager.pump
        self.table: LivenessTable[BrokerRecord] = LivenessTable(expiry=expiry)
        self.groups = GroupTables()
        self.scan_interval = scan_interval
        self.commands = CommandTable("name-service", {
            "register": Command(_register, self._register),
            "heartbeat": Command(_register, self._register),
            "unregister": Command(_unregister, self._unregister),
            "lookup": Command(_lookup, self._lookup),
            "list": Command(lambda fields: ListBrokers(), self._list),
            "route": Command(_route, self._route),
            "group": Command(_group, self._group),
            "failover": Command(_switch, self._switch),
        })
        self.broker = manager.add_broker(MANAGER_ID)
        self.broker.listen(NAME_PORT, self)
        self._scan_timer = self.pump.call_every(scan_interval, self._scan)

    def accepted(self, queue: MessageQueue) -> None:
        queue.set_listener(_NameServiceSession(self, queue))

    # -- the commands: the connection a broker registered over is the link's queue --------

    def _register(self, request: Register, call: Call) -> ReplyObject:
        refused = []
        fenced = []
        now = self.pump.now()
        for registration in request.brokers:
            record = registration.record
            held = self.table.get(record.broker_id)
            if held is not None and held.connection is not call.queue:
                # another live registration: its connection is open (a crashed
                # process's closed with it, which dropped its brokers at once)
                log.warning("refused a second registration of broker %s: it is held "
                            "by %s", record.broker_id, held.value.address)
                refused.append({"id": record.broker_id, "held_by": list(held.value.address)})
                continue
            why = None if record.group is None else self.groups.refusal(record.broker_id,
                                                                        record.group)
            if why is not None:
                log.warning("refused the registration of broker %s: %s", record.broker_id,
                            why)
                fenced.append(why)
                continue
            self.table.report(record.broker_id, record, now=now,
                              version=registration.version, connection=call.queue)
            if record.group is not None:
                self.groups.update(record.broker_id, record.address, record.group,
                                   record.topics, registration.version, record.progress)
            elif held is not None and held.value.group is not None:
                self._forget(record.broker_id)
        if refused:
            held_by = ", ".join(f"{b['id']} (held by {Address.of(b['held_by'])})"
                                for b in refused)
            raise ServiceError(Status.CONFLICT, f"{DUPLICATE_ID}: {held_by}",
                               refused=DUPLICATE_ID, brokers=refused)
        if fenced:
            raise ServiceError(Status.CONFLICT, "; ".join(fenced), refused=STALE_EPOCH)
        return {"cmd": "registered", "count": len(request.brokers)}

    def _unregister(self, request: Unregister, call: Call) -> ReplyObject:
        for broker_id in request.ids:  # only what this connection registered
            held = self.table.get(broker_id)
            if held is not None and held.connection is call.queue:
                self.table.remove(broker_id)
                self._forget(broker_id)
        return {"cmd": "unregistered"}

    def _lookup(self, request: Lookup, call: Call) -> ReplyObject:
        entry = self.table.get(request.id)
        return {"cmd": "address", "id": request.id,
                "address": None if entry is None else list(entry.value.address)}

    def _list(self, request: ListBrokers, call: Call) -> ReplyObject:
        now = self.pump.now()
        return {"cmd": "brokers", "universe": self.manager.name,
                "brokers": [record_dict(e, now) for e in self.table.entries()]}

    def _route(self, request: RouteQuery, call: Call) -> ReplyObject:
        """The groups serving a topic, each with its cluster, newest epoch, permission,
        master and members; a 404 with the reason when no group serves it."""
        try:
            return {"cmd": "route", **self.groups.route(request.topic)}
        except LookupError as exc:
            raise ServiceError(Status.NOT_FOUND, str(exc)) from None

    def _group(self, request: GroupQuery, call: Call) -> ReplyObject:
        """A replicated group: cluster, newest epoch, permission, master and members (a
        group no live broker registered has no members and no master)."""
        return {"cmd": "group", "name": request.name, **self.groups.group(request.name)}

    def _switch(self, request: Switch, call: Call) -> ReplyObject:
        """A failover by hand (``rdvpump mq failover``): the member ``to`` is the group's
        master at the next epoch; the members follow (the old master steps down)."""
        try:
            epoch = self.groups.switch(request.group, request.to)
        except LookupError as exc:
            raise ServiceError(Status.NOT_FOUND, str(exc)) from None
        except ValueError as exc:
            raise ServiceError(Status.CONFLICT, str(exc)) from None
        log.warning("group %s: failover by hand to %s at epoch %d", request.group,
                    request.to, epoch)
        return {"cmd": "failover", "name": request.group, **self.groups.group(request.group)}

    def connection_lost(self, queue: MessageQueue, reason: str) -> None:
        for broker_id in self.table.connection_lost(queue):
            self._forget(broker_id)
            log.info("broker %s dropped: its connection closed (%s)", broker_id, reason)
            self.pump.emit(Kind.DROP, broker=broker_id, reason=reason)

    def _scan(self) -> None:
        for broker_id in self.table.scan(self.pump.now()):
            self._forget(broker_id)
            log.info("broker %s expired: no heartbeat within %s s", broker_id, self.table.expiry)
            self.pump.emit(Kind.EXPIRE, broker=broker_id)

    def _forget(self, broker_id: str) -> None:
        """A broker left: its group's tables follow (a failover, when it was the
        master: logged)."""
        said = self.groups.forget(broker_id)
        if said is not None:
            log.warning("%s", said)

    def close(self) -> None:
        self._scan_timer.cancel()
        self.broker.close("name service closed")

    async def aclose(self, timeout: float = DEFAULT_CLOSE_TIMEOUT) -> None:
        """:meth:`close`, then wait (up to ``timeout``) until every client's link has ended
        here, so that the manager's process may end without its brokers taking it for a
        crash."""
        self._scan_timer.cancel()
        await self.broker.aclose("name service closed", timeout=timeout)


class _NameServiceSession(ServiceSession):
    """One client connection to the name service."""

    what = "name-service request"

    def __init__(self, service: NameService, queue: MessageQueue) -> None:
        super().__init__(queue, service.commands)
        self.service = service

    def closed(self, reason: str) -> None:
        self.service.connection_lost(self.queue, reason)


#: The longest back-off between dials of a manager that cannot be reached: a manager
#: that restarts has its brokers registered again within about this long of listening.
DEFAULT_NAME_RETRY = 0.2


class NameClient:
    """A process's link to one or more managers of its universe.

    Registers the process's brokers with every manager, heartbeats, registers
    again at once when a manager's connection drops (a restarted manager
    relearns us immediately: dialling again at once, then backing off up to
    ``retry``, by default :data:`DEFAULT_NAME_RETRY`), and answers the universe's resolver: each
    manager in turn is asked where a broker lives (managers may disagree; the
    first that knows wins).
    """

    def __init__(self, manager: BrokerManager, managers: list[Address], *,
                 heartbeat: float = DEFAULT_HEARTBEAT, retry: float = DEFAULT_NAME_RETRY,
                 lookup_timeout: float = DEFAULT_LOOKUP_TIMEOUT, version: int = 0,
                 topics: Callable[[str], tuple[str, ...]] | None = None,
                 groups: Callable[[str], GroupMember | None] | None = None,
                 progress: Callable[[str], GroupProgress | None] | None = None,
                 on_refused: Callable[[str, str], None] | None = None) -> None:
        if not managers:
            raise ConfigError("a name client needs at least one manager address")
        if not heartbeat > 0 or not retry > 0:
            raise ConfigError("heartbeat and retry intervals must be positive")
        self.manager = manager
        self.pump = manager.pump
        self.heartbeat = heartbeat
        self.retry = retry
        self.lookup_timeout = lookup_timeout
        self.version = version
        self.topics = topics or (lambda broker_id: ())
        #: Each broker's place in a replicated group, registered with it (None: none).
        self.groups = groups or (lambda broker_id: None)
        #: How far each broker's copy is, registered with it (None: not said).
        self.progress = progress or (lambda broker_id: None)
        self.on_refused = on_refused
        #: The rendezvous the links to managers are dialled from.
        # named by the process and its brokers, so a manager's log says whose connect it
        # refused
        mine = "+".join(b for b in manager.broker_ids if not b.startswith("@"))[:100]
        self.rdv = RdvNode(self.pump, f"@names.{os.getpid()}" + (f".{mine}" if mine else ""),
                           manager.channels,
                           lambda _id: None, owner=_NoOwner(), network=manager.net)
        self.links = [_ManagerLink(self, address) for address in managers]
        manager.resolver.add_source(self)

    @property
    def cache(self) -> dict[str, Address]:
        """Addresses learnt from managers (the universe's resolver keeps them)."""
        return self.manager.resolver.cache

    def register_now(self) -> None:
        """Register with every connected manager now (a role changed), not at the next
        heartbeat."""
        for link in self.links:
            if link.queue is not None:
                link.beat()

    def refused(self, link: Any, reason: str) -> None:
        """A manager refused a registration for good (``duplicate id``): ``on_refused``
        decides (``broker run`` ends with the reason), else it is logged."""
        if self.on_refused is not None:
            self.on_refused(link.name, reason)
        else:
            log.error("%s refused a registration: %s", link.name, reason)

    def start(self) -> None:
        """Connect to every manager (the network must be served already)."""
        for link in self.links:
            link.connect()

    def registrations(self) -> list[dict[str, Any]]:
        address = self.manager.net.address
        if address is None:
            return []
        found = []
        for b in self.manager.broker_ids:
            if not b.startswith("@"):
                row: dict[str, Any] = {"id": b, "address": list(address),
                                       "version": self.version, "topics": list(self.topics(b))}
                if (member := self.groups(b)) is not None:
                    row["group"] = member.to_json()
                if (progress := self.progress(b)) is not None:
                    row["progress"] = progress.to_json()
                found.append(row)
        return found

    async def lookup(self, broker_id: str) -> Address | None:
        """Where ``broker_id`` listens, per the first manager that knows it (a resolver
        source: the resolver caches the answer)."""
        for reply in await self._ask({"cmd": "lookup", "id": broker_id}):
            if reply.get("address") is not None:
                return Address.of(reply["address"])
        return None

    async def list(self) -> list[dict[str, Any]] | None:
        """The brokers registered with the first manager that answers; None if none does."""
        for reply in await self._ask({"cmd": "list"}, first=True):
            return list(reply["brokers"])
        return None

    async def group(self, name: str) -> dict[str, Any]:
        """A replicated group as the first connected manager knows it (see
        :meth:`NameService._group`); :class:`ServiceError` when none answers."""
        return await self._answer({"cmd": "group", "name": name})

    async def failover(self, group: str, to: str) -> dict[str, Any]:
        """Make member ``to`` (broker id or member id) the group's master (see
        :meth:`NameService._switch`); the group afterwards."""
        return await self._answer({"cmd": "failover", "group": group, "to": to})

    async def route(self, topic: str) -> dict[str, Any]:
        """The groups serving ``topic`` (see :meth:`NameService._route`), per the first
        manager that knows a route; :class:`ServiceError` (404 with the reason, or the
        last manager's error) when none does."""
        return await self._answer({"cmd": "route", "topic": topic})

    async def _answer(self, request: dict[str, Any]) -> dict[str, Any]:
        """The reply of the first connected manager that answers ``request`` without an
        error; the last error otherwise."""
        last: ServiceError | None = None
        for link in self.links:
            if link.queue is None:
                continue
            try:
                return await link.call(request, timeout=self.lookup_timeout)
            except ServiceError as exc:
                last = exc
        raise last or ServiceError(Status.NO_REPLY, "no manager is connected")

    async def _ask(self, request: dict[str, Any], *, first: bool = False
                   ) -> tuple[ReplyObject, ...]:
        """The replies of the connected managers, in order (only the first that answers
        when ``first``); a manager that is not connected, or fails, is skipped (logged)."""
        replies = []
        for link in self.links:
            if link.queue is None:
                continue
            try:
                replies.append(await link.call(request, timeout=self.lookup_timeout))
            except ServiceError as exc:
                log.info("%s: %s", link.name, exc)
                continue
            if first:
                break
        return tuple(replies)

    def close(self) -> None:
        """Unregister this process's brokers (clean shutdown) and close the links."""
        for link in self.links:
            link.close()

    async def aclose(self, timeout: float = DEFAULT_CLOSE_TIMEOUT) -> None:
        """:meth:`close`, then wait (up to ``timeout`` in all) until the unregisters have
        left this process: it may end without the managers waiting out its expiry."""
        queues = [link.queue for link in self.links if link.queue is not None]
        self.close()
        await wait_all_sent(queues, timeout)


class _NoOwner:
    """Owner of the name client's own connect tasks: failures are logged by the pump."""

    def task_failed(self, exc: BaseException) -> None:
        log.error("name client task failed: %r", exc)

    def trace_ids(self) -> tuple[str | None, str | None, int | None, str | None]:
        return None, MANAGER_ID, NAME_PORT, None


class _ManagerLink(ReconnectingLink):
    """The link to one manager: register at once and on every heartbeat; after a loss,
    dial again at once (a restarted manager relearns us immediately)."""

    def __init__(self, client: NameClient, address: Address) -> None:
        node, net = client.rdv, client.manager.net
        super().__init__(client.pump,
                         lambda link: net.dial(node, MANAGER_ID, NAME_PORT, link,
                                               address=address),
                         name=f"manager {address}", retry=client.retry, after_loss=0)
        self.client = client
        self.address = address
        #: Set when the manager refused a registration for good (a duplicate id).
        self.refusal: str | None = None
        #: The last other refusal logged (a fenced master's, at every heartbeat).
        self.fenced: str | None = None
        self._beat_timer: Repeating | None = None

    def opened(self) -> None:
        self.beat()
        if self._beat_timer is not None:
            self._beat_timer.cancel()
        self._beat_timer = self.pump.call_every(self.client.heartbeat, self.beat)

    def beat(self) -> None:
        registrations = self.client.registrations()
        if registrations:
            self.request({"cmd": "register", "brokers": registrations}, self._registered)

    def _registered(self, outcome: Outcome) -> None:
        if not isinstance(outcome, ServiceError) or outcome.status == Status.NO_REPLY:
            return  # registered; or the link closed, and it registers again when back
        if outcome.detail.get("refused") == DUPLICATE_ID:
            if not self.refusal:
                self.refusal = outcome.reason
                self.client.refused(self, self.refusal)
        elif outcome.reason != self.fenced:  # a fenced master: said once, not every beat
            self.fenced = outcome.reason
            log.error("%s refused a registration: %s", self.name, outcome)

    def lost(self, reason: str) -> None:
        if self._beat_timer is not None:
            self._beat_timer.cancel()

    def goodbye(self) -> None:
        if self._beat_timer is not None:
            self._beat_timer.cancel()
        ids = [r["id"] for r in self.client.registrations()]
        if ids:
            self.send({"cmd": "unregister", "ids": ids})
