"""The frame codec, sans-I/O: whole messages to and from a byte ring.

A frame is a 4-byte big-endian length, then the body.  The decoder is fed
bytes (:meth:`FrameDecoder.receive_data`, or a link's peer writing into its
ring) and hands back whole messages, or ``None`` for "need more data"; a
length above the limit, or a stream that ends inside a frame, raises
:class:`ProtocolError`.  The encoder puts messages into a ring as frames, as
many as fit.  Neither does I/O, posts tasks or traces: MessageQueue does, around them.

Small frames move many per C call; a frame that is bigger than the ring (or
wraps around its end) is moved in pieces.
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Callable, Sequence

from pump import ConfigError

from ._errors import ProtocolError
from ._messages import JOIN_MAX, Batch, Gather
from ._ring import FRAME_COMPLETE, FRAME_NONE, HEADER_SIZE, RingBuffer

#: Bodies up to this size are batched (many frames per C call); larger ones move one by one.
SMALL_BODY = 8192
#: Most frames judged for one batched put.
PUT_BATCH = 1024

#: Frames out of the decoder: the bodies, and their lengths, in order.
Frames = tuple[Sequence[bytes], list[int]]

#: A header at or above this is a close frame: ``CLOSE_MARK + n``, then ``n`` bytes,
#: ``"<cause>:<reason>"`` in UTF-8.  Over a byte stream it is the last thing a side sends
#: before its end of stream, so that the peer can tell a close from a crash.
CLOSE_MARK = 0xFFFF0000
#: The longest message a queue may be set to take: the headers above are close frames.
MAX_MESSAGE_BODY = CLOSE_MARK - 1
#: Longest body of a close frame (a longer reason is cut).
MAX_CLOSE_BODY = 1000


def close_frame(reason: str, cause: str) -> bytes:
    """The close frame that says ``cause`` (a :class:`CloseCause` value) and ``reason``."""
    body = f"{cause}:{reason}".encode()[:MAX_CLOSE_BODY]
    return (CLOSE_MARK + len(body)).to_bytes(HEADER_SIZE, "big") + body


#: Bytes all the unfinished frames of one process may hold (see :class:`FrameBudget`).
DEFAULT_FRAME_BUDGET = 256 << 20
#: Bytes the receive rings of one process may grow by, in all (see :class:`FrameBudget`).
DEFAULT_RING_GROWTH = 64 << 20
#: The most a link's receive ring grows to (:attr:`FrameDecoder.grow_limit`).
RING_GROWTH_CAP = 1 << 20


class FrameBudget:
    """The bytes that frames still arriving in pieces hold, across every link of a process.

    A frame bigger than its link's ring is assembled in a buffer that grows with the
    bytes that arrive (never with the length the peer declares); the buffers of all links
    together may hold up to ``limit`` bytes.  The frame whose next piece would pass it
    ends its link with a protocol error; the others go on.
    """

    __slots__ = ("limit", "held", "ring_limit", "grown")

    def __init__(self, limit: int = DEFAULT_FRAME_BUDGET,
                 ring_limit: int = DEFAULT_RING_GROWTH) -> None:
        if limit < 0 or ring_limit < 0:
            raise ConfigError(f"frame budget must not be negative, got {min(limit, ring_limit)}")
        self.limit = limit
        self.held = 0
        #: What the rings that grew (:attr:`FrameDecoder.grow_limit`) added, in all, and
        #: how much they may add: a ring grows only within it, and gives back what it
        #: added when it is freed.
        self.ring_limit = ring_limit
        self.grown = 0


def _give_back(budget: FrameBudget, added: int) -> None:
    """A ring that grew was freed: what it added leaves the budget."""
    budget.grown -= added


#: The budget of this process, shared by every decoder that is not given another.
PROCESS_FRAME_BUDGET = FrameBudget()


class FrameDecoder:
    """Whole messages out of ``ring``, in order.

    ``next_frames()`` returns the messages complete now as ``(bodies, lengths)``,
    or ``None`` when more bytes are needed;
    call it until ``None``.  ``end_of_stream()`` says the peer is gone: it
    raises :class:`ProtocolError` if that cut a frame.
    """

    __slots__ = ("ring", "max_message_size", "budget", "peer_close", "_capacity", "_hdr",
                 "_hdr_got", "_body", "_need", "_got", "_charged", "batch_body", "_close_state",
                 "ring_grows")

    def __init__(self, ring: RingBuffer, *, max_message_size: int,
                 budget: FrameBudget | None = None) -> None:
        if not 0 <= max_message_size <= MAX_MESSAGE_BODY:
            raise ConfigError(f"max_message_size must be within 0..{MAX_MESSAGE_BODY}")
        self.ring = ring
        self.max_message_size = max_message_size
        self.budget = PROCESS_FRAME_BUDGET if budget is None else budget
        self._capacity = ring.capacity
        #: The longest body taken in batches: frames above the limit must reach the
        #: length check, not a batch.
        self.batch_body = min(SMALL_BODY, max_message_size)
        self._hdr = bytearray(HEADER_SIZE)
        self._hdr_got = -1  # >= 0 while a header arrives in pieces
        self._body: list[bytes] | None = None  # set while a body arrives in pieces
        self._need = 0  # its declared length
        self._got = 0  # its bytes so far
        self._charged = 0  # of them, what the budget counts (a body bigger than the ring)
        #: ``(cause, reason)`` from the peer's close frame, once it came (nothing may follow).
        self.peer_close: tuple[str, str] | None = None
        self._close_state = 0  # 1: a close frame's body is arriving; 2: it came
        #: Whether the ring may grow now: true where only this decoder and a socket touch
        #: it, as over TCP.  Then, once a frame longer than the ring has arrived in
        #: pieces, the ring grows to hold two such frames whole, up to
        #: :data:`RING_GROWTH_CAP` bytes, within the budget's
        #: :attr:`~FrameBudget.ring_limit`; its reads take a frame whole from then on,
        #: and more of the bytes that wait in the socket.  None: it never grows.
        self.ring_grows: Callable[[], bool] | None = None

    def receive_data(self, data: bytes | bytearray | memoryview) -> int:
        """Feed bytes; return how many the ring took (all, or as many as fit)."""
        return self.ring.write(data)

    @property
    def in_frame(self) -> bool:
        """Part of a frame was taken out of the ring and waits for the rest."""
        return self._hdr_got >= 0 or self._body is not None

    @property
    def progress(self) -> int:
        """Grows with every byte of an unfinished frame taken out of the ring."""
        return max(self._hdr_got, 0) + self._got

    @property
    def partial(self) -> int:
        """Bytes of the unfinished frame received so far (0 between frames)."""
        if self._body is not None:
            return HEADER_SIZE + self._got
        return max(self._hdr_got, 0) + self.ring.used

    def take_whole(self, into: deque[bytes], max_count: int) -> int:
        """Append to ``into`` up to ``max_count`` whole messages at the head of the ring
        that are short enough to batch (:attr:`batch_body`): how many, 0 when the head is
        not one (nothing else is looked at: :meth:`next_frames` takes what is left, and
        raises what is wrong).  Never while a frame is being assembled or after a close
        frame."""
        if self._hdr_got < 0 and self._body is None and not self._close_state:
            return self.ring.take_whole(into, max_count, self.batch_body)
        return 0

    def next_frames(self) -> Frames | None:
        """The messages complete now, or None: need more data."""
        ring = self.ring
        while True:
            if self._hdr_got >= 0 or self._body is not None:
                message = self._read_piece()
                if message is None:
                    return None
                if self._close_state != 1:
                    return [message], [len(message)]
                cause, _, reason = message.decode(errors="replace").partition(":")
                self.peer_close = (cause, reason)
                self._close_state = 2
            if self._close_state == 2:
                if ring.used:
                    raise ProtocolError(f"{ring.used} bytes after the close frame")
                return None
            got = ring.take_next(self.batch_body, self.max_message_size)
            if len(got) == 2:
                return got  # frames (one call: this is the hot path)
            _, status, length = got
            if status == FRAME_NONE:
                if self._capacity >= HEADER_SIZE or not ring.used:
                    return None
                self._hdr_got = 0  # a ring smaller than a header: assemble it
                continue
            if length >= CLOSE_MARK:
                ring.skip(HEADER_SIZE)
                self._start_close(length)
                continue
            self._check_length(length)
            if status == FRAME_COMPLETE:  # but round the ring's end: copied out at once
                ring.skip(HEADER_SIZE)
                return [ring.take_exact(length)], [length]
            if length + HEADER_SIZE <= self._capacity:
                return None  # the rest of the frame will fit: wait for it
            # bigger than the ring: in pieces, as they arrive
            ring.skip(HEADER_SIZE)
            self._start_body(length)

    def _check_length(self, length: int) -> None:
        if length > self.max_message_size:
            raise ProtocolError(f"frame of {length} bytes exceeds max_message_size "
                                f"{self.max_message_size}")

    def _read_piece(self) -> bytes | None:
        """Assemble a header or a body that arrives in pieces."""
        ring = self.ring
        if self._hdr_got >= 0:
            got = self._hdr_got + ring.readinto(memoryview(self._hdr)[self._hdr_got:])
            if got < HEADER_SIZE:
                self._hdr_got = got
                return None
            self._hdr_got = -1
            length = int.from_bytes(self._hdr, "big")
            if length >= CLOSE_MARK:
                self._start_close(length)
            else:
                self._check_length(length)
                self._start_body(length)
        body = self._body
        assert body is not None
        got, need = self._got, self._need
        if got < need:
            n = min(ring.used, need - got)
            if not n:
                return None
            # a body bigger than the ring (or a close frame's) grows with what arrives,
            # within the budget, in pieces taken as they lie in the ring (each copied once)
            budget = self.budget
            if budget.held + n > budget.limit:
                raise ProtocolError(
                    f"frame of {need} bytes: {got} arrived, and the next {n} would pass "
                    f"the process's budget of {budget.limit} bytes for unfinished frames")
            budget.held += n
            self._charged += n
            while n:  # the bytes may wrap round the ring's end: two runs
                piece = ring.take_run(n)
                body.append(piece)
                got += len(piece)
                n -= len(piece)
            self._got = got
            if got < need:
                return None
        self.discard()
        grows = self.ring_grows
        if grows is not None and self._close_state == 0 and grows():
            self._grow(need)
        # the pieces are joined once (growing one buffer copied it again and again)
        return body[0] if len(body) == 1 else b"".join(body)

    def _grow(self, length: int) -> None:
        """A frame of ``length`` bytes arrived in pieces: grow the ring to hold two of
        them whole, as far as :data:`RING_GROWTH_CAP` and the budget allow, and only if
        it then holds one whole.  Grown by what arrived, never by what a header declares."""
        want = 1 << (2 * (length + HEADER_SIZE) - 1).bit_length()
        capacity = min(want, RING_GROWTH_CAP)
        added = capacity - self._capacity
        budget = self.budget
        if (capacity < length + HEADER_SIZE or added <= 0
                or budget.grown + added > budget.ring_limit):
            return
        try:
            self.ring.grow(capacity)
        except MemoryError:
            return
        budget.grown += added
        weakref.finalize(self.ring, _give_back, budget, added)
        self._capacity = capacity

    def _start_body(self, length: int) -> None:
        self._body = []  # the pieces of what arrived
        self._need = length
        self._got = 0

    def _start_close(self, header: int) -> None:
        if header - CLOSE_MARK > MAX_CLOSE_BODY:
            raise ProtocolError(f"close frame of {header - CLOSE_MARK} bytes exceeds "
                                f"{MAX_CLOSE_BODY}")
        self._close_state = 1
        self._start_body(header - CLOSE_MARK)

    def discard(self) -> None:
        """Drop the frame being assembled (done, or its link closed): its bytes leave the
        budget and its buffer is freed."""
        self.budget.held -= self._charged
        self._charged = 0
        self._body = None

    def end_of_stream(self) -> None:
        """The peer is gone and nothing more will arrive: a cut frame is a protocol error."""
        if self._body is not None:
            raise ProtocolError(f"stream cut mid-frame: {self._got} of {self._need} "
                                "body bytes arrived before the peer disconnected")
        pending = self.ring.used
        if pending or self._hdr_got >= 0:
            raise ProtocolError(f"stream cut mid-frame: {pending} bytes of an incomplete "
                                "frame left when the peer disconnected")


class FrameEncoder:
    """Messages into ``ring`` as frames, in order, each whole before the next begins.

    ``write(messages, start)`` moves ``messages[start:]`` as far as the ring
    takes them and returns ``(index, done_bytes, moved)``: the index of the
    first message not wholly in the ring, the body bytes of the messages that
    are, and whether any byte moved.  A message bigger than the ring goes in
    pieces over several calls (:attr:`streaming` meanwhile).  Where :attr:`spans`
    says that messages came from a :class:`Batch`, their frames are copied from its
    joined bodies.
    """

    __slots__ = ("ring", "_capacity", "_off", "_hdr", "_body", "_rest", "spans")

    def __init__(self, ring: RingBuffer) -> None:
        self.ring = ring
        #: Runs of the messages that came from a Batch, in order: ``[index, batch, first,
        #: count]``: ``messages[index:index + count]`` are the batch's from ``first`` on.
        #: The queue that owns the messages keeps it (and shifts it when it trims them).
        self.spans: deque[tuple[int, Batch, int, int]] = deque()
        self._capacity = ring.capacity
        self._off = -1  # >= 0 while the message at the index streams in pieces
        self._hdr = b""  # its header
        self._body = memoryview(b"")  # and what is left of its body (piece), not copied
        self._rest: list[bytes | memoryview] = []  # a Gather's pieces after it, reversed

    @property
    def streaming(self) -> bool:
        return self._off >= 0

    def write(self, messages: Sequence[bytes | Gather], start: int) -> tuple[int, int, bool]:
        """Frame ``messages[start:]`` into the ring while it has room (next index, bytes,
        moved?).  One function although long: the hot path of every send."""
        ring = self.ring
        cap = self._capacity
        i = start
        n = len(messages)
        done = 0
        moved = False
        spans = self.spans
        while i < n:
            if self._off >= 0:
                progressed, finished = self._write_piece()
                moved = moved or progressed
                if not finished:
                    break
                done += len(messages[i])
                i += 1
                continue
            if spans:
                at, batch, first, count = spans[0]
                if at + count <= i:  # passed
                    spans.popleft()
                    continue
                if at <= i:  # the batch's frames, from its joined bodies
                    skip = i - at
                    k, nbytes = ring.put_joined(batch.joined, first + skip, count - skip)
                    if k:
                        i += k
                        done += nbytes
                        moved = True
                        if k < count - skip:
                            break  # no room for the next
                        continue
                    if len(messages[i]) + HEADER_SIZE > cap:
                        self._start_piecewise(messages[i])
                        continue
                    break
            msg = messages[i]
            ln = len(msg)
            if ln > SMALL_BODY:
                j, nbytes = ring.put_each(messages, i, SMALL_BODY)
                if j > i:
                    i = j
                    done += nbytes
                    moved = True
                    if j < n and len(messages[j]) > SMALL_BODY and type(messages[j]) is bytes:
                        break  # put_each stopped for want of room: so do we
                    continue
                if ln + HEADER_SIZE > cap or type(msg) is Gather:
                    self._start_piecewise(msg)
                    continue
                break
            k, nbytes = ring.put_batch(messages, i, JOIN_MAX, PUT_BATCH)
            if k == 0:
                if ln + HEADER_SIZE > cap:
                    self._start_piecewise(msg)
                    continue
                break
            i += k
            done += nbytes
            moved = True
        return i, done, moved

    def _start_piecewise(self, msg: bytes | Gather) -> None:
        self._off = 0
        self._hdr = len(msg).to_bytes(HEADER_SIZE, "big")
        if type(msg) is Gather:
            self._rest = msg.pieces[::-1]
            self._body = memoryview(self._rest.pop() if self._rest else b"")
        else:
            self._body = memoryview(msg)  # type: ignore[arg-type]

    def resume(self, msg: bytes | Gather, sent: int) -> None:
        """Go on with ``msg`` in pieces, its first ``sent`` bytes (header and body, fewer
        than all) having left another way (:attr:`Channel.direct`)."""
        self._start_piecewise(msg)
        self._off = sent
        skip = sent - HEADER_SIZE
        while skip > 0:
            body = self._body
            if skip < len(body):
                self._body = body[skip:]
                return
            skip -= len(body)
            self._body = memoryview(self._rest.pop() if self._rest else b"")

    def _write_piece(self) -> tuple[bool, bool]:
        """Stream the current message; return (wrote anything, finished)."""
        ring = self.ring
        off = before = self._off
        if off < HEADER_SIZE:
            off += ring.write(self._hdr[off:])
            if off < HEADER_SIZE:
                self._off = off
                return off > before, False
        while True:
            body = self._body
            if body:
                n = ring.write(body)
                off += n
                if n < len(body):
                    self._body = body[n:]
                    self._off = off
                    return off > before, False
            if not self._rest:
                break
            self._body = memoryview(self._rest.pop())
        self._off = -1
        self._body = memoryview(b"")
        return True, True
