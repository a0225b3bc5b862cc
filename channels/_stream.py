"""StreamLink: one side of a link whose other end is across a trio stream (TCP, TLS, memory).

It is the channel's peer: bytes the channel writes leave from its tx ring,
bytes that arrive go into its rx ring.  Over a plain socket the ring memory
itself is handed to ``readv`` and ``sendmsg``, in C: no copy of the stream in Python.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import socket
import time
from typing import Any

import trio

from ._cause import CloseCause
from ._channel import Channel
from ._codec import close_frame
from ._messages import Gather
from ._ring import SEND_PIECES, RingBuffer, send_frame

log = logging.getLogger("rdvpump.link")

#: How long a link that ended on our side waits for the peer's end of stream.
DEFAULT_LINGER = 5.0
#: Adaptive polling, on by default: a link whose bytes keep coming back quickly polls
#: its socket up to this long before it sleeps (see :class:`StreamLink`).
DEFAULT_ADAPTIVE_POLL = 100e-6
#: A wait longer than this means the link went quiet: it sleeps without polling.
ADAPTIVE_QUIET = 1e-3
#: After a poll that came up empty, the waits that sleep before the next poll: doubled at
#: each empty poll up to this, reset by a poll that got bytes.
ADAPTIVE_MAX_SKIP = 64

#: While polls keep getting bytes, the receive loop yields to trio's scheduler only this
#: often (so tasks waiting for I/O or a timer run; a runnable task cuts a poll short).
POLL_YIELD = 1e-3

#: When each link of this process last received bytes (links quiet for longer than
#: ADAPTIVE_QUIET are dropped as they are met): adaptive polling spins only while no
#: other link is busy, since a spin keeps every other link of the process (one thread)
#: waiting.
_recent: dict[StreamLink, float] = {}


#: How long a reading of the machine's runnable threads stands (seconds).
CORES_CHECK_EVERY = 5e-3


def runnable(loadavg: bytes) -> int:
    """The threads runnable now, from Linux's ``/proc/loadavg`` (its fourth field,
    ``runnable/total``); ValueError if it is not that."""
    fields = loadavg.split()
    if len(fields) < 4 or fields[3].count(b"/") != 1:
        raise ValueError(f"not a /proc/loadavg line: {loadavg[:80]!r}")
    return int(fields[3].split(b"/")[0])


class _Cores:
    """Whether every core of the machine is taken: more threads runnable than cores, so
    that one of them waits for a core (a spin would keep it waiting).  Read from
    ``/proc/loadavg`` at most every :data:`CORES_CHECK_EVERY`; never taken where that
    file cannot be read."""

    def __init__(self) -> None:
        self.cores = os.cpu_count() or 1
        self.fd: int | None = None
        self.failed = False
        self.read_at = -math.inf
        self.was_taken = False

    def taken(self, now: float) -> bool:
        if now - self.read_at < CORES_CHECK_EVERY or self.failed:
            return self.was_taken
        self.read_at = now
        try:
            if self.fd is None:
                self.fd = os.open("/proc/loadavg", os.O_RDONLY | os.O_CLOEXEC)
            self.was_taken = runnable(os.pread(self.fd, 128, 0)) > self.cores
        except (OSError, ValueError):
            self.failed, self.was_taken = True, False
        return self.was_taken


#: This process's view of the machine's cores, for adaptive polling.
_cores = _Cores()


def _another_busy(link: StreamLink, now: float) -> bool:
    stale = []
    busy = False
    for other, when in _recent.items():
        if now - when > ADAPTIVE_QUIET:
            stale.append(other)
        elif other is not link:
            busy = True
            break
    for other in stale:
        del _recent[other]
    return busy


class StreamLink:
    """Runs a channel's link over ``stream`` until either side ends it.

    Ending: when the channel disconnects, everything it wrote before is sent,
    then the stream is half-closed (``send_eof``) and, once the peer closes
    too (or ``linger`` seconds pass), closed.  When the stream ends first, the
    channel's peer is marked disconnected: it reads what arrived, then sees
    the close; an error (reset, broken pipe) marks it as a failure.

    ``busy_poll`` (seconds, plain TCP only, off by default): before parking in
    the I/O wait, keep reading the socket for up to that long while no other
    task is runnable.  A reply that comes within the window skips a sleep and
    wake-up of the thread, which on a VM costs tens of microseconds; the price
    is a core kept busy for that long and timers up to that late.  Use it only
    when each process has a core of its own: on a shared core the spinning
    keeps the other side from running.

    ``adaptive_poll`` (seconds, plain TCP only, on by default): the same poll, but
    only while the link is busy -- its last wait for bytes was under
    :data:`ADAPTIVE_QUIET` -- and the only busy link of its process (a poll keeps
    the process's other links waiting), only while a core of the machine is free (on
    Linux: no more threads runnable than cores; a spin would keep one of them from
    running), and only while polls pay: a poll that comes
    up empty makes the link sleep without polling for the next 1, 2, 4 ... up to
    :data:`ADAPTIVE_MAX_SKIP` waits.  A request/reply exchange gets its replies
    without a sleep and wake-up; a quiet link never spins; a link whose peer
    answers slowly soon stops trying.  The poll yields the core before each read
    (``sched_yield``), so a peer on the same core gets to run and answer.

    Over plain TCP the bytes go straight between the socket and the rings, one
    ``readv`` / ``sendmsg`` in C over both runs of a ring (:meth:`RingBuffer.recv_from`,
    :meth:`RingBuffer.send_to`).  While polls keep getting bytes, the receive loop
    yields to trio only every :data:`POLL_YIELD` seconds (a runnable task cuts a poll
    short; tasks waiting for I/O or a timer wait at most that long).
    """

    def __init__(self, channel: Channel, stream: trio.abc.Stream, *,
                 linger: float = DEFAULT_LINGER, busy_poll: float = 0.0,
                 adaptive_poll: float = DEFAULT_ADAPTIVE_POLL) -> None:
        self.channel = channel
        self.stream = stream
        self.linger = linger
        self._sock: Any = getattr(stream, "socket", None) if isinstance(
            stream, trio.SocketStream) else None
        self._fd = self._sock.fileno() if self._sock is not None else -1
        self._send_idle = False
        self._send_wake = trio.Event()
        self._recv_wake = trio.Event()
        self._local_gone: str | None = None
        self._local_cause = CloseCause.CLEAN
        self._remote_gone = False
        self.bytes_sent = 0
        self.bytes_received = 0
        self.busy_poll = busy_poll
        self.adaptive_poll = adaptive_poll
        self._last_wait = math.inf  # seconds the last wait for bytes took
        self._yield = False  # the receive loop yields after delivering
        self._yielded = 0.0  # when the receive loop last yielded after a poll
        self._polled_at = 0.0  # when the last poll got something
        self._skip = 0  # waits left that sleep without polling
        self._backoff = 0
        #: Adaptive polls tried, and those that got bytes.
        self.polls = 0
        self.poll_hits = 0
        channel.attach_peer(self, transport=True)
        if self._fd >= 0:
            channel.direct = self._send_now

    # -- the peer interface the channel calls (from pump tasks) -------------------------

    def data_arrived(self) -> None:
        if self._send_idle and self._fd >= 0:
            # Fast path: the send loop is parked and the socket is plain TCP; send now,
            # from this pump task, without waking the loop (what is left, it sends; an
            # error, it meets and reports).
            tx = self.channel.tx_ring
            n = tx.send_to(self._fd)
            if n > 0:
                self.bytes_sent += n
                self.channel.room_freed()
                if not tx.used:
                    return
        self._send_wake.set()

    def _send_now(self, message: bytes | Gather) -> int:
        """A large frame straight from its pieces to the socket, while the send loop is
        parked (the ring is empty): what left (see :func:`send_frame`), 0 if nothing did
        (the socket is full, or failed: the send loop meets that once the frame is in
        the ring)."""
        if not self._send_idle:
            return 0
        pieces = message.pieces if type(message) is Gather else (message,)
        if len(pieces) > SEND_PIECES:
            return 0
        n = send_frame(self._fd, len(message), pieces)
        if n <= 0:
            return 0
        self.bytes_sent += n
        return n

    def room_freed(self) -> None:
        self._recv_wake.set()

    def peer_ended(self, reason: str, cause: CloseCause) -> None:
        self._local_gone = reason
        self._local_cause = cause
        self._send_wake.set()
        self._recv_wake.set()

    # -- the link ---------------------------------------------------------------------

    async def run(self, initial: bytes = b"") -> None:
        """Move bytes both ways until the link ends; ``initial`` arrived with the handshake."""
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._receive_loop, initial)
                await self._send_loop()
                self.channel.transport_ended()  # what this end wrote has left
                if not isinstance(self.stream, trio.abc.HalfCloseableStream):
                    # No half-close (TLS): everything was sent; closing tells the peer.
                    nursery.cancel_scope.cancel()
                    return
                # Our side ended and everything was sent: wait (bounded) for the peer's EOF.
                with trio.move_on_after(self.linger if self.linger >= 0 else math.inf):
                    while not self._remote_gone:
                        await self._recv_wake.wait()
                        self._recv_wake = trio.Event()
                nursery.cancel_scope.cancel()
        finally:
            self._forget()
            self.channel.transport_ended()  # nothing more leaves, however the link ended
            with trio.CancelScope(shield=True):
                await self.stream.aclose()

    async def _send_loop(self) -> None:
        tx = self.channel.tx_ring
        while True:
            if not tx.used:
                if self._local_gone is not None or self._remote_gone:
                    break
                self._send_wake = trio.Event()
                self._send_idle = True
                try:
                    await self._send_wake.wait()
                finally:
                    self._send_idle = False
                continue
            try:
                n = await self._send_some(tx)
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                self._lost(f"connection lost while sending: {exc.__cause__ or exc}")
                return
            self.bytes_sent += n
            self.channel.room_freed()
        if self._local_gone is not None and not self._remote_gone:
            try:
                # the close frame: the peer tells this end from a crash, and learns why
                if self._local_cause is not CloseCause.LOST and self.channel.ends_whole:
                    await self._send_all(close_frame(self._local_gone,
                                                     self._local_cause.value))
                if isinstance(self.stream, trio.abc.HalfCloseableStream):
                    await self.stream.send_eof()
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
                pass

    async def _send_some(self, tx: RingBuffer) -> int:
        """Send bytes of ``tx`` (all that are readable, or as many as the socket takes)
        and drop them from it: the count.  Over plain TCP, one ``sendmsg`` over both runs
        of the ring, with no SIGPIPE when the peer is gone (an embedding process may have
        restored its default action); raises OSError when the connection failed."""
        if self._fd >= 0:
            while (n := tx.send_to(self._fd)) == -errno.EAGAIN:
                await trio.lowlevel.wait_writable(self._sock)
            if n < 0:
                raise OSError(-n, os.strerror(-n))
            return n
        view = tx.readable_view()
        try:
            n = len(view)
            await self.stream.send_all(view)
        finally:
            view.release()
        tx.skip(n)
        return n

    async def _send_all(self, data: bytes) -> None:
        """Send ``data`` whole, past the ring (the close frame)."""
        if self._fd < 0:
            await self.stream.send_all(data)
            return
        view = memoryview(data)
        while view:
            view = view[await self._sock.send(view, socket.MSG_NOSIGNAL):]

    async def _receive_loop(self, initial: bytes) -> None:
        rx = self.channel.rx_ring
        backlog = memoryview(initial)  # bytes that came in the handshake's segment
        while backlog and self._local_gone is None:
            n = rx.write(backlog)
            if n:
                backlog = backlog[n:]
                self.bytes_received += n
                self._deliver()
            elif self._local_gone is None:
                self._recv_wake = trio.Event()
                await self._recv_wake.wait()
        while True:
            if self._local_gone is not None:
                # Our side disconnected: what still arrives is not read; wait for EOF.
                try:
                    data = await self.stream.receive_some(65536)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    data = b""
                if not data:
                    self._remote_gone = True
                    self._recv_wake.set()
                    return
                continue
            try:
                if self._fd < 0:
                    got = await self._read_stream(rx)
                else:
                    got = self._poll(rx)  # the hot path: no await when a poll got bytes
                    if got is None:
                        got = await self._read_socket(rx)
                    elif self._polled_at - self._yielded > POLL_YIELD:
                        self._yielded = self._polled_at
                        self._yield = True
                    if got < 0:
                        if got != -errno.ENOBUFS:
                            raise OSError(-got, os.strerror(-got))
                        got = None
                        await self._wait_room()
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                self._lost(f"connection lost: {exc.__cause__ or exc}")
                return
            if got is None:
                continue  # the ring was full; room came, or our side ended
            if got == 0:
                self._remote_gone = True
                self._send_wake.set()
                # a side that closes sends a close frame first (the queue reads it and
                # says the peer's reason); an end of stream alone is a crash or a cut
                self.channel.peer_ended("connection lost: the peer's end closed without a "
                                        "close frame", CloseCause.LOST)
                return
            self.bytes_received += got
            self._deliver()
            if self._yield:
                self._yield = False
                await trio.lowlevel.checkpoint()

    async def _read_socket(self, rx: RingBuffer) -> int:
        """Read the socket into ``rx`` through trio's I/O loop (no poll, or a poll that came
        up empty): what :meth:`RingBuffer.recv_from` returned.  A read that did not wait
        sets ``_yield``: the receive loop yields after delivering, as trio's own ``recv``
        does (a run of polls that keep getting bytes yields only every
        :data:`POLL_YIELD` seconds)."""
        started = time.perf_counter()
        n = rx.recv_from(self._fd)
        if n == -errno.EAGAIN:
            while n == -errno.EAGAIN:
                await trio.lowlevel.wait_readable(self._sock)
                n = rx.recv_from(self._fd)
        else:
            self._yield = True
        self._last_wait = time.perf_counter() - started
        _recent[self] = started + self._last_wait
        return n

    async def _read_stream(self, rx: RingBuffer) -> int | None:
        """:meth:`_read_socket` for other streams (TLS, memory): one ``receive_some``,
        copied into the ring after it (no view of the ring is held while it waits: the
        ring may grow meanwhile)."""
        room = rx.free
        if room == 0:
            await self._wait_room()
            return None
        data = await self.stream.receive_some(room)
        return rx.write(data)

    async def _wait_room(self) -> None:
        self._recv_wake = trio.Event()
        await self._recv_wake.wait()

    def _deliver(self) -> None:
        """Bytes went into the rx ring: deliver them now, from this task, without waking
        the pump's own task (one task switch less per hop)."""
        pump = self.channel.pump
        try:
            pump.hold()
            self.channel.data_arrived()
        finally:
            pump.run_held()

    def _poll(self, rx: RingBuffer) -> int | None:
        """What a poll (busy or adaptive) read, as :meth:`RingBuffer.recv_from` says it
        (bytes, end of stream, a full ring or an error), or None: wait in the I/O loop."""
        if self.busy_poll > 0:
            n = self._spin(rx, self.busy_poll, yielding=False)[0]
            if n is not None:
                self._polled_at = time.perf_counter()
            return n
        if self.adaptive_poll <= 0 or self._last_wait > ADAPTIVE_QUIET:
            return None
        if self._skip:
            self._skip -= 1
            return None
        started = time.perf_counter()
        if _another_busy(self, started) or _cores.taken(started):
            return None
        self.polls += 1
        n, empty = self._spin(rx, self.adaptive_poll, yielding=True)
        if n is not None:
            if n != -errno.ENOBUFS:
                self.poll_hits += 1
            self._backoff = 0
            self._polled_at = time.perf_counter()
            self._last_wait = self._polled_at - started
            _recent[self] = self._polled_at
        elif empty:  # nothing came within the window: poll less often
            self._backoff = min(2 * self._backoff or 1, ADAPTIVE_MAX_SKIP)
            self._skip = self._backoff
        return n

    def _spin(self, rx: RingBuffer, seconds: float, *, yielding: bool
              ) -> tuple[int | None, bool]:
        """Poll the socket for up to ``seconds`` while nothing else is runnable: what a
        read returned, or None and whether the window passed empty (not cut short by
        other work)."""
        fd, pump = self._fd, self.channel.pump
        deadline = time.perf_counter() + seconds
        stats = trio.lowlevel.current_statistics
        while True:
            if pump.has_ready() or stats().tasks_runnable:
                return None, False
            if yielding:
                os.sched_yield()  # a peer on this core runs (and answers) first
            n = rx.recv_from(fd)
            if n != -errno.EAGAIN:
                return n, False
            if time.perf_counter() > deadline:
                return None, True

    def _forget(self) -> None:
        _recent.pop(self, None)
        self.channel.direct = None  # the socket closes: its descriptor may be reused

    def _lost(self, reason: str) -> None:
        self._remote_gone = True
        self._send_wake.set()
        self._recv_wake.set()
        if self._local_gone is None:
            log.info("link %s: %s", self.channel.link_id, reason)
            self.channel.peer_ended(reason, CloseCause.LOST)
