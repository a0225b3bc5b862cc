"""Producers and consumers that follow tracking's route tables (zbus's Broker/MqClient).

:class:`Producer` picks a server for each publish with a tracking selector
(round robin over servers with consumers by default, or ``by_key_hash``) and,
when that server does not answer, publishes again on another server that
holds the topic.  **That can store a message twice** (the first server may
have stored it before it went quiet): the retry keeps the same producer id and
sequence number, so a consumer that must not see duplicates drops a message
whose ``(producer, sequence)`` it has seen.

:class:`Consumer` consumes the topic on every server that holds it, attaches
to servers as they join the route table and lets go of those that leave.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Sequence

import trio

from brokermgr import ServiceError, Status
from brokermgr.tracking import ProducerRoute, RouteChange, RouteClient, Selector

from ._client import DEFAULT_TIMEOUT, MqClient, Stored
from ._subscription import Message, Subscription
from ._topic import DEFAULT_WINDOW

#: Statuses after which a publish is tried on another server (no answer; server closed).
RETRYABLE = frozenset({0, 503})


class Producer:
    """Publishes to ``topic`` on the servers ``routes`` knows."""

    def __init__(self, routes: RouteClient, topic: str, *, selector: Selector | None = None,
                 producer: str | None = None, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.routes = routes
        self.topic = topic
        self.route = ProducerRoute(routes, topic, selector)
        self.producer = producer or routes.broker.id
        self.timeout = timeout
        self.sequence = 0
        self.clients: dict[str, MqClient] = {}
        #: Publishes tried again on another server (each may have duplicated a message).
        self.retried = 0

    def _client(self, address: str) -> MqClient:
        client = self.clients.get(address)
        if client is None:
            client = self.clients[address] = MqClient(self.routes.broker, address,
                                                      producer=self.producer,
                                                      timeout=self.timeout)
        return client

    def _candidates(self, key: bytes | str | None, tried: set[str]) -> list[str]:
        chosen = [a for a in self.route.servers(key) if a not in tried]
        others = sorted(a for a in self.routes.routes.servers_of(self.topic)
                        if a not in tried and a not in chosen)
        return chosen + others

    async def publish(self, body: bytes, *, tag: str | None = None,
                      key: bytes | str | None = None) -> Stored:
        return (await self.publish_many([body], tag=tag, key=key))[0]

    async def publish_many(self, bodies: Sequence[bytes], *, tag: str | None = None,
                           key: bytes | str | None = None) -> list[Stored]:
        """Store ``bodies`` on one server; tried again on another that holds the topic if
        the first does not answer (see the module: this can duplicate)."""
        sequence = self.sequence
        self.sequence += len(bodies)
        tried: set[str] = set()
        last: ServiceError | None = None
        while True:
            candidates = self._candidates(key, tried)
            if not candidates:
                if last is not None:
                    raise last
                raise ServiceError(Status.NOT_FOUND, f"no server holds topic {self.topic!r}")
            address = candidates[0]
            client = self._client(address)
            client.sequence = sequence  # a retry keeps the sequence numbers
            try:
                return await client.publish_many(self.topic, bodies, tag=tag)
            except ServiceError as exc:
                if exc.status not in RETRYABLE:
                    raise
                tried.add(address)
                last = exc
                self.retried += 1

    def close(self) -> None:
        for client in self.clients.values():
            client.close()


class Consumer:
    """Consumes ``topic`` (in ``group``) on every server that holds it; ``async for``.

    Run :meth:`run` in a nursery (``await nursery.start(consumer.run)``): it attaches
    to the servers the route table lists and follows its changes.
    """

    def __init__(self, routes: RouteClient, topic: str, *, group: str | None = None,
                 window: int = DEFAULT_WINDOW, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.routes = routes
        self.topic = topic
        self.group = group or topic
        self.window = window
        self.timeout = timeout
        self.clients: dict[str, MqClient] = {}
        self._send, self._receive = trio.open_memory_channel[Message](math.inf)
        self._nursery: trio.Nursery | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self.routes.on_change(self._changed)
            for address in sorted(self.routes.routes.servers_of(self.topic)):
                self._attach(address)
            task_status.started()
            await trio.sleep_forever()

    def _changed(self, change: RouteChange) -> None:
        holding = set(self.routes.routes.servers_of(self.topic))
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
