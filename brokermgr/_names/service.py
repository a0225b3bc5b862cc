r"""The name service: a BrokerManager served to other processes, like RocketMQ's NameServer.

The service is a broker (``@manager``) listening on rendezvous port 0; clients
reach it through the same handshake (universe and token) and message queues as
any link.  It speaks the service protocol (:mod:`brokermgr._service`): ``register`` and
``heartbeat`` (the same: a list of brokers), ``unregister``, ``lookup``, ``list``, and
for replicated groups ``route``, ``group`` and ``switch`` (the tables of
:mod:`brokermgr._groups`).  Its client is :mod:`.client`.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from channels import MessageQueue
from pump import ConfigError
from pump.schema import Kind
from rdv import Address, Right

from .._broker import DEFAULT_CLOSE_TIMEOUT, BrokerManager
from .._fence import STALE_EPOCH
from .._groups import GroupProgress, GroupTables
from .._liveness import DEFAULT_SCAN_INTERVAL, LivenessEntry, LivenessTable
from .._rpc import ServiceSession
from .._service import (
    Call,
    Command,
    CommandTable,
    ReplyObject,
    ServiceError,
    Status,
    require_member,
)
from .requests import (
    BrokerRecord,
    Claim,
    GroupQuery,
    ListBrokers,
    Lookup,
    Register,
    RouteQuery,
    Switch,
    Unregister,
    parse_claim,
    parse_group,
    parse_lookup,
    parse_register,
    parse_route,
    parse_switch,
    parse_unregister,
    record_dict,
)

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
#: A broker that states its heartbeat interval is dropped after this many of them without
#: one (or at the service's expiry, if sooner): 4 x 30 s is the default expiry, and a
#: group's member, which beats every 0.1 s, is dropped 1 s after it went silent
#: (:data:`GROUP_HEARTBEAT`).  One TCP connection carries the beats, and a lost segment
#: stalls it until it is sent again: measured over 24,000 beats 0.1 s apart on links of
#: 50 +/- 20 ms with 2 % loss, the longest gap between two was 0.64 s, and 8 in 24,000
#: were 0.5 s or more.
EXPIRY_BEATS = 10
#: Seconds between the registrations of a replicated group's member, by default.
GROUP_HEARTBEAT = 0.1
#: A group's master silent for this many of its heartbeats (0.5 s by default) is dropped
#: at once when each of its in-sync members, heard lately, says that the master has said
#: nothing to it either for :data:`QUIET` seconds.  A false alarm then needs two links
#: (or three) stalled at once by lost segments, each for that long: by the figures above
#: (a gap of 0.4 s or more once in 100 s of a link) about once in nine hours of 2 % loss
#: with one member in sync, and once in weeks with two; a host cut off or a process
#: stopped is found in 0.5-0.6 s.
SUSPECT_BEATS = 5
#: Seconds without a word from its master (which answers a query every 0.1 s while it
#: lives) after which a slave says so to the name service at once; a member promoted
#: takes over from an old master silent for as long, its link open or not.
QUIET = 0.4
#: A member's registration counts as a witness of its master's silence while it is at
#: most this many of the member's heartbeats old.
FRESH_BEATS = 3


def _from_host(queue: MessageQueue | None, host: str) -> bool:
    """Whether a request's link comes from ``host`` (a link within this process does)."""
    where = None if queue is None else queue.peer_address
    return where is None or where.rsplit(":", 1)[0] == host


def _witnesses(progress: GroupProgress) -> bool:
    """Whether a slave's progress says its master has been silent to it: quiet for the
    silence it states (:data:`QUIET` if it states none)."""
    return progress.quiet is not None and progress.quiet >= (
        QUIET if progress.silence is None else progress.silence)


def _expiry_of(record: BrokerRecord) -> float:
    """A broker's own expiry: :data:`EXPIRY_BEATS` of its stated heartbeats."""
    return float("inf") if record.heartbeat is None else EXPIRY_BEATS * record.heartbeat


class NameService:
    """Serves a universe's directory: register, heartbeat, unregister, lookup, list, and
    the routes of replicated groups (``route``, :mod:`._groups`).

    A broker is dropped at once when the connection it registered over drops,
    and otherwise when no heartbeat came within ``expiry`` (checked every
    ``scan_interval``).  The service is the broker ``broker_id`` of ``manager``'s
    universe (:data:`MANAGER_ID`, which a manager process serves over TCP; another id
    puts a second service in one universe, as a simulation does).
    """

    def __init__(self, manager: BrokerManager, *, expiry: float = DEFAULT_BROKER_EXPIRY,
                 scan_interval: float = DEFAULT_SCAN_INTERVAL,
                 broker_id: str = MANAGER_ID) -> None:
        if not scan_interval > 0:
            raise ConfigError(f"scan interval must be positive, got {scan_interval!r}")
        self.manager = manager
        self.pump = manager.pump
        self.table: LivenessTable[BrokerRecord] = LivenessTable(
            expiry=expiry, expiry_of=_expiry_of)
        self.groups = GroupTables()
        self.scan_interval = scan_interval
        self.commands = CommandTable("name-service", {
            "register": Command(parse_register, self._register),
            "heartbeat": Command(parse_register, self._register),
            "unregister": Command(parse_unregister, self._unregister),
            "lookup": Command(parse_lookup, self._lookup),
            "list": Command(lambda fields: ListBrokers(), self._list),
            "route": Command(parse_route, self._route),
            "group": Command(parse_group, self._group),
            "failover": Command(parse_switch, self._switch, right=lambda r: (Right.ADMIN, ""),
                                audit=lambda r: f"group {r.group} to {r.to}"),
            "claim": Command(parse_claim, self._claim),
        })
        self.broker = manager.add_broker(broker_id)
        self.broker.listen(NAME_PORT, self)
        self._scan_timer = self.pump.call_every(scan_interval, self._scan)
        #: Scans as often as the shortest heartbeat a broker stated, once one states a
        #: heartbeat shorter than the scans' interval (a group member's).
        self._fast_scan: tuple[float, Any] | None = None

    def accepted(self, queue: MessageQueue) -> None:
        queue.set_listener(_NameServiceSession(self, queue))

    # -- the commands: the connection a broker registered over is the link's queue --------

    def _register(self, request: Register, call: Call) -> ReplyObject:
        refused = []
        fenced = []
        now = self.pump.now()
        for registration in request.brokers:  # a group's member, or a reserved id: proven
            require_member(call.queue, registration.record.broker_id, cmd="register",
                           always=registration.record.group is not None)
        for registration in request.brokers:
            record = registration.record
            held = self.table.get(record.broker_id)
            if not self._takes_over(held, record, call.queue):
                assert held is not None
                refused.append({"id": record.broker_id, "held_by": list(held.value.address)})
                continue
            why = None if record.group is None else self.groups.refusal(record.broker_id,
                                                                        record.group)
            if why is not None:
                # a former master coming back at its old epoch: the promotion that
                # fenced it was logged; this is the fence at work, not a fault
                log.info("refused the registration of broker %s: %s", record.broker_id,
                         why)
                fenced.append(why)
                # a fenced master is a member all the same (a slave until told otherwise):
                # it may hold what a group left without a master needs
                assert record.group is not None
                record = dataclasses.replace(record, group=dataclasses.replace(
                    record.group, role="slave"))
            self.table.report(record.broker_id, record, now=now,
                              version=registration.version, connection=call.queue)
            if record.heartbeat is not None and record.heartbeat < self.scan_interval:
                self._scan_every(record.heartbeat)
            if record.group is not None:
                self.groups.update(record.broker_id, record.address, record.group,
                                   record.topics, registration.version, record.progress)
                said = self.groups.recover(record.group.group)
                if said is not None:
                    log.warning("%s", said)
                if record.progress is not None and _witnesses(record.progress):
                    self._drop_silent_masters(now)  # a witness: its master may be gone
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

    @staticmethod
    def _takes_over(held: LivenessEntry[BrokerRecord] | None, record: BrokerRecord,
                    queue: MessageQueue | None) -> bool:
        """Whether ``record``'s registration over ``queue`` may stand where ``held`` is:
        none held, the same connection, or the same broker over a new connection (from
        the host it listens on, where the held one does: no other process can; its old
        connection went silent without closing, a partition or a host cut off, and is
        dropped).  Another live registration (its connection open: a crashed process's
        closed with it, which dropped its brokers at once) refuses it."""
        if held is None or held.connection is queue:
            return True
        if held.value.address == record.address and _from_host(queue, record.address[0]):
            log.warning("broker %s registered again over a new connection from %s: its "
                        "old connection, silent, is dropped", record.broker_id,
                        record.address)
            if isinstance(held.connection, MessageQueue):
                held.connection.close(f"broker {record.broker_id} registered again over "
                                      f"a new connection")
            return True
        log.warning("refused a second registration of broker %s: it is held by %s",
                    record.broker_id, held.value.address)
        return False

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

    def _claim(self, request: Claim, call: Call) -> ReplyObject:
        """A member's claim to be its group's master at an epoch (:meth:`GroupTables.claim`):
        ``granted`` or not, and the newest epoch here."""
        require_member(call.queue, request.id, cmd="claim", always=True)
        granted, newest = self.groups.claim(request.group, request.id, request.epoch)
        if granted:
            log.warning("group %s: %s claimed epoch %d: granted", request.group, request.id,
                        request.epoch)
        return {"cmd": "claim", "granted": granted, "epoch": newest}

    def connection_lost(self, queue: MessageQueue, reason: str) -> None:
        for broker_id in self.table.connection_lost(queue):
            self._forget(broker_id)
            log.info("broker %s dropped: its connection closed (%s)", broker_id, reason)
            self.pump.emit(Kind.DROP, broker=broker_id, reason=reason)

    def _scan_every(self, heartbeat: float) -> None:
        every = max(heartbeat, 0.05)
        if self._fast_scan is not None and self._fast_scan[0] <= every:
            return
        if self._fast_scan is not None:
            self._fast_scan[1].cancel()
        self._fast_scan = (every, self.pump.call_every(every, self._scan))

    def _scan(self) -> None:
        now = self.pump.now()
        for broker_id in self.table.scan(now):
            self._forget(broker_id)
            log.info("broker %s expired: no heartbeat within its expiry", broker_id)
            self.pump.emit(Kind.EXPIRE, broker=broker_id)
        self._drop_silent_masters(now)

    def _drop_silent_masters(self, now: float) -> None:
        """Drop each group master silent for :data:`SUSPECT_BEATS` of its heartbeats whose
        in-sync members heard lately all say it has been quiet to them for their silence
        (:data:`QUIET` seconds unless they state another; at least one of them: without
        a witness it waits out its expiry)."""
        for group, (_, holder) in list(self.groups.epochs.items()):
            entry = self.table.get(holder)
            if (entry is None or entry.value.heartbeat is None
                    or now - entry.last_seen < SUSPECT_BEATS * entry.value.heartbeat):
                continue
            witnesses = []
            for member in self.groups.insync.get(group, ()):
                seen = self.table.get(member)
                if (seen is not None and seen.value.heartbeat is not None
                        and now - seen.last_seen <= FRESH_BEATS * seen.value.heartbeat):
                    witnesses.append(seen)
            quiet = [w.value.progress.quiet for w in witnesses if w.value.progress is not None
                     and w.value.progress.quiet is not None and _witnesses(w.value.progress)]
            if not witnesses or len(quiet) < len(witnesses):
                continue
            self.table.remove(holder)
            log.warning("broker %s, master of group %s, dropped: silent for %.2f s, and %s "
                        "heard nothing from it for %.2f s", holder, group,
                        now - entry.last_seen, ", ".join(w.key for w in witnesses),
                        min(quiet))
            self._forget(holder)
            self.pump.emit(Kind.EXPIRE, broker=holder)

    def _forget(self, broker_id: str) -> None:
        """A broker left: its group's tables follow (a failover, when it was the
        master: logged)."""
        said = self.groups.forget(broker_id)
        if said is not None:
            log.warning("%s", said)

    def close(self) -> None:
        self._scan_timer.cancel()
        if self._fast_scan is not None:
            self._fast_scan[1].cancel()
        self.broker.close("name service closed")

    async def aclose(self, timeout: float = DEFAULT_CLOSE_TIMEOUT) -> None:
        """:meth:`close`, then wait (up to ``timeout``) until every client's link has ended
        here, so that the manager's process may end without its brokers taking it for a
        crash."""
        self._scan_timer.cancel()
        if self._fast_scan is not None:
            self._fast_scan[1].cancel()
        await self.broker.aclose("name service closed", timeout=timeout)


class _NameServiceSession(ServiceSession):
    """One client connection to the name service."""

    what = "name-service request"

    def __init__(self, service: NameService, queue: MessageQueue) -> None:
        super().__init__(queue, service.commands)
        self.service = service

    def closed(self, reason: str) -> None:
        self.service.connection_lost(self.queue, reason)
