"""Producers and consumers that follow tracking's route tables (zbus's Broker/MqClient).

:class:`Producer` picks a server for each publish with a tracking selector
(round robin over servers with consumers by default, or ``by_key_hash``) and,
when that server does not answer, publishes again on another server that
holds the topic.  **That can store a message twice** (the first server may
have stored it before it went quiet): the retry keeps the same producer id and
sequence number, so a server that has those messages already (a slave promoted after
its master died, which had copied them) answers with where they are and does not store
them again (:mod:`mq.topics._dedupe`), and a consumer that must not see duplicates drops a
message whose ``(producer, sequence)`` it has seen (another server of the topic may
have stored it).  A publish waiting for its answer from a server that the route table
no longer lists as taking the topic's writes (a master that died or stepped down) is
given up at once and tried again elsewhere with its numbers, without waiting for its
timeout.  While every server of the topic refuses (503: a replicated group's slave, a
master not confirmed yet) or does not answer, a publish waits for the route table to
change and tries again, for up to ``failover`` seconds: a publish in flight when a
master dies goes to the member promoted, with its numbers.  The member promoted refuses
(503) until another member copies it, and a former master restarting until the name
service confirms it, neither of which changes a route: each tells the producers it
refused once it takes writes again (a ``writable`` push), and they try again then; a
pause that doubles from :data:`FIRST_RECHECK` to :data:`RECHECK` covers a server that
says nothing.

:class:`Consumer` consumes the topic on every server that holds it (of a replicated
group: its master, or its slaves once it has had none for :data:`SLAVES_AFTER` seconds),
attaches to servers as they join the route table or become readable, and lets go of
those that leave.  A promoted member has its group's position as its master last sent
it (every 0.1 s): a consumer that moves there is given what the master had not seen
handled (at-least-once: what it had delivered and not seen acknowledged, and the
acknowledgements of the last 0.1 s, come again).  What a consumer acknowledges on a
slave stays there: the master, once back, delivers it again.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Sequence
from typing import Any

import trio

from brokermgr import ServiceError, Status
from brokermgr.tracking import ProducerRoute, RouteChange, RouteClient, Selector

from ..topics._group import DEFAULT_WINDOW
from ._client import DEFAULT_TIMEOUT, MqClient, Stored, unique_producer
from ._subscription import Message, Subscription

#: Statuses after which a publish is tried on another server (no answer; server closed).
RETRYABLE = frozenset({0, 503})
#: Seconds a publish goes on trying while every server of its topic refuses it (503) or
#: does not answer (a replicated group's master failing over), by default.
DEFAULT_FAILOVER = 10.0
#: Seconds between its rounds of tries when the route table does not change meanwhile:
#: from the first, doubling up to the most.
FIRST_RECHECK = 0.01
RECHECK = 0.1


class Producer:
    """Publishes to ``topic`` on the servers ``routes`` knows."""

    def __init__(self, routes: RouteClient, topic: str, *, selector: Selector | None = None,
                 producer: str | None = None, timeout: float = DEFAULT_TIMEOUT,
                 failover: float = DEFAULT_FAILOVER) -> None:
        self.routes = routes
        self.topic = topic
        self.route = ProducerRoute(routes, topic, selector)
        self.producer = producer or unique_producer(routes.broker.id)
        self.timeout = timeout
        self.failover = failover
        self.sequence = 0
        self.clients: dict[str, MqClient] = {}
        #: Publishes tried again on another server (each may have duplicated a message).
        self.retried = 0
        #: ``writable`` pushes of the topic so far (a server that refused a publish for
        #: too few replicas in sync takes it now), and what waits for the next
        self.writable = 0
        self._writable = trio.Event()

    def _client(self, address: str) -> MqClient:
        client = self.clients.get(address)
        if client is None:
            client = self.clients[address] = MqClient(self.routes.broker, address,
                                                      producer=self.producer,
                                                      timeout=self.timeout)
            client.on_writable = self._pushed_writable
        return client

    def _pushed_writable(self, topic: str) -> None:
        if topic == self.topic:
            self.writable += 1
            self._writable.set()
            self._writable = trio.Event()

    async def _next_change(self, deadline: float) -> None:
        """Until the route table changes, a server says the topic is writable again, or
        ``deadline``."""
        with trio.move_on_at(deadline):
            async with trio.open_nursery() as nursery:
                async def until(event: Any) -> None:
                    await event()
                    nursery.cancel_scope.cancel()

                nursery.start_soon(until, self.routes.changed)
                nursery.start_soon(until, self._writable.wait)

    def _candidates(self, key: bytes | str | None, tried: set[str]) -> list[str]:
        """The servers to try, in order: those the selector chooses, then the topic's
        others (a slave may have been promoted since the table said otherwise), but
        never a master that one at a newer epoch superseded (hung or cut off: it would
        keep the publish until its timeout)."""
        table = self.routes.routes
        chosen = [a for a in self.route.servers(key) if a not in tried]
        others = sorted(a for a in table.servers_of(self.topic)
                        if a not in tried and a not in chosen and not table.superseded(a))
        return chosen + others

    async def publish(self, body: bytes, *, tag: str | None = None,
                      key: bytes | str | None = None) -> Stored:
        return (await self.publish_many([body], tag=tag, key=key))[0]

    async def publish_many(self, bodies: Sequence[bytes], *, tag: str | None = None,
                           key: bytes | str | None = None) -> list[Stored]:
        """Store ``bodies`` on one server; tried again on another that holds the topic if
        the first does not answer (see the module: this can duplicate), and for up to
        ``failover`` seconds while none takes it (a master failing over)."""
        sequence = self.sequence
        self.sequence += len(bodies)
        tried: set[str] = set()
        last: ServiceError | None = None
        deadline = trio.current_time() + self.failover
        seen, rounds = (self.routes.changes, self.writable), 0
        while True:
            candidates = self._candidates(key, tried)
            if not candidates and last is not None and trio.current_time() < deadline:
                # every server of the topic refused (503) or did not answer: a master may
                # be failing over; try them all again at the route table's next change,
                # or when a master that refused it for too few replicas in sync says it
                # has them (at once if either came while they were tried), or after a
                # pause that doubles from FIRST_RECHECK
                if (self.routes.changes, self.writable) == seen:
                    pause = min(RECHECK, FIRST_RECHECK * 2 ** rounds)
                    await self._next_change(min(deadline, trio.current_time() + pause))
                    rounds += 1
                else:
                    rounds = 0
                seen = (self.routes.changes, self.writable)
                tried.clear()
                continue
            if not candidates:
                if last is not None:
                    raise last
                raise ServiceError(Status.NOT_FOUND, f"no server holds topic {self.topic!r}")
            address = candidates[0]
            client = self._client(address)
            try:  # a retry keeps the sequence numbers
                return await self._publish_at(client, address, bodies, tag, sequence + 1)
            except ServiceError as exc:
                if exc.status not in RETRYABLE:
                    raise
                tried.add(address)
                last = exc
                self.retried += 1

    async def _publish_at(self, client: MqClient, address: str, bodies: Sequence[bytes],
                          tag: str | None, sequence: int) -> list[Stored]:
        """``client.publish_many``, given up (status 0: it may or may not have been
        stored) as soon as the route table no longer lists ``address`` among the servers
        that take the topic's writes (its master died, or stepped down) or its link is
        lost, rather than when the timeout runs out."""
        if address not in self.routes.routes.writable_of(self.topic):
            if client.link.queue is None:  # a slave, say, whose link is being dialled:
                # not waited for (it keeps dialling meanwhile)
                raise ServiceError(Status.NO_REPLY, f"{address}: not connected")
            return await client.publish_many(self.topic, bodies, tag=tag, sequence=sequence)
        client.link.hurry()  # a master the table lists, its link waiting to dial again
        outcome: list[Stored] | ServiceError | None = None
        async with trio.open_nursery() as nursery:
            async def request() -> None:
                nonlocal outcome
                try:
                    outcome = await client.publish_many(self.topic, bodies, tag=tag,
                                                        sequence=sequence)
                except ServiceError as exc:
                    outcome = exc
                nursery.cancel_scope.cancel()

            async def watch() -> None:
                while address in self.routes.routes.writable_of(self.topic):
                    await self.routes.changed()
                nursery.cancel_scope.cancel()

            nursery.start_soon(request)
            nursery.start_soon(watch)
        if isinstance(outcome, ServiceError):
            raise outcome
        if outcome is None:
            raise ServiceError(Status.NO_REPLY, f"{address} no longer takes the writes of "
                                                f"{self.topic!r} (the route table changed)")
        return outcome

    def close(self) -> None:
        for client in self.clients.values():
            client.close()


#: Seconds a replicated group must go without a master in the route table before a
#: :class:`Consumer` reads from its slaves: longer than a failover takes with every
#: setting at its default (a master silent for 1 s expires), so that a consumer waits
#: for the member promoted instead of acknowledging on a slave what the new master does
#: not hear of (it would deliver it again).
SLAVES_AFTER = 2.0


class Consumer:
    """Consumes ``topic`` (in ``group``) on every server that holds it; ``async for``.
    ``window`` is each server's subscription's (:meth:`MqClient.subscribe`).

    Run :meth:`run` in a nursery (``await nursery.start(consumer.run)``): it attaches
    to the servers the route table lists and follows its changes.
    """

    def __init__(self, routes: RouteClient, topic: str, *, group: str | None = None,
                 window: int = DEFAULT_WINDOW, timeout: float = DEFAULT_TIMEOUT,
                 slaves_after: float = SLAVES_AFTER) -> None:
        self.routes = routes
        self.topic = topic
        self.group = group or topic
        self.window = window
        self.timeout = timeout
        #: Seconds a replicated group goes without a master in the route table before
        #: this consumer reads from its slaves (:data:`SLAVES_AFTER`).
        self.slaves_after = slaves_after
        self.clients: dict[str, MqClient] = {}
        self._send, self._receive = trio.open_memory_channel[Message](math.inf)
        self._nursery: trio.Nursery | None = None
        #: Since when each replicated group of the topic has had no master in the table.
        self._masterless: dict[str, float] = {}
        #: When the slaves held back by :meth:`_holding` are next due, and what wakes the
        #: task that waits for that.
        self._slaves_due = math.inf
        self._due_changed = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self.routes.on_change(self._changed)
            for address in sorted(self._holding()):
                self._attach(address)
            nursery.start_soon(self._slaves_in_time)
            task_status.started()
            await trio.sleep_forever()

    def _holding(self) -> set[str]:
        """The servers to read the topic from: a replicated group's master, or its slaves
        once it has had none in the table for :attr:`slaves_after` seconds
        (:meth:`~brokermgr.tracking.RouteTable.readable`)."""
        table = self.routes.routes
        readable = set(table.readable())
        now = trio.current_time()
        holding, masterless = set(), set()
        for address in table.servers_of(self.topic):
            if address not in readable:
                continue
            info = table.server_table.get(address)
            if info is not None and info.group is not None and info.slave:
                group = info.group.group
                masterless.add(group)
                due = self._masterless.setdefault(group, now) + self.slaves_after
                if now < due:
                    if due < self._slaves_due:
                        self._slaves_due = due
                        self._due_changed.set()
                    continue
            holding.add(address)
        self._masterless = {g: t for g, t in self._masterless.items() if g in masterless}
        return holding

    async def _slaves_in_time(self) -> None:
        """Read again which servers to hold when slaves held back are due."""
        while True:
            with trio.move_on_at(self._slaves_due):
                await self._due_changed.wait()
                self._due_changed = trio.Event()
                continue
            self._slaves_due = math.inf
            self._changed(None)

    def _changed(self, change: RouteChange | None) -> None:
        holding = self._holding()
        for address in sorted(holding - set(self.clients)):
            self._attach(address)
        for address in sorted(set(self.clients) - holding):
            self.clients.pop(address).close()

    def _attach(self, address: str) -> None:
        if address in self.clients or self._nursery is None:
            return
        client = self.clients[address] = MqClient(self.routes.broker, address,
                                                  timeout=self.timeout)
        self._nursery.start_soon(self._forward, address, client)

    async def _forward(self, address: str, client: MqClient) -> None:
        try:
            await client.declare(self.topic, group=self.group)  # the group exists there
            subscription: Subscription = await client.subscribe(
                self.topic, group=self.group, window=self.window)
        except ServiceError:
            if self.clients.get(address) is client:
                del self.clients[address]  # attached again at the next route change
            client.close()
            return
        async for message in subscription:
            self._send.send_nowait(message)

    def __aiter__(self) -> AsyncIterator[Message]:
        return self._receive.__aiter__()

    async def receive(self) -> Message:
        return await self._receive.receive()

    def close(self) -> None:
        for client in self.clients.values():
            client.close()
        self.clients.clear()
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()
