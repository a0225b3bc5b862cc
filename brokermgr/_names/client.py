"""The name service's client: a process's links to the managers of its universe.

It registers the process's brokers with every manager and heartbeats (RocketMQ's
brokers do the same with every NameServer), registers again at once when a manager's
connection drops, and asks the managers where a broker lives, which brokers there are,
and what the groups and routes are (:mod:`.service` answers).
"""

from __future__ import annotations

import builtins
import logging
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from pump import ConfigError, Future, Repeating
from rdv import Address, RdvNode

from .._broker import DEFAULT_CLOSE_TIMEOUT, BrokerManager, wait_all_sent
from .._fence import STALE_EPOCH
from .._groups import GroupMember, GroupProgress
from .._link import ReconnectingLink, ReplyOrError
from .._service import ReplyObject, ServiceError, Status
from .requests import MAX_HEARTBEAT
from .service import (
    DEFAULT_HEARTBEAT,
    DEFAULT_LOOKUP_TIMEOUT,
    DUPLICATE_ID,
    MANAGER_ID,
    NAME_PORT,
)

if TYPE_CHECKING:
    from .._broker import Broker

log = logging.getLogger("rdvpump.names")


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

    A manager is the address of a manager process (reached over TCP), or the id of a
    broker of this universe that serves the name service (:class:`NameService` with
    that ``broker_id``), reached over in-memory links from ``broker``: then the client
    registers ``broker`` alone, at ``address``.  That is how a simulation gives each
    server a name client of its own, which a partition or a crash can cut off as a
    network would.
    """

    def __init__(self, manager: BrokerManager, managers: Sequence[Address | str], *,
                 heartbeat: float = DEFAULT_HEARTBEAT, retry: float = DEFAULT_NAME_RETRY,
                 lookup_timeout: float = DEFAULT_LOOKUP_TIMEOUT, version: int = 0,
                 topics: Callable[[str], tuple[str, ...]] | None = None,
                 groups: Callable[[str], GroupMember | None] | None = None,
                 clusters: Callable[[str], dict[str, Any] | None] | None = None,
                 progress: Callable[[str], GroupProgress | None] | None = None,
                 on_refused: Callable[[str, str], None] | None = None,
                 broker: Broker | None = None, address: Address | None = None) -> None:
        if not managers:
            raise ConfigError("a name client needs at least one manager address")
        if broker is None and any(isinstance(m, str) for m in managers):
            raise ConfigError("a name client reaches name services of its universe (by "
                              "broker id) only from a broker: give broker=")
        if not heartbeat > 0 or not retry > 0:
            raise ConfigError("heartbeat and retry intervals must be positive")
        if heartbeat > MAX_HEARTBEAT:
            raise ConfigError(f"a heartbeat interval is at most {MAX_HEARTBEAT:g} s, got "
                              f"{heartbeat:g}")
        self.manager = manager
        self.pump = manager.pump
        #: The one broker registered, when not every broker of ``manager``.
        self.broker = broker
        #: The address registered (None: where ``manager`` serves its network).
        self.address = address
        self.heartbeat = heartbeat
        self.retry = retry
        self.lookup_timeout = lookup_timeout
        self.version = version
        self.topics = topics or (lambda broker_id: ())
        #: Each broker's place in a replicated group, registered with it (None: none).
        self.groups = groups or (lambda broker_id: None)
        #: Each broker's place in an MQ cluster, registered with it (None: none).
        self.clusters = clusters or (lambda broker_id: None)
        #: How far each broker's copy is, registered with it (None: not said).
        self.progress = progress or (lambda broker_id: None)
        #: Where the process serves its metrics (``HOST:PORT``), registered with each of
        #: its brokers (None: it serves none).
        self.metrics: str | None = None
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
        #: Set once a manager accepted this process's brokers (None), or refused them
        #: for good (the reason): what :meth:`connected` waits for.
        self._accepted: Future[str | None] = Future()

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

    def answered(self, refusal: str | None) -> None:
        """A manager accepted this process's brokers (``refusal`` None), or refused them
        for good: the first such answer ends :meth:`connected`."""
        self._accepted.set(refusal)

    async def connected(self) -> None:
        """Wait until a manager is connected and has accepted this process's brokers (at
        once when it has none to register): from then on brokers of other processes are
        found by id (:meth:`lookup`, ``connect_queue``), and others find these.  Bound it
        with ``trio.fail_after``: a manager that cannot be reached is dialled again for
        ever.  :class:`ConnectionRefusedError` if a manager refused the brokers for good
        (an id registered by a live process already)."""
        refusal = await self._accepted.wait()
        if refusal is not None:
            raise ConnectionRefusedError(refusal)

    def registered_ids(self) -> list[str]:
        """The ids this client registers (none before the process listens): what an
        unregister names.  Only ids: it is also read as the process stops, when the
        servers behind a registration's ``progress`` have closed their files."""
        if (self.address or self.manager.net.address) is None:
            return []
        ids = self.manager.broker_ids if self.broker is None else [self.broker.id]
        return [b for b in ids if not b.startswith("@")]

    def registrations(self) -> list[dict[str, Any]]:
        address = self.address or self.manager.net.address
        if address is None:
            return []
        found = []
        for b in self.registered_ids():
            row: dict[str, Any] = {"id": b, "address": list(address),
                                   "version": self.version, "topics": list(self.topics(b))}
            if (member := self.groups(b)) is not None:
                row["group"] = member.to_json()
            if (cluster := self.clusters(b)) is not None:
                row["cluster"] = cluster
            if (progress := self.progress(b)) is not None:
                row["progress"] = progress.to_json()
            if self.metrics is not None:
                row["metrics"] = self.metrics
            row["heartbeat"] = self.heartbeat
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

    async def group_views(self, name: str) -> builtins.list[dict[str, Any]]:
        """A replicated group as each connected manager that answers knows it (one reply
        each; a manager that does not answer is left out): with several name services,
        a member acts on what a majority of :attr:`links` say (:func:`mq.keep_role`)."""
        return [dict(reply) for reply in await self._ask({"cmd": "group", "name": name})]

    async def claim(self, group: str, broker_id: str, epoch: int) -> int:
        """Ask every connected manager to make ``broker_id`` the master of ``group`` at
        ``epoch`` (see :meth:`NameService._claim`): how many granted it."""
        replies = await self._ask({"cmd": "claim", "group": group, "id": broker_id,
                                   "epoch": epoch})
        return sum(1 for reply in replies if reply.get("granted") is True)

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

    def __init__(self, client: NameClient, address: Address | str) -> None:
        dial: Callable[[ReconnectingLink], None]
        if isinstance(address, str):
            broker = client.broker
            assert broker is not None

            def dial(link: ReconnectingLink) -> None:
                if not broker.closed:
                    broker.connect(address, NAME_PORT, link)
        else:
            node, net = client.rdv, client.manager.net

            def dial(link: ReconnectingLink) -> None:
                net.dial(node, MANAGER_ID, NAME_PORT, link, address=address)
        super().__init__(client.pump, dial, name=f"manager {address}", retry=client.retry,
                         after_loss=0)
        self.client = client
        self.address = address
        #: Set when the manager refused a registration for good (a duplicate id).
        self.refusal: str | None = None
        #: The last other refusal logged (a fenced master's, at every heartbeat).
        self.fenced: str | None = None
        self._beat_timer: Repeating | None = None

    def opened(self) -> None:
        if not self.client.registered_ids():
            self.client.answered(None)  # nothing to register: connected is enough
        self.beat()
        if self._beat_timer is not None:
            self._beat_timer.cancel()
        self._beat_timer = self.pump.call_every(self.client.heartbeat, self.beat)

    def beat(self) -> None:
        registrations = self.client.registrations()
        if registrations:
            self.request({"cmd": "register", "brokers": registrations}, self._registered)

    def _registered(self, outcome: ReplyOrError) -> None:
        if not isinstance(outcome, ServiceError):
            self.client.answered(None)
            return
        if outcome.status == Status.NO_REPLY:
            return  # the link closed: it registers again when back
        if outcome.detail.get("refused") == DUPLICATE_ID:
            if not self.refusal:
                self.refusal = outcome.reason
                self.client.answered(f"{self.name} refused it: {outcome.reason}")
                self.client.refused(self, self.refusal)
        elif outcome.reason != self.fenced:  # a fenced master: said once, not every beat
            self.fenced = outcome.reason
            # a former master registering at its old epoch is how it learns of its
            # successor (its server says it steps down): the fence at work, not a fault
            log.log(logging.INFO if outcome.detail.get("refused") == STALE_EPOCH
                    else logging.ERROR, "%s refused a registration: %s", self.name, outcome)

    def lost(self, reason: str) -> None:
        if self._beat_timer is not None:
            self._beat_timer.cancel()

    def goodbye(self) -> None:
        if self._beat_timer is not None:
            self._beat_timer.cancel()
        ids = self.client.registered_ids()
        if ids:
            self.send({"cmd": "unregister", "ids": ids})
