"""Broker and BrokerManager: actors with unique ids in a universe that links them on one pump.

Listener-style calls are the pump's native API; the ``*_queue`` coroutines are
their trio twins for embedding.
"""

from __future__ import annotations

import os
import ssl
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from typing import Any, TypeVar

import trio

from channels import (
    DEFAULT_ADAPTIVE_POLL,
    DEFAULT_HIGH_WATER,
    DEFAULT_MAX_MESSAGE_SIZE,
    DEFAULT_RECEIVE_BUFFER,
    DEFAULT_RING_CAPACITY,
    AsyncMessageQueue,
    ChannelManager,
    MessageQueue,
    QueueFullError,
)
from pump import ConfigError, Future, Pump
from rdv import (
    OPEN,
    Accepting,
    Address,
    Connecting,
    Credential,
    Identities,
    NetNode,
    RdvNode,
    RefusedError,
    Resolver,
)

#: How long an ``aclose`` (of a broker, a reconnecting link, a name client) waits for
#: what was sent, and the link's end, to leave this process.
DEFAULT_CLOSE_TIMEOUT = 2.0
#: Seconds an async call waits for the pump's answer before it checks that something
#: runs the pump at all.
UNDRIVEN_CHECK = 1.0

T = TypeVar("T")


async def wait_all_sent(queues: Iterable[MessageQueue], timeout: float) -> bool:
    """Wait, up to ``timeout`` in all, until each of ``queues`` (closed or closing) has
    sent everything, its close too, out of this process; False if the time ran out first
    (a peer that stops reading holds the last bytes)."""
    with trio.move_on_after(timeout):
        for queue in queues:
            await queue.wait_sent()
        return True
    return False


class Broker:
    """An actor with a unique id in its universe.

    ``bind``/``listen``/``unbind``/``connect`` follow the rendezvous rules (a bind
    waits for one connect; a connect is refused ``unknown broker``, ``not bound`` or
    ``busy``, never queued); listeners are called as pump tasks.  If one of the broker's own
    tasks raises, the pump fails the broker: every port is unbound, every link
    aborted, and later calls raise ``trio.BrokenResourceError``.
    """

    def __init__(self, manager: BrokerManager, broker_id: str) -> None:
        self.id = broker_id
        self.manager = manager
        self.pump = manager.pump
        #: The broker's rendezvous: its ports and its connects.
        self.rdv = RdvNode(
            manager.pump, broker_id, manager.channels, manager.resolve_local, owner=self,
            queue_options=manager.queue_options, network=manager.net,
        )
        self._failure: str | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"<Broker {self.id!r} of universe {self.manager.name!r}>"

    # -- pump owner protocol -----------------------------------------------------------

    def trace_ids(self) -> tuple[str | None, str | None, int | None, str | None]:
        return self.id, None, None, None

    def task_failed(self, exc: BaseException) -> None:
        self._failure = f"broker failed: {exc!r}"
        self.rdv.close(self._failure)

    def _check(self) -> None:
        if self._failure is not None:
            raise trio.BrokenResourceError(self._failure)
        if self._closed:
            raise trio.ClosedResourceError(f"broker {self.id!r} was closed")

    @property
    def closed(self) -> bool:
        return self._closed or self._failure is not None

    # -- listener API ------------------------------------------------------------------

    def bind(self, port: int, listener: Accepting) -> None:
        """Wait on ``port`` for one connect; raises if the port is already bound."""
        self._check()
        self.rdv.bind(port, listener)

    def listen(self, port: int, listener: Accepting) -> None:
        """Accept connects on ``port`` one after another until ``unbind``."""
        self._check()
        self.rdv.listen(port, listener)

    def unbind(self, port: int) -> None:
        self._check()
        self.rdv.unbind(port)

    def connect(self, broker_id: str, port: int, listener: Connecting) -> None:
        """Post a connect; ``listener.connected(queue)`` or ``listener.refused(reason)`` follows."""
        self._check()
        self.rdv.connect(broker_id, port, listener)

    @property
    def ports(self) -> list[int]:
        """Ports bound now."""
        return self.rdv.core.bound_ports()

    def close(self, reason: str = "broker closed") -> None:
        """Unbind every port, abort every link and leave the universe."""
        if self._closed:
            return
        self._closed = True
        self.rdv.close(reason)
        self.manager.forget(self.id)

    async def aclose(self, reason: str = "broker closed", *,
                     timeout: float = DEFAULT_CLOSE_TIMEOUT) -> None:
        """Close every link gracefully (what was sent on it goes first, then its close
        with ``reason``); wait up to ``timeout`` in all until that has left this process
        (over TCP: handed to the kernel), then :meth:`close` (a link still open then is
        aborted).  A process may end after this without its peers taking it for a crash
        or losing what it sent.  Its ports are unbound first: no link opens meanwhile."""
        for port in self.ports:
            self.unbind(port)
        queues = list(self.rdv.queues.values())
        for queue in queues:
            queue.close(reason)
        await wait_all_sent(queues, timeout)
        self.close(reason)

    # -- async face --------------------------------------------------------------------

    async def connect_queue(self, broker_id: str, port: int, *,
                            receive_buffer: int = DEFAULT_RECEIVE_BUFFER) -> AsyncMessageQueue:
        """Connect and return our end of the link; raise :class:`rdv.RefusedError` if refused."""
        self._check()
        outcome: Future[AsyncMessageQueue | str] = Future()

        class _Waiter:
            def connected(self, queue: MessageQueue) -> None:
                if outcome.done():  # the caller was cancelled meanwhile
                    queue.abort("connect cancelled")
                    return
                outcome.set(AsyncMessageQueue(queue, receive_buffer=receive_buffer))

            def refused(self, reason: str) -> None:
                outcome.set(reason)

        self.rdv.connect(broker_id, port, _Waiter())
        try:
            result = await self._driven(outcome, f"connect to {broker_id}:{port}")
        except trio.Cancelled:
            outcome.set("cancelled")
            raise
        if isinstance(result, str):
            raise RefusedError(result, broker_id, port)
        return result

    async def _driven(self, outcome: Future[T], what: str) -> T:
        """``outcome``'s value once the pump sets it; :class:`ConfigError` if nothing runs
        the pump (checked each :data:`UNDRIVEN_CHECK` seconds), instead of waiting for
        ever."""
        while True:
            with trio.move_on_after(UNDRIVEN_CHECK):
                return await outcome.wait()
            if not self.pump.driven:
                raise ConfigError(
                    f"{what}: nothing runs the pump of universe {self.manager.name!r}, so "
                    f"nothing would ever answer: serve it (`await nursery.start("
                    f"manager.pump.serve)`, as open_universe does)")

    def accept_queue(self, port: int, *, receive_buffer: int = DEFAULT_RECEIVE_BUFFER
                     ) -> Coroutine[Any, Any, AsyncMessageQueue]:
        """Bind ``port`` now, then (awaited) wait for one connect, unbind, and return our
        end of the link.

        The bind happens when this is called, before the first await: a connect made
        after ``nursery.start_soon(broker.accept_queue, port)`` finds the port bound
        (a connect that comes before any bind is refused ``not bound``, never queued).
        Await what it returns, or hand it to a nursery: the port is unbound when the
        wait ends, however it ends.
        """
        self._check()
        outcome: Future[AsyncMessageQueue | None] = Future()

        class _Waiter:
            def accepted(self, queue: MessageQueue) -> None:
                if outcome.done():  # the caller was cancelled meanwhile
                    queue.abort("accept cancelled")
                    return
                outcome.set(AsyncMessageQueue(queue, receive_buffer=receive_buffer))

        self.rdv.bind(port, _Waiter())

        async def wait() -> AsyncMessageQueue:
            try:
                accepted = await self._driven(outcome, f"accept on port {port}")
            finally:
                outcome.set(None)
                if port in self.rdv.core.bound_ports():
                    self.rdv.unbind(port)
            assert accepted is not None
            return accepted

        return wait()

    async def serve_queues(
        self, port: int, handler: Callable[[AsyncMessageQueue], Awaitable[object]], *,
        receive_buffer: int = DEFAULT_RECEIVE_BUFFER,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Listen on ``port`` and run ``handler(queue)`` in a new task for every connect.

        Runs until cancelled (like ``trio.serve_tcp``); the port is unbound on exit.
        """
        self._check()
        async with trio.open_nursery() as nursery:

            class _Acceptor:
                def accepted(self, queue: MessageQueue) -> None:
                    nursery.start_soon(handler, AsyncMessageQueue(
                        queue, receive_buffer=receive_buffer))

            self.rdv.listen(port, _Acceptor())
            try:
                task_status.started()
                await trio.sleep_forever()
            finally:
                if port in self.rdv.core.bound_ports():
                    self.rdv.unbind(port)


class BrokerManager:
    """A universe: brokers by unique id, linked through memory on one pump.

    Several managers are several universes; a broker of one cannot see the
    brokers of another ("unknown broker").  ``busy_poll`` (seconds, default
    0) lets links to other processes poll a quiet socket that long before
    sleeping: lower latency for a busy core (see :class:`channels.StreamLink`).
    ``adaptive_poll`` (seconds, default 100 us; 0: off) polls only while a link's
    bytes keep coming back within it, and backs off when polls come up empty.
    ``identities`` (an :class:`rdv.Identities` or its file) says whom links from other
    processes may speak as and what each may do (None: every link may do everything);
    ``identity`` (a :class:`rdv.Credential` or ``NAME:SECRET``) is what this process's
    links say they are.
    """

    def __init__(self, name: str, *, pump: Pump | None = None,
                 ring_capacity: int = DEFAULT_RING_CAPACITY,
                 max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
                 high_water: int = DEFAULT_HIGH_WATER, low_water: int | None = None,
                 token: str = "", directory: Mapping[str, tuple[str, int]] | None = None,
                 busy_poll: float = 0.0,
                 adaptive_poll: float = DEFAULT_ADAPTIVE_POLL,
                 tls_server: ssl.SSLContext | None = None,
                 tls_client: ssl.SSLContext | None = None,
                 identities: Identities | str | os.PathLike[str] | None = None,
                 identity: Credential | str | None = None) -> None:
        if not isinstance(name, str) or not name:
            raise ConfigError("a universe needs a non-empty name")
        self.name = name
        self.pump = pump if pump is not None else Pump()
        self.channels = ChannelManager(self.pump, capacity=ring_capacity)
        self.queue_options: dict[str, int] = {
            "max_message_size": max_message_size, "high_water": high_water,
        }
        if low_water is not None:
            self.queue_options["low_water"] = low_water
        # Fail on bad limits now, not at the first link.
        if not max_message_size >= 0 or high_water > max_message_size:
            raise ConfigError(f"high_water ({high_water}) must not exceed max_message_size "
                             f"({max_message_size})")
        self._brokers: dict[str, Broker] = {}
        #: Other names links may use for a broker of this universe (e.g. ``@tracker``;
        #: ``@tracker.<suffix>`` reaches the same broker).
        self.aliases: dict[str, str] = {}
        #: Where brokers of this universe that live in other processes listen.
        self.resolver = Resolver(directory)
        #: The resolver's static part: broker id -> address, set by hand.
        self.directory = self.resolver.directory
        if not busy_poll >= 0:
            raise ConfigError(f"busy_poll must be a non-negative number of seconds, "
                             f"got {busy_poll!r}")
        if not adaptive_poll >= 0:
            raise ConfigError(f"adaptive_poll must be a non-negative number of seconds, "
                             f"got {adaptive_poll!r}")
        if identities is None:
            identities = OPEN
        elif not isinstance(identities, Identities):
            identities = Identities.load(identities)
        if isinstance(identity, str):
            identity = Credential.parse(identity) if identity else None
        self.net = NetNode(self.pump, self.channels, universe=name, token=token,
                           resolve_local=self.resolve_local, resolver=self.resolver,
                           tls_server=tls_server, tls_client=tls_client,
                           busy_poll=busy_poll, adaptive_poll=adaptive_poll,
                           identities=identities, credential=identity)

    @property
    def max_message_size(self) -> int:
        """The largest message body a link of this universe carries."""
        return self.queue_options["max_message_size"]

    @property
    def serves_tls(self) -> bool:
        """Whether links from other processes reach this one over TLS."""
        return self.net.tls_server is not None

    def use_tls_to(self, broker_id: str, context: ssl.SSLContext) -> None:
        """Dial ``broker_id`` over TLS with ``context`` (trusting what it trusts)."""
        self.net.use_tls_to(broker_id, context)

    async def serve_network(self, host: str = "127.0.0.1", port: int = 0, *,
                            task_status: trio.TaskStatus[Address] = trio.TASK_STATUS_IGNORED
                            ) -> None:
        """Accept links from other processes on ``host:port`` (and dial theirs) until cancelled.

        ``task_status.started`` gets the address actually bound (port 0 picks one).
        """
        await self.net.serve(host, port, task_status=task_status)

    def __repr__(self) -> str:
        return f"<BrokerManager {self.name!r} with {len(self._brokers)} brokers>"

    def add_broker(self, broker_id: str) -> Broker:
        """Create a broker with a unique id in this universe."""
        if not isinstance(broker_id, str) or not broker_id:
            raise ConfigError(f"a broker id must be a non-empty str, got {broker_id!r}")
        if broker_id in self._brokers:
            raise ConfigError(f"universe {self.name!r} already has a broker {broker_id!r}")
        broker = Broker(self, broker_id)
        self._brokers[broker_id] = broker
        return broker

    def broker(self, broker_id: str) -> Broker:
        try:
            return self._brokers[broker_id]
        except KeyError:
            raise KeyError(f"universe {self.name!r} has no broker {broker_id!r}") from None

    def __contains__(self, broker_id: object) -> bool:
        return broker_id in self._brokers

    @property
    def broker_ids(self) -> list[str]:
        return sorted(self._brokers)

    def forget(self, broker_id: str) -> None:
        """Take a closed broker out of the universe (``Broker.close`` does it)."""
        self._brokers.pop(broker_id, None)

    def resolve_local(self, broker_id: str) -> RdvNode | None:
        """The rendezvous of a broker of this process (or of an alias), or None."""
        broker = self._brokers.get(broker_id)
        if broker is None and broker_id.startswith("@"):
            # "@name" or "@name.anything": the suffix lets a client tell processes apart
            target = self.aliases.get(broker_id.partition(".")[0])
            broker = None if target is None else self._brokers.get(target)
        return None if broker is None else broker.rdv

    def close(self) -> None:
        """Close every broker of the universe."""
        for broker in list(self._brokers.values()):
            broker.close("universe closed")


class EchoListener:
    """The listener-style echo: install it on a queue (``queue.set_listener(
    EchoListener(queue))``) and every message goes back, in order; while the queue is
    full it stops reading, so the peer's sends meet backpressure, not a growing list."""

    def __init__(self, queue: MessageQueue) -> None:
        self.queue = queue
        self.backlog: deque[bytes] = deque()

    def received(self, message: bytes) -> None:
        self.backlog.append(message)
        self.drained()

    def drained(self) -> None:
        queue = self.queue
        try:
            while self.backlog:
                queue.send(self.backlog[0])
                self.backlog.popleft()
        except QueueFullError:
            queue.pause_reading()
            return
        queue.resume_reading()

    def closed(self, reason: str) -> None:
        pass


async def echo(queue: AsyncMessageQueue) -> None:
    """A ``serve_queues`` handler that sends every message back until the peer leaves."""
    try:
        async for message in queue:
            await queue.send(message)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass  # the peer went away; the link says why in its close reason
