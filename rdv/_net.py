"""The rendezvous over TCP: serve inbound links, dial outbound ones, same rules as in memory.

The handshake carries protocol version, universe, token, both broker ids and
the port; the decision (accept, or refuse with its reason) is taken by the
same rendezvous table, as a pump task, on the side that was dialled.
"""

from __future__ import annotations

import contextlib
import logging
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from channels import ChannelManager, MessageQueue, StreamLink
from pump import Pump

from ._address import Address
from ._core import UNAUTHORIZED, UNKNOWN_BROKER, Action, RdvEvent
from ._resolve import Resolver
from ._wire import FrameReader, HandshakeError, Hello, Reply, parse_hello, parse_reply

log = logging.getLogger("rdvpump.net")

DEFAULT_HANDSHAKE_TIMEOUT = 5.0
#: Connections still in their handshake at once; more wait in the kernel's backlog.
DEFAULT_MAX_PENDING = 64
#: Reason given when the address of a broker cannot be reached.
UNREACHABLE = "unreachable"


async def _read_frame(stream: trio.abc.Stream, reader: FrameReader) -> dict[str, object]:
    while True:
        data = await stream.receive_some(4096)
        if not data:
            raise HandshakeError("connection closed during the handshake")
        obj = reader.feed(data)
        if obj is not None:
            return obj


class NetNode:
    """The network face of one process's brokers in a universe.

    ``resolve_local(id)`` finds a broker's RdvNode in this process;
    ``resolver`` finds where brokers of other processes listen (a static
    directory, the name service).  Links run in the nursery of :meth:`serve`.
    """

    def __init__(self, pump: Pump, channels: ChannelManager, *, universe: str, token: str,
                 resolve_local: Callable[[str], Any], resolver: Resolver,
                 handshake_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT,
                 max_pending: int = DEFAULT_MAX_PENDING) -> None:
        self.pump = pump
        self.channels = channels
        self.universe = universe
        self.token = token
        self.resolve_local = resolve_local
        self.resolver = resolver
        self.handshake_timeout = handshake_timeout
        self._pending = trio.Semaphore(max_pending)
        self._nursery: trio.Nursery | None = None
        self.address: Address | None = None
        #: TLS for inbound and outbound links (see :func:`tls_contexts`); None: plain TCP.
        self.tls_server: ssl.SSLContext | None = None
        self.tls_client: ssl.SSLContext | None = None
        #: TLS for outbound links to particular brokers (by id), over ``tls_client``.
        self.tls_for: dict[str, ssl.SSLContext] = {}
        #: Seconds a link's receiver polls a quiet socket before it sleeps (0: never);
        #: trades a busy core for lower latency, see :class:`channels.StreamLink`.
        self.busy_poll = 0.0
        #: How outbound connections are opened (tests swap in memory streams).
        self.open_stream: Callable[[Address], Awaitable[trio.abc.Stream]] = (
            lambda address: trio.open_tcp_stream(*address))
        self.rejected: list[str] = []  # reasons bad connections were closed, newest last

    # -- serving ----------------------------------------------------------------------

    async def serve(self, host: str = "127.0.0.1", port: int = 0, *,
                    task_status: trio.TaskStatus[Address] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen for links on ``host:port`` (0: any free port) until cancelled."""
        try:
            listeners = await trio.open_tcp_listeners(port, host=host)
        except OSError as exc:
            raise OSError(f"cannot listen on {host}:{port}: "
                          f"{(exc.strerror or str(exc)).lower()}") from exc
        self.address = Address(*listeners[0].socket.getsockname()[:2])
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            try:
                task_status.started(self.address)
                await trio.serve_listeners(self._inbound, listeners, handler_nursery=nursery)
            finally:
                self._nursery = None

    async def run_stream(self, stream: trio.abc.Stream) -> None:
        """Handle one inbound connection given as a stream (tests use memory streams)."""
        await self._inbound(stream)

    async def serve_streams(self, address: Address, *,
                            task_status: trio.TaskStatus[Address] = trio.TASK_STATUS_IGNORED
                            ) -> None:
        """Like :meth:`serve` without a socket: inbound streams come via :meth:`spawn_inbound`."""
        self.address = address
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            try:
                task_status.started(address)
                await trio.sleep_forever()
            finally:
                self._nursery = None

    def spawn_inbound(self, stream: trio.abc.Stream) -> None:
        if self._nursery is None:
            raise OSError("connection refused: not serving")
        self._nursery.start_soon(self._inbound, stream)

    async def _inbound(self, stream: trio.abc.Stream) -> None:
        async with self._pending:
            try:
                with trio.fail_after(self.handshake_timeout):
                    if self.tls_server is not None:
                        stream = trio.SSLStream(stream, self.tls_server, server_side=True)
                        await stream.do_handshake()
                    reader = FrameReader()
                    hello = parse_hello(await _read_frame(stream, reader))
            except (HandshakeError, trio.TooSlowError, trio.BrokenResourceError) as exc:
                reason = "handshake timed out" if isinstance(exc, trio.TooSlowError) else str(exc)
                if isinstance(exc, trio.BrokenResourceError) and exc.__cause__ is not None:
                    reason = f"tls handshake failed: {exc.__cause__}"
                self._reject(reason)
                await trio.aclose_forcefully(stream)
                return
        if not hello.authorized(self.universe, self.token):
            self._reject(f"unauthorized connect from {hello.src!r}")
            await self._send_refusal(stream, UNAUTHORIZED)
            return
        decided = trio.Event()
        outcome: list[Any] = []
        self.pump.post("connect", self._decide, hello, outcome, decided)
        await decided.wait()
        reply, channel = outcome
        try:
            await stream.send_all(reply.encode())
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            if channel is not None:
                channel._peer_disconnected("connection lost during the handshake", True)
            await trio.aclose_forcefully(stream)
            return
        if channel is None:
            await stream.aclose()
            return
        await StreamLink(channel, stream, busy_poll=self.busy_poll).run(reader.rest)

    def _reject(self, reason: str) -> None:
        log.warning("closed a connection: %s", reason)
        self.rejected.append(reason)
        del self.rejected[:-100]

    async def _send_refusal(self, stream: trio.abc.Stream, reason: str) -> None:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await stream.send_all(Reply(False, reason=reason).encode())
        await trio.aclose_forcefully(stream)

    def _decide(self, hello: Hello, outcome: list[Any], decided: trio.Event) -> None:
        """Pump task: the rendezvous decision for an inbound connect."""
        try:
            target = self.resolve_local(hello.dst)
            if target is None or target.closed:
                outcome[:] = [Reply(False, reason=UNKNOWN_BROKER), None]
                self.pump.emit("refuse", broker=hello.dst, peer=hello.src, port=hello.port,
                               outcome="inbound", reason=UNKNOWN_BROKER)
                return
            transition = target.core.handle(RdvEvent.CONNECT, hello.port)
            if transition.action is Action.REFUSE:
                outcome[:] = [Reply(False, reason=transition.reason), None]
                self.pump.emit("refuse", broker=hello.dst, peer=hello.src, port=hello.port,
                               outcome="inbound", reason=transition.reason)
                return
            channel = self.channels.open_end(target.id, hello.src, hello.port, accepting=True)
            queue = MessageQueue(channel, **target._queue_options)
            target.queues.add(queue)
            self.pump.emit("accept", broker=target.id, peer=hello.src, port=hello.port,
                           link=channel.trace_link)
            self.pump.post("accept", target._acceptors[hello.port].accepted, queue, owner=queue)
            outcome[:] = [Reply(True, link=channel.link_id), channel]
        finally:
            decided.set()

    # -- dialling ---------------------------------------------------------------------

    def can_reach(self, dst: str) -> bool:
        """Whether ``dst`` might live in another process."""
        return self.resolver.can_reach(dst)

    def dial(self, node: Any, dst: str, port: int, listener: Any, *,
             address: Address | None = None) -> None:
        """Start an outbound connect of ``node`` to ``dst`` (called from a pump task).

        With ``address`` the broker is dialled there, without asking anyone.
        """
        if self._nursery is None:
            self._refuse(node, dst, port, listener, f"{UNREACHABLE}: network not served")
            return
        if address is not None:
            self._nursery.start_soon(self._dial_at, node, dst, address, port, listener)
        else:
            self._nursery.start_soon(self._dial, node, dst, port, listener)

    async def _dial_at(self, node: Any, dst: str, address: Address, port: int,
                       listener: Any) -> None:
        outcome = await self._attempt(node, dst, address, port)
        await self._finish_dial(node, dst, port, listener, outcome)

    def _refuse(self, node: Any, dst: str, port: int, listener: Any, reason: str) -> None:
        self.pump.emit("refuse", broker=node.id, peer=dst, port=port, reason=reason)
        self.pump.post("refuse", listener.refused, reason, owner=node._owner)

    async def _dial(self, node: Any, dst: str, port: int, listener: Any) -> None:
        address = await self.resolver.resolve(dst)
        if address is None:
            self._refuse(node, dst, port, listener, UNKNOWN_BROKER)
            return
        outcome = await self._attempt(node, dst, address, port)
        if isinstance(outcome, str) and self.resolver.sources and (
                outcome.startswith(UNREACHABLE) or outcome == UNKNOWN_BROKER):
            # The cached address may be stale: ask the name service again, once.
            fresh = await self.resolver.resolve(dst, fresh=True)
            if fresh is None:
                outcome = UNKNOWN_BROKER
            elif fresh != address:
                outcome = await self._attempt(node, dst, fresh, port)
        await self._finish_dial(node, dst, port, listener, outcome)

    async def _finish_dial(self, node: Any, dst: str, port: int, listener: Any,
                           outcome: str | tuple[trio.abc.Stream, Reply, bytes]) -> None:
        if isinstance(outcome, str):
            self._refuse(node, dst, port, listener, outcome)
            return
        stream, reply, rest = outcome
        assert reply.link is not None
        channel = self.channels.open_end(node.id, dst, port, link_id=reply.link)
        queue = MessageQueue(channel, **node._queue_options)
        node.queues.add(queue)
        self.pump.post("connected", listener.connected, queue, owner=queue)
        await StreamLink(channel, stream, busy_poll=self.busy_poll).run(rest)

    async def _attempt(self, node: Any, dst: str, address: Address,
                       port: int) -> str | tuple[trio.abc.Stream, Reply, bytes]:
        """One TCP connect and handshake: the refusal reason, or the stream to run."""
        try:
            with trio.fail_after(self.handshake_timeout):
                stream = await self.open_stream(address)
                tls = self.tls_for.get(dst, self.tls_client)
                if tls is not None:
                    stream = trio.SSLStream(stream, tls, server_hostname=address[0])
                try:
                    hello = Hello(self.universe, self.token, node.id, dst, port)
                    await stream.send_all(hello.encode())
                    reader = FrameReader()
                    reply = parse_reply(await _read_frame(stream, reader))
                except BaseException:
                    await trio.aclose_forcefully(stream)
                    raise
        except (OSError, trio.TooSlowError, HandshakeError, trio.BrokenResourceError) as exc:
            what = "timed out" if isinstance(exc, trio.TooSlowError) else str(exc)
            if isinstance(exc, trio.BrokenResourceError) and exc.__cause__ is not None:
                what = f"tls handshake failed: {exc.__cause__}"
            return f"{UNREACHABLE}: {what}"
        if not reply.accepted:
            await stream.aclose()
            return reply.reason or "refused"
        return stream, reply, reader.rest


def tls_contexts(cert: str, key: str, ca: str | None) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """Server and client contexts for links: our certificate both ways, peers checked
    against ``ca`` (mutual TLS when given; without it the system's roots check servers)."""
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(cert, key)
    client = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
    client.load_cert_chain(cert, key)
    if ca is not None:
        server.load_verify_locations(ca)
        server.verify_mode = ssl.CERT_REQUIRED
    return server, client
