"""MessageQueue: whole messages in FIFO order over a channel, with bounded memory.

The framing is the sans-I/O codec of :mod:`._codec`; this module adds the
queue (a high-water mark on bytes not yet in the link), the pump tasks that
move frames when the rings have room or bytes, delivery to the listener, and
the close protocol.  What happens is told to the channel's observer (the trace).

It is the hot path of every link (each message sent or delivered passes through
:meth:`MessageQueue.send` and the readable task), kept in one module so that those
paths read straight through: the queue's state is plain attributes, and the calls
per message are few.
"""

from __future__ import annotations

import enum
import logging
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import trio

from pump import ConfigError, Timer

from ._cause import CloseCause
from ._channel import Channel
from ._codec import MAX_MESSAGE_BODY, RING_GROWTH_CAP, FrameDecoder, FrameEncoder
from ._errors import MessageTooLargeError, ProtocolError, QueueFullError
from ._messages import Batch, Gather
from ._ring import HEADER_SIZE

log = logging.getLogger("rdvpump.link")

DEFAULT_MAX_MESSAGE_SIZE = 16 * 1024 * 1024
DEFAULT_HIGH_WATER = 1 << 20
#: Seconds a frame may stay unfinished with nothing more of it arriving before its link
#: is closed (``stalled mid-frame``).
DEFAULT_STALL_TIMEOUT = 30.0

#: A message this long or longer, the last one queued, goes straight from its pieces to
#: a plain TCP link's socket while the link's ring is empty (:attr:`Channel.direct`),
#: not copied into the ring first: a relaying server's frame passed on to a dozen
#: consumers was a dozen copies of 200 KiB through the rings, each then read by the
#: kernel cache-cold.  One with others queued after it goes so from
#: :data:`DIRECT_ANY` on; below that the ring gathers them, several to a ``sendmsg``
#: (64 KiB messages streamed one after another: 7.9 us each through the ring, 10.5 us
#: each sent on its own, ``bench tcp``).
DIRECT_MIN = 64 * 1024
DIRECT_ANY = 256 * 1024
_CLOSED_ROOM = -(1 << 62)
_IDLE_ROOM = -1
_ONLY_BYTES = {bytes}


class Listening(Protocol):
    """What a queue's listener must have (:class:`QueueListener` is one; ``drained`` and
    ``received_many`` are optional)."""

    def received(self, message: bytes) -> None: ...

    def closed(self, reason: str) -> None: ...


class QueueListener:
    """Notifications of a message queue.  Grammar: ``(received | drained)* closed``.

    Subclass and override what you need (the base methods do nothing), or pass
    any object with ``received`` and ``closed``; ``drained`` is optional.

    A listener may also have ``received_many(messages)``: the queue then calls it
    instead of ``received``, once per read, with every whole message that read found
    (a list, in order; never empty).  ``pause_reading`` from it takes effect at the
    next read.
    """

    def received(self, message: bytes) -> None:
        """One whole message, in the order it was sent."""

    def drained(self) -> None:
        """Queued bytes fell to the low-water mark after a ``send`` raised ``QueueFullError``."""

    def closed(self, reason: str) -> None:
        """The queue is closed; nothing more will be received (see ``close_cause``)."""


class _ChannelSide:
    """The queue as its channel's listener (the queue's own ``closed`` is a property)."""

    __slots__ = ("readable", "writable", "closed")
    traces_close = True  # the queue records "close" with the reason its listener gets

    def __init__(self, readable: Callable[[], None], writable: Callable[[], None],
                 closed: Callable[[str], None]) -> None:
        self.readable = readable
        self.writable = writable
        self.closed = closed


class _State(enum.Enum):
    OPEN = "open"
    CLOSING = "closing"  # close() called, flushing what was sent before it
    CLOSED = "closed"


# The states as module constants: on Python 3.11 reading an enum's member off its class
# costs about 45 ns, a global about 7, and the send, pull and read paths ask at every call.
_OPEN, _CLOSING, _CLOSED = _State.OPEN, _State.CLOSING, _State.CLOSED


@dataclass(frozen=True, slots=True)
class QueueStatistics:
    messages_sent: int
    messages_received: int
    messages_queued: int
    bytes_queued: int
    high_water: int
    low_water: int
    max_message_size: int
    reading_paused: bool
    state: str
    #: bytes this end sent (through its outgoing ring, or straight to its socket) and
    #: read from its incoming ring, each message's 4-byte length prefix included
    bytes_sent: int = 0
    bytes_received: int = 0
    #: bytes the incoming ring holds at most (over a socket it grows once a frame
    #: longer than it arrives: :attr:`FrameDecoder.ring_grows`)
    receive_ring: int = 0


class MessageQueue:
    """Length-prefixed FIFO messages over one channel.

    ``send(message)`` queues the whole message and never blocks: past the
    high-water mark on queued bytes it raises :class:`QueueFullError` and the
    listener gets ``drained()`` once the backlog is down to the low-water mark.
    ``received(message)`` fires once per message, in order, with the exact bytes.

    A received length above ``max_message_size``, or a stream cut mid-frame,
    closes this link only, with the reason.  :attr:`close_cause` says how the
    queue ended.  On a traced pump the queue is an ``ObservedMessageQueue``,
    which also tells the channel's observer of every message sent.
    """

    def __new__(cls, channel: Channel, **options: Any) -> MessageQueue:
        if cls is MessageQueue and channel.observer is not None:
            cls = ObservedMessageQueue  # chosen once: the untraced send has no trace branch
        return super().__new__(cls)

    def __init__(self, channel: Channel, *, max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
                 high_water: int = DEFAULT_HIGH_WATER, low_water: int | None = None,
                 stall_timeout: float = DEFAULT_STALL_TIMEOUT) -> None:
        if not 0 <= max_message_size <= MAX_MESSAGE_BODY:
            raise ConfigError(f"max_message_size must be within 0..{MAX_MESSAGE_BODY}")
        if low_water is None:
            low_water = high_water // 4
        if not 0 <= low_water <= high_water:
            raise ConfigError(f"need 0 <= low_water <= high_water, got {low_water}, {high_water}")
        if not stall_timeout > 0:
            raise ConfigError(f"stall_timeout must be positive, got {stall_timeout!r}")
        if high_water > max_message_size:
            # keeps the send fast path to one comparison: room <= high_water <= max size
            raise ConfigError(f"high_water ({high_water}) must not exceed max_message_size "
                             f"({max_message_size})")
        self._channel = channel
        self.pump = channel.pump
        self.max_message_size = max_message_size
        self.high_water = high_water
        self.low_water = low_water
        self.stall_timeout = stall_timeout
        self._stall: Timer | None = None  # armed while a frame is unfinished
        self._stall_progress = -1  # the unfinished frame's progress when last seen
        self._stall_since = 0.0  # and when that was
        self._tx = channel.tx_ring
        self._rx = channel.rx_ring
        self._observer = channel.observer
        self._encoder = FrameEncoder(channel.tx_ring)
        self._put_frame = channel.tx_ring.frame_putter()
        self._spans = self._encoder.spans  # the queued messages that came from a Batch
        self._decoder = FrameDecoder(channel.rx_ring, max_message_size=max_message_size)
        self._decoder.ring_grows = channel.rx_growable  # over a socket (attached later)
        self._listener: Listening | None = None
        self._received_many: Callable[[list[bytes]], object] | None = None
        self._state = _OPEN
        self._reason: str | None = None
        self._unsent = 0
        self._cause: CloseCause | None = None
        self._closed_here = False  # close() or abort() was called on this side
        # Sending: messages not yet in the ring are _outq[_qhead:]; _room = high_water - queued.
        self._outq: list[bytes | Gather] = []
        self._push = self._outq.append
        self._qhead = 0
        self._held = 0  # bytes of _outq[:_qhead], already in the ring
        self._idle = True  # nothing queued: _room is _IDLE_ROOM and no write task is posted
        self._room = _IDLE_ROOM
        self._want_drained = False
        self._sent = 0
        self._direct_sent = 0  # bytes sent past the ring (Channel.direct), prefixes too
        # Receiving.
        self._paused = False
        self._received = 0
        # the channel holds the queue's side (and so the queue) until it has told the
        # close; the queue does not hold it back, so a closed queue is no cycle
        channel.set_listener(self._channel_side(), owner=self)

    # -- identity ----------------------------------------------------------------------

    @property
    def remote_id(self) -> str:
        """Id of the broker at the other end."""
        return self._channel.remote

    @property
    def identity(self) -> Any:
        """Who the other end proved to be (see :attr:`Channel.identity`); None: this
        process."""
        return self._channel.identity

    @property
    def peer_address(self) -> str | None:
        """The other end's ``host:port`` when it is in another process."""
        return self._channel.peer_address

    @property
    def local_id(self) -> str:
        return self._channel.local

    @property
    def link_id(self) -> int:
        return self._channel.link_id

    @property
    def port(self) -> int:
        return self._channel.port

    @property
    def closed(self) -> bool:
        """True once the queue is closed (by either side or by an error)."""
        return self._state is _CLOSED

    @property
    def close_reason(self) -> str | None:
        return self._reason

    @property
    def close_cause(self) -> CloseCause | None:
        """How the queue ended (None while open)."""
        return self._cause if self._state is _CLOSED else None

    @property
    def unsent(self) -> int:
        """Messages ``send`` queued that never went into the link because it ended under
        them (the peer gone, the connection lost, a protocol error; the reason says how
        many too); 0 while open, and after this side's own :meth:`abort`, which drops
        them on purpose."""
        return self._unsent

    @property
    def closed_here(self) -> bool:
        """This side called ``close()`` or ``abort()``."""
        return self._closed_here

    @property
    def reading_paused(self) -> bool:
        return self._paused

    @property
    def whole_frame_bytes(self) -> int:
        """Bytes of the longest message the other end takes out of its ring whole (a longer
        one is put together piece by piece, which costs more): over a socket its ring grows
        to :data:`RING_GROWTH_CAP` once such messages come; a link within this process
        shares one ring, of fixed capacity."""
        channel = self._channel  # a link over a socket: the rings at both ends may grow
        return RING_GROWTH_CAP if channel.rx_growable() else channel.capacity

    def __repr__(self) -> str:
        c = self._channel
        return (f"<MessageQueue link={c.link_id} {c.local}->{c.remote}:{c.port} "
                f"{self._state.value}>")

    def trace_ids(self) -> tuple[str | None, str | None, int | None, str | None]:
        return self._channel.trace_ids()

    def task_failed(self, exc: BaseException) -> None:
        self._end_abruptly(f"listener error: {exc!r}", CloseCause.ABORTED)

    # -- listener ----------------------------------------------------------------------

    def set_listener(self, listener: Listening) -> None:
        """Install the listener.  Messages that arrived before are delivered to it."""
        missing = [m for m in ("received", "closed") if not callable(getattr(listener, m, None))]
        if missing:
            raise TypeError(f"queue listener {listener!r} lacks {' and '.join(missing)}(); "
                            "subclass channels.QueueListener")
        self._listener = listener
        self._received_many = getattr(listener, "received_many", None)
        self._channel.set_listener(self._channel_side(), owner=self)

    def _channel_side(self) -> _ChannelSide:
        return _ChannelSide(self._on_readable, self._flush, self._on_channel_closed)

    def pause_reading(self) -> None:
        """Stop delivering after the current batch; the ring fills and the sender waits."""
        self._paused = True

    def resume_reading(self) -> None:
        if self._paused:
            self._paused = False
            self._channel.request_read()

    # -- sending -----------------------------------------------------------------------

    def send(self, message: bytes | Gather) -> None:
        """Queue one whole message; it is written into the link in FIFO order.

        Raises :class:`QueueFullError` past the high-water mark (nothing queued),
        :class:`MessageTooLargeError`, ``TypeError`` for a message that is not bytes, a
        bytes-like object (copied) or a :class:`Gather` (its pieces are not copied:
        they must not change until it is sent),
        ``trio.ClosedResourceError`` after ``close()``, ``trio.BrokenResourceError``
        when the link is gone.
        """
        # The hot path.  While the queue is empty _room is negative, so the first
        # message takes _send_slow, which posts the write task; later ones only append.
        if type(message) is bytes:
            n = len(message)
            room = self._room
            if n <= room:
                self._room = room - n
                self._push(message)
                return
        self._send_slow(message)

    def send_many(self, messages: Iterable[bytes | Gather] | Batch) -> int:
        """Queue several messages in order; return how many were queued.

        Stops at the high-water mark: the messages after the returned count were
        not queued (send them after ``drained()``).  Raises like :meth:`send` when
        not even the first could be queued.  One check covers the whole batch, so
        this costs far less per message than :meth:`send`.  A :class:`Batch` (the same
        messages for several queues) goes into the link from its joined bodies.
        """
        if isinstance(messages, Batch):
            return self.send_batch(messages, 0)
        msgs = messages if type(messages) is list else list(messages)
        count = len(msgs)
        if count == 0:
            return 0
        one_by_one = self._observer is not None or set(map(type, msgs)) != _ONLY_BYTES
        if self._idle or one_by_one:
            # First message after idle, tracing, or non-bytes: one by one for exact errors.
            self.send(msgs[0])
            start = 1
            if one_by_one:
                for i in range(1, count):
                    try:
                        self.send(msgs[i])
                    except QueueFullError:
                        return i
                return count
            msgs = msgs[1:]
        else:
            start = 0
        total = sum(map(len, msgs))
        if total <= self._room:
            self._room -= total
            self._outq.extend(msgs)
            return count
        for i, m in enumerate(msgs):  # the mark falls inside the batch
            try:
                self.send(m)
            except QueueFullError:
                if start + i == 0:
                    raise
                return start + i
        return count

    def send_batch(self, batch: Batch, first: int = 0) -> int:
        """:meth:`send_many` of ``batch``'s messages from ``first`` on: how many were
        queued."""
        count = len(batch.messages) - first
        if count <= 0:
            return 0
        if (self._observer is not None or self._state is not _OPEN
                or batch.longer_than(self.max_message_size)
                or self._channel.peer_reason is not None):
            # one by one: each message traced, or the error send gives
            return self.send_many(batch.messages[first:])
        offsets = batch.offsets
        base = offsets[first]
        idle = self._idle
        room = self.high_water if idle else self._room
        k = bisect_right(offsets, base + room, first + 1, first + count + 1) - 1 - first
        if k <= 0:
            if not idle:
                return self.send_many(batch.messages[first:first + 1])  # QueueFullError
            k = 1  # past the mark alone: queued, as send queues it
        if idle:
            self._idle = False
            self.pump.post("write", self._flush, owner=self)
        self._room = room - (offsets[first + k] - base)
        if k < count:
            self._want_drained = True  # the rest waits for drained(), as after send's refusal
        q = self._outq
        self._spans.append((len(q), batch, first, k))
        q.extend(batch.messages[first:first + k])
        return k

    def send_nowait(self, message: bytes | Gather) -> None:
        """Alias of :meth:`send` (which never waits), for symmetry with the async face."""
        self.send(message)

    def put_now(self, message: bytes | Gather) -> bool:
        """Write one message into the link at once, whole, when nothing is queued before
        it (the async face's ``send``): whether it did.  When not (a backlog, no room in
        the ring, a message that is not bytes or too long, a closed link, a traced pump),
        nothing happened: :meth:`send` queues it, or raises its error.  No write task,
        no copy into the backlog: one C call, then the peer is told."""
        if self._idle and type(message) is bytes and self._state is _OPEN:
            chan = self._channel
            n = len(message)
            if (n <= self.max_message_size and chan.peer_reason is None
                    and self._observer is None and self._put_frame(message, n)):
                self._sent += 1
                tell = chan.tell_peer  # notify_written(), one call less
                if tell is not None:
                    tell()
                return True
        return False

    def _send_slow(self, message: Any) -> None:
        if self._state is not _OPEN:
            if self._closed_here:
                raise trio.ClosedResourceError("message queue was closed")
            raise trio.BrokenResourceError(f"link is closed: {self._reason}")
        if type(message) is not bytes and type(message) is not Gather:
            if not isinstance(message, (bytearray, memoryview)):
                raise TypeError(f"message must be bytes, bytearray, memoryview or Gather, "
                                f"not {type(message).__name__}")
            message = bytes(message)  # the queue keeps it: take an immutable copy
        n = len(message)
        if n > self.max_message_size:
            raise MessageTooLargeError(f"message of {n} bytes exceeds max_message_size "
                                       f"{self.max_message_size}")
        peer_reason = self._channel.peer_reason
        if peer_reason is not None:
            raise trio.BrokenResourceError(f"peer disconnected: {peer_reason}")
        if self._idle:
            # The first message after the queue ran empty: post the write task.
            self._idle = False
            self._room = self.high_water - n
            self._push(message)
            self.pump.post("write", self._flush, owner=self)
            return
        if n <= self._room:
            self._room -= n
            self._push(message)
            return
        self._want_drained = True
        raise QueueFullError(
            f"{self.high_water - self._room} bytes queued; {n} more would pass the high-water"
            f" mark of {self.high_water}: wait for drained() or use the async send")

    def _flush(self) -> None:
        """Write task: move queued messages into the ring, as many as fit."""
        chan = self._channel
        if self._state is _CLOSED or chan.peer_reason is not None:
            return  # with the peer gone, what is still queued is reported as not sent
        q = self._outq
        start = self._qhead
        observer = self._observer
        used_before = self._tx.used if observer is not None else 0
        encoder = self._encoder
        direct = chan.direct
        into_ring, direct_bytes = start, 0  # where the ring's share of the queue begins
        if (direct is not None and observer is None and not self._tx.used
                and not encoder.streaming and not encoder.spans):
            into_ring, direct_bytes = self._send_direct(q, start, direct)
        i, done_bytes, moved = encoder.write(q, into_ring)
        done_bytes += direct_bytes
        n = len(q)
        self._sent += i - start
        if observer is not None and moved:
            observer.moved("write", self._tx.used - used_before, i < n)
        if i < n:
            chan.want_writable()  # the channel posts this task again when room frees
        if moved:
            chan.notify_written()
        if i < n:
            # what is in the ring is let go by the many or by the byte: a queue kept
            # topped up never empties, and 4,096 frames of 200 KiB held were 800 MiB
            held = self._held = self._held + done_bytes
            if i > 4096 or held > self.high_water:
                self._held = 0
                del q[:i]
                spans = self._spans
                if spans:
                    kept = [(at - i, b, first, k) for at, b, first, k in spans if at + k > i]
                    spans.clear()
                    spans.extend(kept)
                i = 0
            self._qhead = i
            if self._state is _OPEN:
                self._room += done_bytes
                if self._want_drained and self.high_water - self._room <= self.low_water:
                    self._want_drained = False
                    self.pump.post("drained", self._run_drained, owner=self)
            return
        q.clear()
        self._held = 0
        if self._spans:
            self._spans.clear()
        self._qhead = 0
        if self._state is _OPEN:
            self._idle = True
            self._room = _IDLE_ROOM
            if self._want_drained:
                self._want_drained = False
                self.pump.post("drained", self._run_drained, owner=self)
        elif self._state is _CLOSING:
            self._finish_close(CloseCause.CLEAN)

    def _send_direct(self, q: list[Any], start: int,
                     direct: Callable[[bytes | Gather], int]) -> tuple[int, int]:
        """Large messages at the head of the queue straight to the link's socket while
        its ring is empty, never copied into the ring (:data:`DIRECT_MIN`,
        :data:`DIRECT_ANY`): the index of the first not wholly sent and the bytes of
        those that were.  One sent in part goes on into the ring from where the socket
        stopped."""
        done = 0
        n = len(q)
        while start < n:
            message = q[start]
            size = len(message)
            if size < (DIRECT_MIN if start == n - 1 else DIRECT_ANY):
                break
            sent = direct(message)
            self._direct_sent += sent
            if sent < size + HEADER_SIZE:
                if sent:
                    self._encoder.resume(message, sent)
                break
            done += size
            start += 1
        return start, done

    def _run_drained(self) -> None:
        listener = self._listener
        if self._state is _OPEN and listener is not None:
            drained = getattr(listener, "drained", None)
            if drained is not None:
                drained()

    # -- receiving ---------------------------------------------------------------------

    def set_pull(self, arrived: Callable[[], None], behind: Callable[[], None]) -> bool:
        """Let the reader take messages when it wants them (:meth:`pull`), instead of a
        read task delivering each arrival to the listener: bytes that arrive call
        ``arrived()`` (it may wake the reader) and wait in the ring, whose room is then
        the backpressure; ``behind()`` follows when they wait faster than the reader
        takes them (a writer in this process found the ring full, or a socket's bytes
        left it half full or more): it may take messages with :meth:`read_ahead` (as
        ``arrived()`` may too, but neither :meth:`pull`).  Whether pulling is on: not on
        a traced pump, whose reads are recorded as the read task's.  The peer's end, and
        this side's ``close``, still deliver through the listener (what is left is read
        and the close follows), as does anything :meth:`pull` does not take itself."""
        if self._observer is not None or self._state is not _OPEN:
            return False
        self._channel.on_behind = behind
        self._channel.on_arrival = arrived
        return True

    def pull(self, into: deque[bytes], max_count: int) -> int:
        """Take up to ``max_count`` whole messages that have arrived into ``into``, in
        order (pulling on, see :meth:`set_pull`): how many.  A frame it does not take
        itself (one longer than the codec batches, or in pieces, or a protocol error) is
        left to the read task's code, run here, which delivers through the listener."""
        if self._state is _OPEN and not self._paused:
            count = self._decoder.take_whole(into, max_count)
            if count:
                self._received += count
                self._channel.notify_consumed(True)
                return count
        if self._rx.used or self._decoder.in_frame or self._channel.peer_reason is not None:
            pump = self.pump
            pump.hold()
            try:
                self._on_readable()
            finally:
                pump.run_held()
        return 0

    def read_ahead(self, into: deque[bytes], max_count: int) -> int:
        """Pulling, when bytes wait faster than the reader takes them (``behind()``, see
        :meth:`set_pull`): take up to ``max_count`` whole messages into ``into`` now, so
        that a writer with more to send goes on meanwhile (as far as the reader's buffer
        allows, as the read task would); how many.  Takes only what :meth:`pull` takes
        itself."""
        if self._state is not _OPEN or self._paused:
            return 0
        count = self._decoder.take_whole(into, max_count)
        if count:
            self._received += count
            self._channel.notify_consumed(True)
        return count

    def _on_readable(self) -> None:
        """Channel notification: bytes arrived.  Deliver every complete message.  One
        function although long: the hot path of every message received, its loop's
        locals kept in one frame."""
        rx = self._rx
        if self._state is _CLOSING:
            # Delivery stopped at close(): drop what arrives, so that a peer closing
            # at the same time can flush too, and its disconnect reaches us.
            self._channel.notify_consumed(rx.skip(rx.used))
            return
        listener = self._listener
        if listener is None or self._paused or self._state is not _OPEN:
            return
        decoder = self._decoder
        observer = self._observer
        used_before = rx.used if observer is not None else 0
        received_many = self._received_many
        # a batch listener gets the whole read at the end; pausing applies to the next
        many: list[bytes] | None = [] if received_many is not None else None
        recv = listener.received
        taken = False
        try:
            while self._state is _OPEN and (many is not None or not self._paused):
                frames = decoder.next_frames()
                if frames is None:
                    break
                taken = True
                bodies, lens = frames
                self._received += len(lens)
                if observer is not None:
                    observer.delivered(lens)
                if many is not None:
                    many += bodies
                else:
                    for message in bodies:
                        recv(message)
                if not rx.used:
                    break  # the next look would find nothing (and bytes that come later
                    # post another readable): one C call instead of a take that finds none
        except ProtocolError as exc:
            if many and received_many is not None:  # the whole ones before it go first
                received_many(many)
            self._protocol_error(str(exc))
            return
        if many and received_many is not None:
            received_many(many)
        # A frame in pieces means its bytes were taken: the decoder drains the ring then.
        if decoder.in_frame:
            taken = True
            if decoder.progress != self._stall_progress:
                self._stall_progress = decoder.progress
                self._stall_since = self.pump.now()
            if self._stall is None:
                self._stall = self.pump.call_later(self.stall_timeout, self._check_stall)
        chan = self._channel
        if observer is not None and taken:
            observer.moved("read", used_before - rx.used, decoder.in_frame)
        chan.notify_consumed(taken)
        if chan.peer_reason is not None and self._state is _OPEN and not self._paused:
            try:
                decoder.end_of_stream()
            except ProtocolError as exc:  # with how the peer ended: it may have died
                self._protocol_error(f"{exc} ({chan.peer_reason})")

    def _check_stall(self) -> None:
        """A frame is unfinished: if nothing more of it came for ``stall_timeout`` (and not
        because this side paused reading), the peer stalled mid-frame: close the link."""
        self._stall = None
        decoder = self._decoder
        if self._state is not _OPEN or not decoder.in_frame:
            self._stall_progress = -1
            return
        now = self.pump.now()
        if self._paused or self._rx.used:  # not reading (paused, or a reader that pulls)
            self._stall_since = now
        quiet = now - self._stall_since
        if quiet < self.stall_timeout:
            self._stall = self.pump.call_later(self.stall_timeout - quiet, self._check_stall)
            return
        c = self._channel
        what = (f"stalled mid-frame: {decoder.partial} bytes of a frame, then nothing for "
                f"{self.stall_timeout:g} s")
        self.pump.warn_collapsed(log, ("stalled", c.remote),
                                 f"link {c.link_id} ({c.remote} -> {c.local}): {what}")
        self._end_abruptly(what, CloseCause.PROTOCOL_ERROR)

    def _forget_frame(self) -> None:
        """The link is done: an unfinished frame's buffer and budget go, and its timer."""
        self._decoder.discard()
        self._stall_progress = -1
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None

    def _protocol_error(self, what: str) -> None:
        c = self._channel
        self.pump.warn_collapsed(log, ("protocol error", c.remote),
                                 f"link {c.link_id} ({c.remote} -> {c.local}): protocol error: "
                                 f"{what}")
        if self._observer is not None:
            self._observer.protocol_error(what)
        self._end_abruptly(f"protocol error: {what}", CloseCause.PROTOCOL_ERROR)

    # -- closing -----------------------------------------------------------------------

    def close(self, reason: str = "closed") -> None:
        """Close gracefully: messages already sent are flushed first, then the link ends.

        Delivery stops at once (messages still arriving are dropped, so a peer
        closing at the same moment can finish too); the listener gets
        ``closed(reason)`` when done.  If the peer leaves first, the reason
        counts the queued messages that were not sent.  ``abort`` does not wait.
        """
        if self._state is not _OPEN:
            return
        self._closed_here = True
        self._state = _CLOSING
        self._channel.on_arrival = None  # what arrives now is dropped by the read task
        self._reason = reason
        self._room = _CLOSED_ROOM
        if self._qhead == len(self._outq) and not self._encoder.streaming:
            self._finish_close(CloseCause.CLEAN)
        else:
            self._on_readable()  # drops what already arrived; delivery has stopped

    async def wait_sent(self) -> None:
        """Wait until this queue has closed and every byte it wrote has left this end of
        the link (over TCP: handed to the kernel), or at once if the peer ended the link
        (no one reads more).  After :meth:`close`, a process may end once this returns
        without losing what it sent; bound it with a timeout, since a peer that stops
        reading holds it."""
        await self._channel.wait_sent()

    def abort(self, reason: str = "aborted") -> None:
        """Close at once; messages not yet written into the link are dropped (and counted)."""
        if self._state is not _CLOSED:
            self._closed_here = True
            self._end_abruptly(reason, CloseCause.ABORTED)
            self._unsent = 0  # dropped on purpose (the reason counts them): not lost

    def protocol_error(self, what: str) -> None:
        """Close at once because the peer broke a protocol above the frames (a message
        that is not JSON, a command it may not send): the cause is
        :attr:`CloseCause.PROTOCOL_ERROR` and the reason ``protocol error: WHAT``, logged
        as the frame layer's own protocol errors are (once per cause and peer)."""
        if self._state is not _CLOSED:
            self._closed_here = True
            self._protocol_error(what)

    def _end_abruptly(self, reason: str, cause: CloseCause) -> None:
        if self._state is _CLOSED:
            return
        unsent = self._unsent = len(self._outq) - self._qhead
        if unsent:
            reason = f"{reason}; {unsent} queued messages not sent"
        self._reason = reason
        self._finish_close(cause)

    def _finish_close(self, cause: CloseCause) -> None:
        self._channel.on_arrival = None
        self._forget_frame()
        self._state = _CLOSED
        self._cause = cause
        self._room = _CLOSED_ROOM
        # a frame cut by an abort leaves the stream mid-frame: no close frame can follow
        self._channel.disconnect(self._reason or "closed", cause=cause,
                                 whole=not self._encoder.streaming)

    def _on_channel_closed(self, reason: str) -> None:
        chan = self._channel
        chan.on_arrival = None
        cause = chan.peer_cause or (CloseCause.ABORTED if chan.disconnected else CloseCause.CLEAN)
        said = self._decoder.peer_close
        if said is not None and self._state is _OPEN:
            # over a stream, the peer's close frame says how and why it ended the link
            try:
                cause = CloseCause(said[0])
            except ValueError:
                cause = CloseCause.ABORTED  # a cause this version does not know
            reason = f"peer disconnected ({said[1]})"
        elif cause is CloseCause.LOST and chan.peer_reason is not None:
            reason = chan.peer_reason  # "connection lost: ..."
        if self._state is _OPEN and self._decoder.in_frame:
            reason = (f"protocol error: stream cut mid-frame ({self._decoder.partial} bytes "
                      f"of it arrived); {reason}")
            cause = CloseCause.PROTOCOL_ERROR
            c = self._channel
            self.pump.warn_collapsed(log, ("cut mid-frame", c.remote),
                                     f"link {c.link_id} ({c.remote} -> {c.local}): {reason}")
        if self._state is not _CLOSED:
            unsent = self._unsent = len(self._outq) - self._qhead
            if unsent:
                reason = f"{reason}; {unsent} queued messages not sent"
            self._state = _CLOSED
            self._cause = cause
            self._room = _CLOSED_ROOM
            self._reason = reason
        self._outq.clear()
        self._held = 0
        self._spans.clear()
        self._qhead = 0
        self._forget_frame()
        if self._observer is not None:
            self._observer.closed(self._reason or reason)
        tally = self.pump.tally
        if tally is not None:
            tally("close", {"broker": self._channel.local,
                            "cause": (self._cause or cause).value})
        listener = self._listener
        if listener is not None:
            listener.closed(self._reason or reason)

    # -- statistics --------------------------------------------------------------------

    def statistics(self) -> QueueStatistics:
        pending = self._outq[self._qhead:] if self._state is not _CLOSED else []
        return QueueStatistics(
            messages_sent=self._sent,
            messages_received=self._received,
            messages_queued=len(pending),
            bytes_queued=sum(map(len, pending)),
            high_water=self.high_water,
            low_water=self.low_water,
            max_message_size=self.max_message_size,
            reading_paused=self._paused,
            state=self._state.value,
            bytes_sent=self._tx.total_written + self._direct_sent,
            bytes_received=self._rx.total_read,
            receive_ring=self._rx.capacity,
        )


class ObservedMessageQueue(MessageQueue):
    """A MessageQueue on a traced pump: every message sent is told to the channel's
    observer, in the step that sent it."""

    def __init__(self, channel: Channel, **options: Any) -> None:
        super().__init__(channel, **options)
        assert channel.observer is not None
        self._on_sent = channel.observer.sent

    def send(self, message: bytes | Gather) -> None:
        if type(message) is bytes and len(message) <= self._room:  # send's fast path
            self._room -= len(message)
            self._push(message)
        else:
            self._send_slow(message)
        self._on_sent(len(message))
