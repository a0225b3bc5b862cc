"""Channel: one side of a full-duplex link over two rings, and the ChannelManager making pairs.

Writes go into one ring, reads come from the other; the pump carries the
"readable", "writable" and "closed" notifications between the two sides.
The other end of a link is the channel's *peer*: another Channel in memory,
or a StreamLink across a socket; both speak :class:`LinkPeer`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any, Protocol

import trio

from pump import Pump

from ._cause import CloseCause
from ._messages import Gather
from ._protocols import ChannelListener, LinkObserver, LinkPeer
from ._ring import RingBuffer

#: Ring capacity per direction when none is given (a power of two).
DEFAULT_RING_CAPACITY = 1 << 18


class Channel:
    """One side of a full-duplex link.

    ``write`` never blocks and may be partial; ``read`` returns what is there.
    The disconnect rule: after ``disconnect()`` this side's own reads and
    writes raise ``trio.ClosedResourceError``; the peer still reads every byte
    written before the disconnect, then reads ``b""`` with :attr:`at_eof` set
    and gets ``closed(reason)``; the peer's writes raise
    ``trio.BrokenResourceError`` (nothing is dropped silently).

    Layers above that move bytes themselves (the message queue's codec, a
    stream link) use the rings (:attr:`tx_ring`, :attr:`rx_ring`) and tell the
    channel with :meth:`notify_written` and :meth:`notify_consumed`.
    """

    __slots__ = (
        "pump", "link_id", "local", "remote", "port", "tx_ring", "rx_ring", "_peer",
        "_listener", "_read_posted", "_write_posted", "_blocked", "_disconnected",
        "peer_reason", "peer_cause", "_closed_posted", "_closed_delivered", "_close_reason",
        "_owner", "ends_whole", "accepting", "trace_link", "tx_dir", "rx_dir", "observer",
        "_carried", "_carried_off", "_sent_event", "_on_arrival", "tell_peer", "identity",
        "peer_address", "on_behind", "_rx_used", "_rx_half", "direct",
    )

    def __init__(self, pump: Pump, tx: RingBuffer, rx: RingBuffer, *, link_id: int,
                 local: str, remote: str, port: int, accepting: bool = False) -> None:
        self.pump = pump
        self.link_id = link_id
        self.local = local
        self.remote = remote
        self.port = port
        self.accepting = accepting  # this end was accepted (the other end connected)
        #: The link in traces: the accepting broker and the link id, the same on both ends.
        self.trace_link = f"{local if accepting else remote}/{link_id}"
        #: Directions in traces of what this end writes and of what it reads.
        self.tx_dir, self.rx_dir = ("ac", "ca") if accepting else ("ca", "ac")
        #: The ring this end writes into, and the one it reads from.
        self.tx_ring = tx
        self.rx_ring = rx
        #: Told what happens on this end when the pump traces; None otherwise.
        self.observer: LinkObserver | None = pump.link_trace(
            local, remote, port, self.trace_link, self.tx_dir, self.rx_dir)
        self._peer: LinkPeer | None = None
        #: What :meth:`notify_written` calls (read it, the channel sets it): the peer's
        #: ``data_arrived``, or, when the peer is a channel in this process whose reader
        #: pulls, that reader's :attr:`on_arrival` itself (one call less for every
        #: write); None once the peer is gone.
        self.tell_peer: Callable[[], None] | None = None
        self._listener: ChannelListener | None = None
        self._owner: object = None  # None: the channel itself (no cycle through it)
        #: Set by :meth:`disconnect`: this side's bytes end on a frame boundary.
        self.ends_whole = True
        self._read_posted = False
        self._write_posted = False
        self._blocked = False
        self._disconnected: str | None = None
        #: Why the peer disconnected, and how its end ended (None while it has not);
        #: read them, the channel sets them.
        self.peer_reason: str | None = None
        self.peer_cause: CloseCause | None = None
        self._closed_posted = False
        self._closed_delivered = False
        self._close_reason: str | None = None
        self._carried = False  # a transport (a socket) takes the bytes away from the ring
        self._carried_off = False  # and it has sent the last it will
        self._sent_event: trio.Event | None = None
        self._on_arrival: Callable[[], None] | None = None
        #: Set with :attr:`on_arrival`: called when bytes wait faster than the reader
        #: takes them (the peer in this process could not write everything, or bytes
        #: that arrived left the ring half full or more); it may read them ahead.
        self.on_behind: Callable[[], None] | None = None
        self._rx_used = rx.used_counter()
        self._rx_half = rx.capacity // 2  # a ring that grows keeps the mark it was made with
        #: Who the peer proved to be at the handshake (the rendezvous layer's identity,
        #: whose rights the services check); None: a link within this process.
        self.identity: Any = None
        #: The peer's network address (``host:port``) on a link from another process.
        self.peer_address: str | None = None
        #: Set by a transport that can take a large frame straight from its pieces while
        #: :attr:`tx_ring` is empty (a plain TCP socket's :class:`StreamLink`): ``direct
        #: (message)`` sends what the socket takes now, as :func:`send_frame` counts it
        #: (0 when nothing left); the queue puts the rest into the ring.  None: the ring.
        self.direct: Callable[[bytes | Gather], int] | None = None

    def __repr__(self) -> str:
        return f"<Channel link={self.link_id} {self.local}->{self.remote}:{self.port}>"

    def attach_peer(self, peer: LinkPeer, *, transport: bool = False) -> None:
        """Connect this end to the other end of its link (done once, when the link forms).

        ``transport``: the peer carries this end's bytes away from the ring on its own (a
        socket), and calls :meth:`transport_ended` once it has sent the last of them;
        otherwise a byte in the ring is already within the other end's reach.
        """
        self._peer = peer
        self._carried = transport
        self.peer_pulls(peer.on_arrival if type(peer) is Channel else None)

    @property
    def on_arrival(self) -> Callable[[], None] | None:
        """Set by a reader that takes bytes out of :attr:`rx_ring` itself when it wants
        them (:meth:`MessageQueue.set_pull`): called when bytes arrive, in place of the
        ``readable()`` task.  The peer's disconnect still posts ``readable()``."""
        return self._on_arrival

    @on_arrival.setter
    def on_arrival(self, arrival: Callable[[], None] | None) -> None:
        self._on_arrival = arrival
        peer = self._peer
        if type(peer) is Channel:  # the peer's writes call the reader directly
            peer.peer_pulls(arrival)

    def peer_pulls(self, arrival: Callable[[], None] | None) -> None:
        """The peer's reader pulls, told of bytes by ``arrival`` (None: it does not):
        what :meth:`notify_written` calls from now on."""
        peer = self._peer
        if peer is not None:
            self.tell_peer = arrival if arrival is not None else peer.data_arrived

    def rx_growable(self) -> bool:
        """Whether the incoming ring may grow (:meth:`RingBuffer.grow`): a transport
        fills it, which holds no view of it between its reads, and no writer in this
        process keeps its capacity."""
        return self._carried

    def transport_ended(self) -> None:
        """The transport sent every byte it will send for this end (or can send no more)."""
        self._carried_off = True
        self._wake_sent()

    @property
    def sent_out(self) -> bool:
        """Nothing more leaves this end (it disconnected, or its peer did: no one reads
        what it would write) and every byte it wrote has left it (over a socket: handed
        to the kernel, or the connection was lost)."""
        return ((self._disconnected is not None or self.peer_reason is not None)
                and (not self._carried or self._carried_off))

    async def wait_sent(self) -> None:
        """Wait for :attr:`sent_out`: a process that ends after this loses nothing it
        wrote before its disconnect.  Bound it with a timeout: a peer that does not read
        holds it."""
        while not self.sent_out:
            if self._sent_event is None:
                self._sent_event = trio.Event()
            await self._sent_event.wait()

    def _wake_sent(self) -> None:
        if self._sent_event is not None and self.sent_out:
            self._sent_event.set()
            self._sent_event = None

    # -- pump owner protocol -----------------------------------------------------------

    def trace_ids(self) -> tuple[str | None, str | None, int | None, str | None]:
        return self.local, self.remote, self.port, self.trace_link

    def task_failed(self, exc: BaseException) -> None:
        self.disconnect(f"listener error: {exc!r}", cause=CloseCause.ABORTED)

    # -- listener ----------------------------------------------------------------------

    def set_listener(self, listener: ChannelListener | None, *, owner: object = None) -> None:
        """Install the listener; pending bytes or a pending close are announced at once.

        ``owner`` is failed by the pump when a notification raises (default: the channel).
        """
        self._listener = listener
        if owner is not None:
            self._owner = owner
        if listener is None:
            return
        if self._closed_posted and not self._closed_delivered:
            owner = self if self._owner is None else self._owner
            self.pump.post("close", self._run_closed, self._close_reason, owner=owner)  # type: ignore[arg-type]
        elif self.rx_ring.used or self.peer_reason is not None:
            self._post_readable()

    @property
    def capacity(self) -> int:
        return self.tx_ring.capacity

    @property
    def disconnected(self) -> bool:
        """True once this side called :meth:`disconnect`."""
        return self._disconnected is not None

    @property
    def peer_disconnected(self) -> bool:
        return self.peer_reason is not None

    @property
    def at_eof(self) -> bool:
        """The peer disconnected and every byte it wrote was read."""
        return self.peer_reason is not None and self.rx_ring.used == 0

    # -- I/O ---------------------------------------------------------------------------

    def write(self, data: bytes | bytearray | memoryview) -> int:
        """Copy in as much of ``data`` as fits; return the count (0 when the ring is full).

        When not everything fit, ``writable()`` follows once room frees.
        """
        self._check_writable()
        n = self.tx_ring.write(data)
        if self.observer is not None:
            self.observer.moved("write", n, n < len(data))
        if n < len(data):
            self._blocked = True  # before notify_written(): a peer may drain at once
            self._tell_blocked()
        if n:
            self.notify_written()
        return n

    def read(self, max_bytes: int = -1) -> bytes:
        """Take up to ``max_bytes`` (all when negative); ``b""`` when none is there."""
        if self._disconnected is not None:
            raise trio.ClosedResourceError(f"channel was disconnected: {self._disconnected}")
        data = self.rx_ring.read(max_bytes)
        if self.observer is not None and data:
            self.observer.moved("read", len(data), False)
        self.notify_consumed(len(data))
        return data

    def readinto(self, buf: bytearray | memoryview) -> int:
        if self._disconnected is not None:
            raise trio.ClosedResourceError(f"channel was disconnected: {self._disconnected}")
        n = self.rx_ring.readinto(buf)
        if self.observer is not None and n:
            self.observer.moved("read", n, False)
        self.notify_consumed(n)
        return n

    def _check_writable(self) -> None:
        if self._disconnected is not None:
            raise trio.ClosedResourceError(f"channel was disconnected: {self._disconnected}")
        if self.peer_reason is not None:
            raise trio.BrokenResourceError(f"peer disconnected: {self.peer_reason}")

    # -- hooks for layers that move bytes through the rings themselves ------------------

    def notify_written(self) -> None:
        """Bytes went into :attr:`tx_ring`: tell the peer."""
        tell = self.tell_peer
        if tell is not None:
            tell()

    def notify_consumed(self, n: int | bool) -> None:
        """``n`` bytes (or, as a bool, some bytes) left :attr:`rx_ring`: tell the peer,
        whose writer may wait for room; once the peer is gone and the ring is empty, the
        close follows."""
        peer = self._peer
        if n and peer is not None:
            peer.room_freed()
        if self.peer_reason is not None and self.rx_ring.used == 0:
            self._post_closed(f"peer disconnected ({self.peer_reason})")

    def want_writable(self) -> None:
        """Not everything fit into :attr:`tx_ring`: ``writable()`` follows when room frees.

        Call it *before* :meth:`notify_written`: a peer that drains at once must
        find us waiting, or its notice is lost.
        """
        self._blocked = True
        self._tell_blocked()

    def _tell_blocked(self) -> None:
        peer = self._peer
        if type(peer) is Channel:
            peer.writer_blocked()

    def request_read(self) -> None:
        """Post ``readable()`` unless one is pending (a reader that paused resumes)."""
        if not self._read_posted and self._listener is not None:
            self._post_readable()

    # -- the peer interface: what the other end of the link calls on us ----------------

    def data_arrived(self) -> None:
        """The peer put bytes into our rx ring: announce them once (or tell the reader
        that pulls them, :attr:`on_arrival`)."""
        arrival = self._on_arrival
        if arrival is not None:
            arrival()
            behind = self.on_behind
            if behind is not None and self._rx_used() >= self._rx_half:
                behind()
        elif not self._read_posted and self._listener is not None:
            self._post_readable()

    def writer_blocked(self) -> None:
        """The peer in this process could not write everything into our rx ring (it
        waits for room): a reader that pulls is told (:attr:`on_behind`)."""
        behind = self.on_behind
        if behind is not None and self._on_arrival is not None:
            behind()

    def room_freed(self) -> None:
        """The peer took bytes from our tx ring: wake our writer if it waits for room."""
        if self._blocked and not self._write_posted:
            self._write_posted = True
            owner = self if self._owner is None else self._owner
            self.pump.post("write", self._run_writable, owner=owner)  # type: ignore[arg-type]

    def peer_ended(self, reason: str, cause: CloseCause) -> None:
        """The peer disconnected: we read what is left, then see the close."""
        if self.peer_reason is not None or self._disconnected is not None:
            return
        self.peer_reason = reason
        self.peer_cause = cause
        self._blocked = False
        self._wake_sent()
        if self.rx_ring.used == 0:
            self._post_closed(f"peer disconnected ({reason})")
        elif not self._read_posted and self._listener is not None:
            self._post_readable()

    # -- notifications -----------------------------------------------------------------

    def _post_readable(self) -> None:
        self._read_posted = True
        owner = self if self._owner is None else self._owner
        self.pump.post("read", self._run_readable, owner=owner)  # type: ignore[arg-type]

    def _run_readable(self) -> None:
        self._read_posted = False
        listener = self._listener
        if listener is None or self._closed_posted:
            return
        if self.rx_ring.used:
            listener.readable()
        elif self.peer_reason is not None:
            self._post_closed(f"peer disconnected ({self.peer_reason})")

    def _run_writable(self) -> None:
        self._write_posted = False
        if self._blocked and self._disconnected is None and self.peer_reason is None:
            self._blocked = False
            listener = self._listener
            if listener is not None:
                listener.writable()

    def _post_closed(self, reason: str) -> None:
        if self._closed_posted:
            return
        self._closed_posted = True
        self._close_reason = reason
        owner = self if self._owner is None else self._owner
        self.pump.post("close", self._run_closed, reason, owner=owner)  # type: ignore[arg-type]

    def _run_closed(self, reason: str) -> None:
        listener = self._listener
        if listener is not None and not self._closed_delivered:
            self._closed_delivered = True
            observer = self.observer
            if observer is not None and not getattr(listener, "traces_close", False):
                observer.closed(reason)  # a queue traces its own close, with its reason
            listener.closed(reason)
            # nothing more is told: let go of the listener, so that a closed link's
            # objects (and buffers) go as soon as their last reference does
            self._listener = None
            self._owner = None

    # -- disconnect --------------------------------------------------------------------

    def disconnect(self, reason: str = "disconnected", *,
                   cause: CloseCause = CloseCause.CLEAN, whole: bool = True) -> None:
        """End this side.  Idempotent; later own reads and writes raise.

        ``cause`` tells the peer how the link ended.  ``whole``: what was written ends
        on a frame boundary, so a stream may carry a close frame after it.
        """
        if self._disconnected is not None:
            return
        self._disconnected = reason
        self.ends_whole = whole
        self._blocked = False
        if self.observer is not None:
            self.observer.disconnected(reason, cause.value)
        peer = self._peer
        if peer is not None:
            peer.peer_ended(reason, cause)
            self._peer = None
            self.tell_peer = None
        self._wake_sent()
        self._post_closed(reason)


class LinkGate(Protocol):
    """What :attr:`ChannelManager.gate` is: a simulation's say over in-memory links.

    ``refusal(src, dst)`` is why ``src`` cannot reach ``dst`` now (a partition, a
    crashed broker), or None; ``join(a, b)`` gets the two ends of every new link
    (``a`` connected, ``b`` accepted), each with its own rings, and must join them
    (through a :class:`~channels.FaultLink`).
    """

    def refusal(self, src: str, dst: str) -> str | None: ...

    def join(self, a: Channel, b: Channel) -> None: ...


class ChannelManager:
    """Creates the two rings of each link and hands back the two connected channels.

    Link ids are numbered from 1 in creation order, so a program replayed with
    the same seed numbers its links the same way.  With a :attr:`gate` set, new
    in-memory links are relayed (four rings) and the gate joins their ends.
    """

    def __init__(self, pump: Pump, *, capacity: int = DEFAULT_RING_CAPACITY) -> None:
        RingBuffer(capacity)  # validate early: a bad capacity fails here, not at first link
        self.pump = pump
        self.capacity = capacity
        self._link_ids = itertools.count(1)
        #: A simulation's gate over in-memory links (:class:`LinkGate`); None: direct links.
        self.gate: LinkGate | None = None

    def open_end(self, local: str, remote: str, port: int, *,
                 link_id: int | None = None, accepting: bool = False) -> Channel:
        """One channel with its two rings, whose peer (a StreamLink) is attached later.

        ``accepting`` says this end was accepted; the dialling end passes the
        ``link_id`` the accepting side chose.
        """
        if link_id is None:
            link_id = next(self._link_ids)
        return Channel(self.pump, RingBuffer(self.capacity), RingBuffer(self.capacity),
                       link_id=link_id, local=local, remote=remote, port=port,
                       accepting=accepting)

    def open_pair(self, a: str, b: str, port: int) -> tuple[Channel, Channel]:
        """Return ``(a_side, b_side)`` of a new link: ``a`` connected, ``b`` accepted."""
        link_id = next(self._link_ids)
        gate = self.gate
        if gate is not None:
            ca, cb = (Channel(self.pump, RingBuffer(self.capacity), RingBuffer(self.capacity),
                              link_id=link_id, local=x, remote=y, port=port, accepting=acc)
                      for x, y, acc in ((a, b, False), (b, a, True)))
            gate.join(ca, cb)
            return ca, cb
        a_to_b = RingBuffer(self.capacity)
        b_to_a = RingBuffer(self.capacity)
        ca = Channel(self.pump, a_to_b, b_to_a, link_id=link_id, local=a, remote=b, port=port)
        cb = Channel(self.pump, b_to_a, a_to_b, link_id=link_id, local=b, remote=a, port=port,
                     accepting=True)
        ca.attach_peer(cb)
        cb.attach_peer(ca)
        return ca, cb
