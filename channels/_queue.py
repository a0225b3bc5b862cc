"""MessageQueue: whole messages in FIFO order over a channel, with bounded memory.

Frames are a 4-byte big-endian length then the body.  Small frames move many
per C call; frames too big for the ring stream through it in pieces.
"""

from __future__ import annotations

import enum
import logging
import threading
from array import array as _array
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

import trio

from ._channel import Channel
from ._errors import MessageTooLargeError, ProtocolError, QueueFullError
from ._ring import HEADER_SIZE, MAX_FRAME_BODY
from ._ringbuf import ffi, lib

log = logging.getLogger("rdvpump.link")

DEFAULT_MAX_MESSAGE_SIZE = 16 * 1024 * 1024
DEFAULT_HIGH_WATER = 1 << 20

#: Bodies up to this size are batched (many frames per C call); larger ones move one by one.
_SMALL = 8192
#: Most frames moved by one batched C call.
_BATCH = 1024
#: Most body bytes joined for one batched put (kept under malloc's mmap threshold).
_JOIN_MAX = 1 << 16
#: Scratch size for one batched take.
_OUTCAP = 1 << 17

_take_frames = lib.rb_take_frames
_frames_fit = lib.rb_frames_fit
_put_frames = lib.rb_put_frames
_free_space = lib.rb_free_space
_put_frame = lib.rb_put_frame
_frame_status = lib.rb_frame_status
_ffi_buffer = ffi.buffer
_from_buffer = ffi.from_buffer
_unpack = ffi.unpack
_FRAME_NONE = lib.RB_FRAME_NONE
_FRAME_COMPLETE = lib.RB_FRAME_COMPLETE
_CLOSED_ROOM = -(1 << 62)
_IDLE_ROOM = -1
_ONLY_BYTES = {bytes}


class _Scratch(threading.local):
    """Per-thread buffers for batched takes (a pump is single-threaded)."""

    def __init__(self) -> None:
        self.out = ffi.new("char[]", _OUTCAP)
        self.lens = ffi.new("uint32_t[]", _BATCH)
        self.used = ffi.new("size_t *")
        self.len32 = ffi.new("uint32_t *")
        self.ptr = ffi.new("char **")


_scratch = _Scratch()


class QueueListener:
    """Notifications of a message queue.  Grammar: ``(received | drained)* closed``.

    Subclass and override what you need (the base methods do nothing), or pass
    any object with ``received`` and ``closed``; ``drained`` is optional.
    """

    def received(self, message: bytes) -> None:
        """One whole message, in the order it was sent."""

    def drained(self) -> None:
        """Queued bytes fell to the low-water mark after a ``send`` raised ``QueueFullError``."""

    def closed(self, reason: str) -> None:
        """The queue is closed; nothing more will be received."""


class _ChannelSide:
    """The queue as its channel's listener (the queue's own ``closed`` is a property)."""

    __slots__ = ("readable", "writable", "closed")
    traces_close = True  # the queue records "close" with the reason its listener gets

    def __init__(self, queue: MessageQueue) -> None:
        self.readable = queue._on_readable
        self.writable = queue._flush
        self.closed = queue._on_channel_closed


class _State(enum.Enum):
    OPEN = "open"
    CLOSING = "closing"  # close() called, flushing what was sent before it
    CLOSED = "closed"


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


class MessageQueue:
    """Length-prefixed FIFO messages over one channel.

    ``send(message)`` queues the whole message and never blocks: past the
    high-water mark on queued bytes it raises :class:`QueueFullError` and the
    listener gets ``drained()`` once the backlog is down to the low-water mark.
    ``received(message)`` fires once per message, in order, with the exact bytes.

    A received length above ``max_message_size``, or a stream cut mid-frame,
    closes this link only, with the reason.
    """

    def __init__(self, channel: Channel, *, max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
                 high_water: int = DEFAULT_HIGH_WATER, low_water: int | None = None) -> None:
        if not 0 <= max_message_size <= MAX_FRAME_BODY:
            raise ValueError(f"max_message_size must be within 0..{MAX_FRAME_BODY}")
        if low_water is None:
            low_water = high_water // 4
        if not 0 <= low_water <= high_water:
            raise ValueError(f"need 0 <= low_water <= high_water, got {low_water}, {high_water}")
        if high_water > max_message_size:
            # keeps the send fast path to one comparison: room <= high_water <= max size
            raise ValueError(f"high_water ({high_water}) must not exceed max_message_size "
                             f"({max_message_size})")
        self._channel = channel
        self.pump = channel.pump
        self.max_message_size = max_message_size
        self.high_water = high_water
        self.low_water = low_water
        self._tx_rb = channel._tx._rb
        self._rx_rb = channel._rx._rb
        self._capacity = channel.capacity
        self._listener: Any = None
        self._state = _State.OPEN
        self._reason: str | None = None
        self._closed_here = False  # close() or abort() was called on this side
        # Sending: messages not yet in the ring are _outq[_qhead:]; _room = high_water - queued.
        self._outq: list[bytes] = []
        self._push = self._outq.append
        self._qhead = 0
        self._idle = True  # nothing queued: _room is _IDLE_ROOM and no write task is posted
        self._room = _IDLE_ROOM
        self._want_drained = False
        self._tx_off = -1  # >= 0 while the message at _outq[_qhead] streams in pieces
        self._tx_hdr = b""
        self._tx_body: Any = None
        self._sent = 0
        # Receiving.
        self._paused = False
        self._received = 0
        self._rx_hdr = bytearray(HEADER_SIZE)
        self._rx_hdr_got = -1  # >= 0 while a header arrives in pieces
        self._rx_body: bytearray | None = None  # set while a body arrives in pieces
        self._rx_body_ptr: Any = None
        self._rx_got = 0
        self._chan_listener = _ChannelSide(self)
        channel.set_listener(self._chan_listener, owner=self)
        trace = self.pump.trace
        if trace is not None:
            c = channel
            sends = trace.message_log("send", c.local, c.remote, c.port, c.trace_link, c.tx_dir)
            self._rx_log = trace.message_log("deliver", c.local, c.remote, c.port,
                                             c.trace_link, c.rx_dir)
            self._tx_log = sends
            self._log_size = sends.sizes.append
            self.send = self._send_traced  # type: ignore[method-assign]

    # -- identity ----------------------------------------------------------------------

    @property
    def remote_id(self) -> str:
        """Id of the broker at the other end."""
        return self._channel.remote

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
        return self._state is _State.CLOSED

    @property
    def close_reason(self) -> str | None:
        return self._reason

    def __repr__(self) -> str:
        c = self._channel
        return (f"<MessageQueue link={c.link_id} {c.local}->{c.remote}:{c.port} "
                f"{self._state.value}>")

    def trace_ids(self) -> tuple[str | None, str | None, int | None, str | None]:
        return self._channel.trace_ids()

    def task_failed(self, exc: BaseException) -> None:
        self._end_abruptly(f"listener error: {exc!r}")

    # -- listener ----------------------------------------------------------------------

    def set_listener(self, listener: Any) -> None:
        """Install the listener.  Messages that arrived before are delivered to it."""
        missing = [m for m in ("received", "closed") if not callable(getattr(listener, m, None))]
        if missing:
            raise TypeError(f"queue listener {listener!r} lacks {' and '.join(missing)}(); "
                            "subclass channels.QueueListener")
        self._listener = listener
        self._channel.set_listener(self._chan_listener, owner=self)

    def pause_reading(self) -> None:
        """Stop delivering after the current batch; the ring fills and the sender waits."""
        self._paused = True

    def resume_reading(self) -> None:
        if self._paused:
            self._paused = False
            chan = self._channel
            if not chan._read_posted:
                chan._post_readable()

    # -- sending -----------------------------------------------------------------------

    def send(self, message: bytes) -> None:
        """Queue one whole message; it is written into the link in FIFO order.

        Raises :class:`QueueFullError` past the high-water mark (nothing queued),
        :class:`MessageTooLargeError`, ``TypeError`` for a non-bytes message,
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

    def send_many(self, messages: Sequence[bytes]) -> int:
        """Queue several messages in order; return how many were queued.

        Stops at the high-water mark: the messages after the returned count were
        not queued (send them after ``drained()``).  Raises like :meth:`send` when
        not even the first could be queued.  One check covers the whole batch, so
        this costs far less per message than :meth:`send`.
        """
        msgs = messages if type(messages) is list else list(messages)
        count = len(msgs)
        if count == 0:
            return 0
        if self._idle or self.pump.trace is not None or set(map(type, msgs)) != _ONLY_BYTES:
            # First message after idle, tracing, or non-bytes: one by one for exact errors.
            self.send(msgs[0])
            start = 1
            if self.pump.trace is not None or set(map(type, msgs)) != _ONLY_BYTES:
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

    def _send_traced(self, message: bytes) -> None:
        if type(message) is bytes and len(message) <= self._room:  # send's fast path
            self._room -= len(message)
            self._push(message)
        else:
            self._send_slow(message)
        log = self._tx_log
        step = self.pump._step
        if step != log.last_step:
            log.mark(step, self.pump.now())
        self._log_size(len(message))

    def send_nowait(self, message: bytes) -> None:
        """Alias of :meth:`send` (which never waits), for symmetry with the async face."""
        self.send(message)

    def _send_slow(self, message: Any) -> None:
        if self._state is not _State.OPEN:
            if self._closed_here:
                raise trio.ClosedResourceError("message queue was closed")
            raise trio.BrokenResourceError(f"link is closed: {self._reason}")
        if type(message) is not bytes:
            if not isinstance(message, (bytearray, memoryview)):
                raise TypeError(f"message must be bytes, bytearray or memoryview, "
                                f"not {type(message).__name__}")
            message = bytes(message)  # the queue keeps it: take an immutable copy
        n = len(message)
        if n > self.max_message_size:
            raise MessageTooLargeError(f"message of {n} bytes exceeds max_message_size "
                                       f"{self.max_message_size}")
        if self._channel._peer_gone is not None:
            raise trio.BrokenResourceError(f"peer disconnected: {self._channel._peer_gone}")
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
        if self._state is _State.CLOSED or self._channel._peer_gone is not None:
            return  # with the peer gone, what is still queued is reported as not sent
        q = self._outq
        i = self._qhead
        n = len(q)
        rb = self._tx_rb
        cap = self._capacity
        used_before = lib.rb_used(rb) if self.pump.trace is not None else 0
        done_bytes = 0
        moved = False
        start = i
        while i < n:
            if self._tx_off >= 0:
                progressed, finished = self._write_piece(rb)
                moved = moved or progressed
                if not finished:
                    break
                done_bytes += len(q[i])
                i += 1
                continue
            msg = q[i]
            ln = len(msg)
            if ln > _SMALL:
                if _put_frame(rb, msg, ln):
                    i += 1
                    done_bytes += ln
                    moved = True
                    continue
                if ln + HEADER_SIZE > cap:
                    self._start_piecewise(msg)
                    continue
                break
            # Only as many as can fit (judged by this message's size): measuring a
            # thousand lengths to move sixty wastes more than the move costs.
            room = _free_space(rb)
            fit = (room if room < _JOIN_MAX else _JOIN_MAX) // (ln + HEADER_SIZE) + 1
            batch = q[i:i + (fit if fit < _BATCH else _BATCH)]
            lens = _from_buffer("uint32_t[]", _array("I", map(len, batch)))
            k = _frames_fit(rb, lens, len(batch), _JOIN_MAX)
            if k == 0:
                if ln + HEADER_SIZE > cap:
                    self._start_piecewise(msg)
                    continue
                break
            if k < len(batch):
                del batch[k:]
            data = b"".join(batch)
            _put_frames(rb, data, lens, k)
            i += k
            done_bytes += len(data)
            moved = True
        self._sent += i - start
        chan = self._channel
        if self.pump.trace is not None and moved:
            self._trace_bytes("write", chan.tx_dir, lib.rb_used(rb) - used_before, i < n)
        if i < n:
            # Before telling the peer: a peer that drains at once (a socket's fast path)
            # must find us waiting for room, or its notice is lost.
            chan._blocked = True  # the channel posts this task again when room frees
        if moved:
            chan._wrote()
        if i < n:
            if i > 4096:
                del q[:i]
                i = 0
            self._qhead = i
            if self._state is _State.OPEN:
                self._room += done_bytes
                if self._want_drained and self.high_water - self._room <= self.low_water:
                    self._want_drained = False
                    self.pump.post("drained", self._run_drained, owner=self)
            return
        q.clear()
        self._qhead = 0
        if self._state is _State.OPEN:
            self._idle = True
            self._room = _IDLE_ROOM
            if self._want_drained:
                self._want_drained = False
                self.pump.post("drained", self._run_drained, owner=self)
        elif self._state is _State.CLOSING:
            self._finish_close()

    def _trace_bytes(self, kind: str, direction: str, size: int, partial: bool) -> None:
        c = self._channel
        self.pump.emit(kind, broker=c.local, peer=c.remote, port=c.port, link=c.trace_link,
                       dir=direction, size=size, outcome="partial" if partial else None)

    def _start_piecewise(self, msg: bytes) -> None:
        self._tx_off = 0
        self._tx_hdr = len(msg).to_bytes(HEADER_SIZE, "big")
        self._tx_body = ffi.from_buffer(msg)

    def _write_piece(self, rb: Any) -> tuple[bool, bool]:
        """Stream the current message; return (wrote anything, finished)."""
        off = self._tx_off
        before = off
        if off < HEADER_SIZE:
            off += lib.rb_write(rb, self._tx_hdr[off:], HEADER_SIZE - off)
        body = self._tx_body
        total = HEADER_SIZE + len(body)
        if HEADER_SIZE <= off < total:
            off += lib.rb_write(rb, body + (off - HEADER_SIZE), total - off)
        if off == total:
            self._tx_off = -1
            self._tx_body = None
            return True, True
        self._tx_off = off
        return off > before, False


    def _run_drained(self) -> None:
        listener = self._listener
        if self._state is _State.OPEN and listener is not None:
            drained = getattr(listener, "drained", None)
            if drained is not None:
                drained()

    # -- receiving ---------------------------------------------------------------------

    def _on_readable(self) -> None:
        """Channel notification: bytes arrived.  Deliver every complete message."""
        if self._state is _State.CLOSING:
            # Delivery stopped at close(): drop what arrives, so that a peer closing
            # at the same time can flush too, and its disconnect reaches us.
            dropped = lib.rb_skip(self._rx_rb, lib.rb_used(self._rx_rb))
            self._channel._consumed(dropped)
            return
        if self._listener is None or self._paused or self._state is not _State.OPEN:
            return
        rb = self._rx_rb
        used_before = lib.rb_used(rb) if self.pump.trace is not None else 0
        s = _scratch
        out = s.out
        lens = s.lens
        used = s.used
        taken = False
        listener = self._listener
        while not self._paused and self._state is _State.OPEN:
            if self._rx_hdr_got >= 0 or self._rx_body is not None:
                progressed, message = self._read_piece(rb)
                taken = taken or progressed
                if message is None:
                    break
                self._deliver_one(listener, message)
                continue
            count = _take_frames(rb, out, _OUTCAP, lens, _BATCH, _SMALL, used)
            if count:
                taken = True
                data = _ffi_buffer(out, used[0])[:]
                if self.pump.trace is not None:
                    self._deliver_traced(listener, data, _unpack(lens, count))
                    continue
                self._received += count
                recv = listener.received
                off = 0
                for end in accumulate(_unpack(lens, count)):
                    recv(data[off:end])
                    off = end
                continue
            status = _frame_status(rb, s.len32)
            if status == _FRAME_NONE:
                if self._capacity >= HEADER_SIZE or not lib.rb_used(rb):
                    break
                self._rx_hdr_got = 0  # a ring smaller than a header: assemble it
                continue
            ln = s.len32[0]
            if ln > self.max_message_size:
                self._protocol_error(f"frame of {ln} bytes exceeds max_message_size "
                                     f"{self.max_message_size}")
                return
            if status == _FRAME_COMPLETE:
                region = lib.rb_readable_region(rb, s.ptr)
                if region >= ln + HEADER_SIZE:
                    message = _ffi_buffer(s.ptr[0] + HEADER_SIZE, ln)[:]
                    lib.rb_skip(rb, ln + HEADER_SIZE)
                    taken = True
                    self._deliver_one(listener, message)
                    continue
            elif ln + HEADER_SIZE <= self._capacity:
                break  # the rest of the frame will fit: wait for it
            lib.rb_skip(rb, HEADER_SIZE)
            taken = True
            self._start_body(ln)
        chan = self._channel
        if self.pump.trace is not None and taken:
            self._trace_bytes("read", chan.rx_dir, used_before - lib.rb_used(rb),
                              self._rx_body is not None or self._rx_hdr_got >= 0)
        chan._consumed(taken)
        if chan._peer_gone is not None and self._state is _State.OPEN and not self._paused:
            self._check_cut()

    def _deliver_one(self, listener: Any, message: bytes) -> None:
        self._received += 1
        pump = self.pump
        if pump.trace is not None:
            self._rx_log.add(pump._step, pump.now(), len(message))
        listener.received(message)

    def _deliver_traced(self, listener: Any, data: bytes, lens: list[int]) -> None:
        pump = self.pump
        self._rx_log.add_batch(pump._step, pump.now(), lens)
        self._received += len(lens)
        recv = listener.received
        off = 0
        for end in accumulate(lens):
            recv(data[off:end])
            off = end

    def _start_body(self, ln: int) -> None:
        self._rx_body = bytearray(ln)
        self._rx_body_ptr = ffi.from_buffer(self._rx_body, require_writable=True)
        self._rx_got = 0

    def _read_piece(self, rb: Any) -> tuple[bool, bytes | None]:
        """Assemble a header or body that arrives in pieces; return (took bytes, message)."""
        took = False
        if self._rx_hdr_got >= 0:
            got = self._rx_hdr_got
            hdr = ffi.from_buffer(self._rx_hdr, require_writable=True)
            k = lib.rb_read(rb, hdr + got, HEADER_SIZE - got)
            took = k > 0
            got += k
            if got < HEADER_SIZE:
                self._rx_hdr_got = got
                return took, None
            self._rx_hdr_got = -1
            ln = int.from_bytes(self._rx_hdr, "big")
            if ln > self.max_message_size:
                self._protocol_error(f"frame of {ln} bytes exceeds max_message_size "
                                     f"{self.max_message_size}")
                return took, None
            self._start_body(ln)
        body = self._rx_body
        assert body is not None
        need = len(body) - self._rx_got
        if need:
            k = lib.rb_read(rb, self._rx_body_ptr + self._rx_got, need)
            took = took or k > 0
            self._rx_got += k
            if k < need:
                return took, None
        self._rx_body = None
        self._rx_body_ptr = None
        return took, bytes(body)

    def _check_cut(self) -> None:
        """The peer is gone: bytes of an unfinished frame left over are a cut stream."""
        rb = self._rx_rb
        pending = lib.rb_used(rb)
        if self._rx_body is not None:
            self._protocol_error(f"stream cut mid-frame: {self._rx_got} of {len(self._rx_body)}"
                                 f" body bytes arrived before the peer disconnected")
        elif pending or self._rx_hdr_got >= 0:
            self._protocol_error(f"stream cut mid-frame: {pending} bytes of an incomplete frame"
                                 f" left when the peer disconnected")

    def _protocol_error(self, what: str) -> None:
        err = ProtocolError(what)
        log.warning("link %s (%s -> %s): protocol error: %s", self._channel.link_id,
                    self._channel.remote, self._channel.local, what)
        c = self._channel
        self.pump.emit("protocol_error", broker=c.local, peer=c.remote, port=c.port,
                       link=c.trace_link, dir=c.rx_dir, reason=what)
        self._end_abruptly(f"protocol error: {err}")

    # -- closing -----------------------------------------------------------------------

    def close(self, reason: str = "closed") -> None:
        """Close gracefully: messages already sent are flushed first, then the link ends.

        Delivery stops at once (messages still arriving are dropped, so a peer
        closing at the same moment can finish too); the listener gets
        ``closed(reason)`` when done.  If the peer leaves first, the reason
        counts the queued messages that were not sent.  ``abort`` does not wait.
        """
        if self._state is not _State.OPEN:
            return
        self._closed_here = True
        self._state = _State.CLOSING
        self._reason = reason
        self._room = _CLOSED_ROOM
        if self._qhead == len(self._outq) and self._tx_off < 0:
            self._finish_close()
        else:
            self._on_readable()  # drops what already arrived; delivery has stopped

    def abort(self, reason: str = "aborted") -> None:
        """Close at once; messages not yet written into the link are dropped (and counted)."""
        if self._state is not _State.CLOSED:
            self._closed_here = True
            self._end_abruptly(reason)

    def _end_abruptly(self, reason: str) -> None:
        if self._state is _State.CLOSED:
            return
        unsent = len(self._outq) - self._qhead
        if unsent:
            reason = f"{reason}; {unsent} queued messages not sent"
        self._reason = reason
        self._finish_close(error=True)

    def _finish_close(self, *, error: bool = False) -> None:
        self._state = _State.CLOSED
        self._room = _CLOSED_ROOM
        self._channel.disconnect(self._reason or "closed", error=error)

    def _on_channel_closed(self, reason: str) -> None:
        if self._state is _State.OPEN and (self._rx_body is not None or self._rx_hdr_got >= 0):
            got = self._rx_got if self._rx_body is not None else max(self._rx_hdr_got, 0)
            reason = f"protocol error: stream cut mid-frame ({got} bytes of it arrived); {reason}"
            log.warning("link %s (%s -> %s): %s", self._channel.link_id, self._channel.remote,
                        self._channel.local, reason)
        if self._state is not _State.CLOSED:
            unsent = len(self._outq) - self._qhead
            if unsent:
                reason = f"{reason}; {unsent} queued messages not sent"
            self._state = _State.CLOSED
            self._room = _CLOSED_ROOM
            self._reason = reason
        self._outq.clear()
        self._qhead = 0
        c = self._channel
        if self.pump.trace is not None:
            self._tx_log.done = self._rx_log.done = True
        self.pump.emit("close", broker=c.local, peer=c.remote, port=c.port, link=c.trace_link,
                       reason=self._reason or reason)
        listener = self._listener
        if listener is not None:
            listener.closed(self._reason or reason)

    # -- statistics --------------------------------------------------------------------

    def statistics(self) -> QueueStatistics:
        pending = self._outq[self._qhead:] if self._state is not _State.CLOSED else []
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
        )
