"""The rendezvous over TCP: serve inbound links, dial outbound ones, same rules as in memory.

This is the transport: sockets, TLS, timeouts and trio tasks around the
sans-I/O handshake of :mod:`._handshake`.  The decision (accept, or refuse
with its reason) is :meth:`RdvNode.accept`, run as a pump task on the side
that was dialled: the same as in memory.
"""

from __future__ import annotations

import collections
import contextlib
import ipaddress
import logging
import socket
import ssl
from collections import OrderedDict
from collections.abc import Awaitable, Callable

import trio

from channels import DEFAULT_ADAPTIVE_POLL, Channel, ChannelManager, CloseCause, StreamLink
from pump import CollapsingLog, ConfigError, Future, Pump
from pump.schema import Kind, Outcome

from ._address import Address
from ._core import Refusal, RefusalReason
from ._handshake import NEED_DATA, Handshake, Role
from ._identity import OPEN, Credential, Identities, Identity
from ._listeners import Connecting
from ._node import RdvNode
from ._resolve import Resolver
from ._wire import HandshakeError, Hello, Reply

log = logging.getLogger("rdvpump.net")

DEFAULT_HANDSHAKE_TIMEOUT = 5.0
#: Connections in their handshake at once: at the cap, a new connection evicts (closes)
#: the oldest pending one.  A legitimate handshake takes milliseconds, so it is never
#: the oldest for long, while silent or trickling connections churn among themselves.
DEFAULT_MAX_PENDING = 256
#: Reason given when the address of a broker cannot be reached.
UNREACHABLE = Refusal.UNREACHABLE


async def _handshake_event(stream: trio.abc.Stream, handshake: Handshake) -> Hello | Reply:
    """Feed the handshake what arrives until it has its event."""
    while True:
        event = handshake.next_event()
        if event is not NEED_DATA:
            assert isinstance(event, (Hello, Reply))
            return event
        handshake.receive_data(await stream.receive_some(4096))


def _failure_kind(exc: BaseException, *, tls: bool = True) -> str:
    """The cause of a failed inbound handshake, as a value that carries no numbers: what
    a flood of them from one host is collapsed by."""
    if isinstance(exc, HandshakeError):
        return exc.fault
    if isinstance(exc, trio.TooSlowError):
        return "timed out"
    if tls and isinstance(exc, trio.BrokenResourceError) and isinstance(exc.__cause__,
                                                                         ssl.SSLError):
        return "tls handshake failed"
    return type(exc).__name__


def _failure(exc: BaseException, *, tls: bool = True) -> str:
    """What went wrong with a connection, in words: one mapping for both directions."""
    if isinstance(exc, trio.TooSlowError):
        return "timed out"
    if tls and isinstance(exc, trio.BrokenResourceError) and isinstance(exc.__cause__,
                                                                         ssl.SSLError):
        return f"tls handshake failed: {exc.__cause__}"
    if isinstance(exc, trio.BrokenResourceError) and exc.__cause__ is not None:
        return f"connection lost: {exc.__cause__}"
    if isinstance(exc, OSError) and exc.strerror and exc.filename is None:
        return exc.strerror.lower()  # "name or service not known", not "[Errno -2] ..."
    return str(exc)


def _peer_host(stream: trio.abc.Stream) -> str:
    """``HOST:PORT`` of the peer of a socket stream (``?`` for other streams)."""
    sock = getattr(stream, "socket", None)
    try:
        host, port = sock.getpeername()[:2]  # type: ignore[union-attr]
    except (AttributeError, OSError, ValueError):
        return "?"
    return f"{host}:{port}"


#: Seconds a link's sent bytes may go unacknowledged by the peer's host before the link
#: is closed (``TCP_USER_TIMEOUT``), and an idle link's keepalive: a probe after 2 s of
#: quiet, then every second, three unanswered closing it.  What a member's beats watch
#: is found sooner by them; this closes what none watches, the half-open connections a
#: host cut off without a reset leaves (a manager's, a tracker's, a client's), in about
#: 5 s: well over the longest stall of a live connection at 2 % loss (one segment lost
#: three times running waits 1.4 s), well under the name service's expiry.
DEFAULT_TCP_USER_TIMEOUT = 5.0
_KEEPALIVE = ((socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1),
              (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPIDLE", 4), 2),
              (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPINTVL", 5), 1),
              (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPCNT", 6), 3))


def watch_silence(stream: trio.abc.Stream, user_timeout: float) -> None:
    """Keepalive and ``TCP_USER_TIMEOUT`` on a link's TCP socket (nothing for another
    stream, or where the platform has no such option)."""
    if not isinstance(stream, trio.SocketStream) or user_timeout <= 0:
        return
    options = [*_KEEPALIVE]
    if hasattr(socket, "TCP_USER_TIMEOUT"):
        options.append((socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT,
                        int(user_timeout * 1000)))
    for level, option, value in options:
        with contextlib.suppress(OSError):
            stream.setsockopt(level, option, value)


#: Congestion control for a link whose two ends are on one host (``TCP_CONGESTION``):
#: Reno, which every Linux kernel has built in and lets any process choose.  Such a link
#: crosses no bottleneck and loses nothing, so every algorithm sends alike on it; but a
#: pacing one (BBR, where it is the system's default) arms a timer and updates its model
#: as it sends, work the link pays for nothing (a sixth of the CPU a delivery took in
#: ``bench cluster``).  It is set before the connection exists: on a socket before it
#: dials a loopback address (:func:`open_tcp_stream`), on a listener bound to one (its
#: connections inherit it).  Set on a connection already made, it leaves the pacing of
#: the algorithm before it on, and costs more than it saves.  Links to and from other
#: hosts, and those a wildcard listener takes, keep the system's choice.
LOCAL_CONGESTION = "reno"


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a literal loopback address (``::ffff:127.0.0.1`` too)."""
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def local_congestion(sock: socket.socket | trio.socket.SocketType) -> None:
    """:data:`LOCAL_CONGESTION` on a socket not connected yet (nothing where the platform
    has no such option or refuses it)."""
    option = getattr(socket, "TCP_CONGESTION", None)
    if option is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, option, LOCAL_CONGESTION.encode())


async def open_tcp_stream(address: Address | tuple[str, int]) -> trio.SocketStream:
    """A TCP connection to ``(host, port)``: to a literal loopback address from a socket
    made with :data:`LOCAL_CONGESTION`; to any other, by ``trio.open_tcp_stream``."""
    host, port = address
    if not is_loopback(host):
        return await trio.open_tcp_stream(host, port)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = trio.socket.socket(family, socket.SOCK_STREAM)
    try:
        local_congestion(sock)
        await sock.connect((host, port))
    except BaseException:
        sock.close()
        raise
    return trio.SocketStream(sock)


#: What goes wrong while connecting: the peer, the network, or the clock.
_CONNECT_ERRORS = (OSError, trio.TooSlowError, HandshakeError, trio.BrokenResourceError)


class NetNode:
    """The network face of one process's brokers in a universe.

    ``resolve_local(id)`` finds a broker's RdvNode in this process;
    ``resolver`` finds where brokers of other processes listen (a static
    directory, the name service).  Links run in the nursery of :meth:`serve`.
    """

    def __init__(self, pump: Pump, channels: ChannelManager, *, universe: str, token: str,
                 resolve_local: Callable[[str], RdvNode | None], resolver: Resolver,
                 handshake_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT,
                 max_pending: int = DEFAULT_MAX_PENDING,
                 tls_server: ssl.SSLContext | None = None,
                 tls_client: ssl.SSLContext | None = None,
                 busy_poll: float = 0.0, adaptive_poll: float = DEFAULT_ADAPTIVE_POLL,
                 identities: Identities = OPEN, credential: Credential | None = None,
                 tcp_user_timeout: float = DEFAULT_TCP_USER_TIMEOUT) -> None:
        self.pump = pump
        self.channels = channels
        self.universe = universe
        self.token = token
        #: Whom links from other processes may speak as (:class:`Identities`; OPEN: every
        #: link may do everything), and what this process says it is when it dials.
        self.identities = identities
        self.credential = credential
        #: Keepalive and ``TCP_USER_TIMEOUT`` (seconds; 0: the system's) on every link's
        #: socket (:data:`DEFAULT_TCP_USER_TIMEOUT`).
        self.tcp_user_timeout = tcp_user_timeout
        self.resolve_local = resolve_local
        self.resolver = resolver
        self.handshake_timeout = handshake_timeout
        self.max_pending = max_pending
        self._pending: OrderedDict[int, trio.CancelScope] = OrderedDict()
        self._pending_seq = 0
        self._warnings = CollapsingLog(log, pump)
        self._nursery: trio.Nursery | None = None
        self.address: Address | None = None
        #: TLS for inbound and outbound links (see :func:`tls_contexts`); None: plain TCP.
        self.tls_server = tls_server
        self.tls_client = tls_client
        #: TLS for outbound links to particular brokers (by id), over ``tls_client``
        #: (:meth:`use_tls_to`).
        self.tls_for: dict[str, ssl.SSLContext] = {}
        #: Seconds a link's receiver polls a quiet socket before it sleeps (0: never);
        #: trades a busy core for lower latency, see :class:`channels.StreamLink`.
        self.busy_poll = busy_poll
        #: The links' adaptive polling (see :class:`channels.StreamLink`); 0: off.
        self.adaptive_poll = adaptive_poll
        #: How outbound connections are opened (tests swap in memory streams).
        self.open_stream: Callable[[Address], Awaitable[trio.abc.Stream]] = open_tcp_stream
        self.rejected: list[str] = []  # reasons bad connections were closed, newest last
        #: the cause of each of them (what a flood of them is collapsed by in the log)
        self.rejected_causes: list[str] = []
        #: Every connection closed at its handshake, by kind (a process's metrics)
        self.rejections: collections.Counter[str] = collections.Counter()

    # -- serving ----------------------------------------------------------------------

    def use_tls_to(self, broker_id: str, context: ssl.SSLContext) -> None:
        """Dial ``broker_id`` over TLS with ``context`` (instead of ``tls_client``)."""
        self.tls_for[broker_id] = context

    async def serve(self, host: str = "127.0.0.1", port: int = 0, *,
                    task_status: trio.TaskStatus[Address] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen for links on ``host:port`` (0: any free port) until cancelled."""
        try:
            listeners = await trio.open_tcp_listeners(port, host=host)
        except OSError as exc:
            raise OSError(f"cannot listen on {host}:{port}: "
                          f"{(exc.strerror or str(exc)).lower()}") from exc
        for listener in listeners:
            if is_loopback(listener.socket.getsockname()[0]):
                local_congestion(listener.socket)  # before it takes a connection
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
        handshake = Handshake(Role.ACCEPTOR)
        source = _peer_host(stream)
        watch_silence(stream, self.tcp_user_timeout)
        shaken = await self._hello(stream, handshake, source)
        if shaken is None:
            return
        stream, hello = shaken
        if not hello.authorized(self.universe, self.token):
            await self._refuse(stream, handshake, source, f"unauthorized connect from "
                               f"{hello.src!r} to {hello.dst!r}", Refusal.UNAUTHORIZED)
            return
        identity = self.identities.verify(hello.identity, hello.secret)
        if identity is None:
            why = (f"identity {hello.identity!r} is not one of this process's, or its secret "
                   "is wrong")
            await self._refuse(stream, handshake, source,
                               f"connect from {hello.src!r} to {hello.dst!r}: {why}",
                               f"{Refusal.UNAUTHORIZED}: {why}")
            return
        decided: Future[Channel | Refusal] = Future()
        self.pump.post("connect", self._decide, hello, decided, identity, source)
        result = await decided.wait()
        if isinstance(result, Refusal):
            reply = Reply(False, reason=result)
        else:
            reply = Reply(True, link=result.link_id)
        try:
            await stream.send_all(handshake.send(reply))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            if isinstance(result, Channel):
                result.peer_ended("connection lost during the handshake", CloseCause.LOST)
            await trio.aclose_forcefully(stream)
            return
        if isinstance(result, Refusal):
            await stream.aclose()
            return
        await StreamLink(result, stream, busy_poll=self.busy_poll,
                         adaptive_poll=self.adaptive_poll).run(handshake.trailing_data)

    async def _hello(self, stream: trio.abc.Stream, handshake: Handshake, source: str
                     ) -> tuple[trio.abc.Stream, Hello] | None:
        """The connector's hello (after TLS's handshake, if any), within
        :attr:`handshake_timeout`, among at most :attr:`max_pending` pending handshakes (a
        new one past them evicts the oldest); None, the stream closed and the rejection
        counted, if it never came."""
        if len(self._pending) >= self.max_pending:
            _, oldest = self._pending.popitem(last=False)
            oldest.cancel()  # its task closes it and says why
        self._pending_seq += 1
        key = self._pending_seq
        scope = self._pending[key] = trio.CancelScope()
        hello: Hello | None = None
        failed: str | None = None
        kind: str = "evicted"
        try:
            with scope, trio.fail_after(self.handshake_timeout):
                if self.tls_server is not None:
                    stream = trio.SSLStream(stream, self.tls_server, server_side=True)
                    await stream.do_handshake()
                hello = await _handshake_event(stream, handshake)  # type: ignore[assignment]
        except (HandshakeError, trio.TooSlowError, trio.BrokenResourceError) as exc:
            failed = _failure(exc, tls=self.tls_server is not None)
            failed = "handshake timed out" if failed == "timed out" else failed
            kind = _failure_kind(exc, tls=self.tls_server is not None)
        finally:
            self._pending.pop(key, None)
        if hello is not None:
            return stream, hello
        if failed is None:
            failed = (f"evicted before its handshake: {self.max_pending} newer "
                      "connections were pending")
        self._reject(kind, failed, source)
        await trio.aclose_forcefully(stream)
        return None

    async def _refuse(self, stream: trio.abc.Stream, handshake: Handshake, source: str,
                      logged: str, reason: str) -> None:
        """An unauthorized connect: counted and logged (``logged``), refused with
        ``reason``, closed."""
        self._reject("unauthorized", logged, source)
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await stream.send_all(handshake.send(Reply(False, reason=reason)))
        await trio.aclose_forcefully(stream)

    def _reject(self, kind: str, reason: str, source: str) -> None:
        # one kind of failure from one host: collapsed by its cause (never by its text,
        # which carries sizes, ids and ports), so that a flood is a few lines
        host = source.rsplit(":", 1)[0]
        self._warnings.warn((kind, host), f"closed a connection from {source} ({kind}): "
                                          f"{reason}")
        self.rejected.append(reason)
        self.rejected_causes.append(str(kind))
        self.rejections[str(kind)] += 1
        del self.rejected[:-100], self.rejected_causes[:-100]

    def _decide(self, hello: Hello, decided: Future[Channel | Refusal],
                identity: Identity | None = None, source: str | None = None) -> None:
        """Pump task: the rendezvous decision for an inbound connect (a refusal if the
        decision itself fails: the dialler hears that, not a dropped connection)."""
        try:
            target = self.resolve_local(hello.dst)
            ends: list[Channel] = []

            def end() -> Channel:
                channel = self.channels.open_end(hello.dst, hello.src, hello.port,
                                                 accepting=True)
                channel.identity, channel.peer_address = identity, source
                ends.append(channel)
                return channel

            result = (Refusal.UNKNOWN_BROKER if target is None
                      else target.accept(hello.src, hello.port, end))
            if isinstance(result, Refusal):
                self.pump.emit(Kind.REFUSE, broker=hello.dst, peer=hello.src, port=hello.port,
                               outcome=Outcome.INBOUND, reason=str(result))
                decided.set(result)
            else:
                decided.set(ends[0])
        finally:
            decided.set(Refusal.OTHER)  # ignored once a decision was set

    # -- dialling ---------------------------------------------------------------------

    def can_reach(self, dst: str) -> bool:
        """Whether ``dst`` might live in another process."""
        return self.resolver.can_reach(dst)

    def dial(self, node: RdvNode, dst: str, port: int, listener: Connecting, *,
             address: Address | None = None) -> None:
        """Start an outbound connect of ``node`` to ``dst`` (called from a pump task).

        With ``address`` the broker is dialled there, without asking anyone.
        """
        if self._nursery is None:
            node.refuse(dst, port, listener,
                        RefusalReason(Refusal.UNREACHABLE, "network not served"))
            return
        self._nursery.start_soon(self._dial, node, dst, port, listener, address)

    async def _dial(self, node: RdvNode, dst: str, port: int, listener: Connecting,
                    address: Address | None) -> None:
        if address is not None:
            outcome = await self._attempt(node, dst, address, port)
        else:
            address = await self.resolver.resolve(dst)
            if address is None:
                node.refuse(dst, port, listener, RefusalReason(Refusal.UNKNOWN_BROKER))
                return
            outcome = await self._attempt(node, dst, address, port)
            if isinstance(outcome, RefusalReason) and self.resolver.sources and (
                    outcome.refusal in (Refusal.UNREACHABLE, Refusal.UNKNOWN_BROKER)):
                # The cached address may be stale: ask the name service again, once.
                fresh = await self.resolver.resolve(dst, fresh=True)
                if fresh is None:
                    outcome = RefusalReason(Refusal.UNKNOWN_BROKER)
                elif fresh != address:
                    address = fresh
                    outcome = await self._attempt(node, dst, fresh, port)
        if isinstance(outcome, RefusalReason):
            node.refuse(dst, port, listener, outcome)
            return
        stream, reply, rest = outcome
        assert reply.link is not None
        channel = self.channels.open_end(node.id, dst, port, link_id=reply.link)
        channel.peer_address = f"{address[0]}:{address[1]}"  # the address dialled
        node.connected(channel, listener)
        await StreamLink(channel, stream, busy_poll=self.busy_poll,
                         adaptive_poll=self.adaptive_poll).run(rest)

    async def _attempt(self, node: RdvNode, dst: str, address: Address, port: int
                       ) -> RefusalReason | tuple[trio.abc.Stream, Reply, bytes]:
        """One TCP connect and handshake: the refusal, or the stream to run."""
        handshake = Handshake(Role.DIALLER)
        try:
            with trio.fail_after(self.handshake_timeout):
                stream = await self.open_stream(address)
                watch_silence(stream, self.tcp_user_timeout)
                tls = self.tls_for.get(dst, self.tls_client)
                if tls is not None:
                    stream = trio.SSLStream(stream, tls, server_hostname=address[0])
                try:
                    credential = self.credential
                    hello = Hello(self.universe, self.token, node.id, dst, port,
                                  identity=None if credential is None else credential.name,
                                  secret=None if credential is None else credential.secret)
                    await stream.send_all(handshake.send(hello))
                    reply = await _handshake_event(stream, handshake)
                except BaseException:
                    await trio.aclose_forcefully(stream)
                    raise
        except _CONNECT_ERRORS as exc:
            return RefusalReason(Refusal.UNREACHABLE, _failure(exc))
        assert isinstance(reply, Reply)
        if not reply.accepted:
            await stream.aclose()
            return RefusalReason.parse(reply.reason or "refused")
        return stream, reply, handshake.trailing_data


def _why(exc: ssl.SSLError) -> str:
    """OpenSSL's reason, when it gives one that says more than where it failed."""
    return f" ({exc.reason.lower().replace('_', ' ')})" if exc.reason else ""


def tls_contexts(cert: str, key: str, ca: str | None) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """Server and client contexts for links: our certificate both ways, peers checked
    against ``ca`` (mutual TLS when given; without it the system's roots check servers)."""
    try:
        server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server.load_cert_chain(cert, key)
    except ssl.SSLError as exc:  # an OSError without a file name: say which files
        raise ConfigError(f"{cert} and {key} are not a PEM certificate and its private "
                          f"key{_why(exc)}") from None
    try:
        client = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
    except ssl.SSLError as exc:
        raise ConfigError(f"{ca} holds no PEM certificate of a CA{_why(exc)}") from None
    client.load_cert_chain(cert, key)
    if ca is not None:
        server.load_verify_locations(ca)
        server.verify_mode = ssl.CERT_REQUIRED
    return server, client
