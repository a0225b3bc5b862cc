"""The trio face of a MessageQueue, for embedding: ``await send``, ``await receive``, ``async for``.

It runs on a pump served by trio (``await pump.serve()``).  On an untraced pump the
data path of one message runs in the trio tasks that await it: ``send`` puts the
frame into the link's ring when nothing is queued before it, and ``receive`` takes
what has arrived out of the ring when its inbox is empty; an arrival only wakes a
receiver that waits.  What that fast path does not take (a backlog, a message longer
than the codec batches, a frame in pieces, the peer's end) goes through the queue's
pump tasks, as on a traced pump, whose reads are recorded as the read task's.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Iterable
from types import TracebackType

import trio

from pump import ConfigError

from ._cause import CloseCause
from ._errors import QueueFullError
from ._messages import Batch, Gather
from ._queue import MessageQueue, QueueStatistics

#: Messages held for ``receive`` before the queue stops reading (the sender then waits).
DEFAULT_RECEIVE_BUFFER = 1024

# trio's checkpoints, looked up once: each message's send and receive make two
_checkpoint_if_cancelled = trio.lowlevel.checkpoint_if_cancelled
_cancel_shielded_checkpoint = trio.lowlevel.cancel_shielded_checkpoint


class AsyncMessageQueue:
    """Await-able twin of :class:`MessageQueue`, named like trio's memory channels.

    ``send`` waits while the send backlog is past the high-water mark;
    ``receive`` waits for the next message.  Memory is bounded on both sides:
    messages wait in the link's ring until ``receive`` asks (one take brings at most
    ``receive_buffer`` of them); those the read task delivers (on a traced pump, or
    at the peer's end) pause reading once ``receive_buffer`` wait, after the read
    under way, which takes at most what the ring holds.  Either way a full ring
    stops the sender's writes and backpressure reaches it.

    End of the link: ``receive`` raises ``trio.EndOfChannel`` after the peer
    closed cleanly and every message it sent was received,
    ``trio.BrokenResourceError`` (reason in the message) if the link broke,
    ``trio.ClosedResourceError`` after our own ``aclose``.
    """

    def __init__(self, queue: MessageQueue, *,
                 receive_buffer: int = DEFAULT_RECEIVE_BUFFER) -> None:
        if receive_buffer < 1:
            raise ConfigError("receive_buffer must be at least 1")
        self._queue = queue
        self._limit = receive_buffer
        self._inbox: deque[bytes] = deque()
        self._reason: str | None = None
        self._local_close = False
        self._recv_lot = trio.lowlevel.ParkingLot()
        self._waiting = 0  # receivers in _wait_arrived
        self._arrivals = 0  # _arrived() calls so far (a take may run tasks that let more in)
        self._paused = False  # this face paused the queue's reading (a full inbox)
        self._send_lot = trio.lowlevel.ParkingLot()
        # drained() and closed() calls so far: a sender that ran the pump itself (and so
        # maybe the call that would have woken it) checks it before it parks
        self._send_wakes = 0
        self._closed_event = trio.Event()
        self._aclosed = False
        queue.set_listener(self)
        # messages are taken from the link as receive() asks for them (untraced pumps)
        self._pulls = queue.set_pull(self._arrived, self._behind)
        self._put_now = queue.put_now  # bound once: each message's send and take call them
        self._pull = queue.pull

    # -- listener side: runs as pump tasks ------------------------------------------

    def received(self, message: bytes) -> None:
        self.received_many([message])  # the queue calls received_many; this is the contract

    def received_many(self, messages: list[bytes]) -> None:
        inbox = self._inbox
        inbox.extend(messages)
        if len(inbox) >= self._limit:
            self._paused = True
            self._queue.pause_reading()
        if self._waiting:
            self._recv_lot.unpark()

    def _arrived(self) -> None:
        """Bytes came into the link (pulling): wake a receiver, which takes them."""
        self._arrivals += 1
        if self._waiting:
            self._recv_lot.unpark()

    def _behind(self) -> None:
        """Bytes wait faster than receivers take them (a writer waits for room, or a
        socket's bytes filled the ring half): when none waits, read them into the inbox
        now, so that the writer goes on."""
        if not self._waiting and len(self._inbox) < self._limit:
            self._queue.read_ahead(self._inbox, self._limit - len(self._inbox))

    def drained(self) -> None:
        self._send_wakes += 1
        self._send_lot.unpark_all()

    def closed(self, reason: str) -> None:
        self._send_wakes += 1
        self._reason = reason
        self._recv_lot.unpark_all()
        self._send_lot.unpark_all()
        self._closed_event.set()

    # -- identity ----------------------------------------------------------------------

    @property
    def queue(self) -> MessageQueue:
        """The listener-API queue underneath."""
        return self._queue

    @property
    def remote_id(self) -> str:
        return self._queue.remote_id

    @property
    def local_id(self) -> str:
        return self._queue.local_id

    @property
    def link_id(self) -> int:
        return self._queue.link_id

    @property
    def port(self) -> int:
        return self._queue.port

    @property
    def close_reason(self) -> str | None:
        return self._reason

    @property
    def close_cause(self) -> CloseCause | None:
        """How the link ended (None while open): see :class:`CloseCause`."""
        return self._queue.close_cause

    def statistics(self) -> QueueStatistics:
        return self._queue.statistics()

    def __repr__(self) -> str:
        return f"<AsyncMessageQueue of {self._queue!r}>"

    # -- sending -----------------------------------------------------------------------

    async def send(self, message: bytes | Gather) -> None:
        """Queue one message, waiting while the send backlog is past the high-water mark."""
        await _checkpoint_if_cancelled()
        if self._put_now(message):  # nothing queued before it: straight into the link
            await _cancel_shielded_checkpoint()
            return
        queue = self._queue
        pump = queue.pump
        while True:
            wakes = self._send_wakes
            full = False
            try:  # hold() inside: a Ctrl-C anywhere here still reaches run_held()
                pump.hold()  # the hop to the peer runs here, not in the pump's own task
                queue.send(message)
            except QueueFullError:
                full = True
            finally:
                pump.run_held()
            if not full:
                break
            if self._send_wakes == wakes:
                await self._send_lot.park()
        await _cancel_shielded_checkpoint()

    def send_nowait(self, message: bytes | Gather) -> None:
        """Queue one message or raise :class:`QueueFullError` (a ``trio.WouldBlock``)."""
        self._queue.send(message)

    async def send_many(self, messages: Iterable[bytes | Gather] | Batch) -> None:
        """Queue ``messages`` in order, waiting while the send backlog is past the
        high-water mark; one checkpoint for the batch (and one per wait), so it costs far
        less per message than :meth:`send`.

        Cancelled (or the link broken) while waiting for room, it has queued a prefix of
        the messages, each whole, and none after it: the exception's ``sent`` attribute
        (set on ``trio.Cancelled`` too) says how many.  A :class:`~channels.Batch` (the
        same messages for several queues) goes into the link from its joined bodies.
        """
        await _checkpoint_if_cancelled()
        queue = self._queue
        if isinstance(messages, Batch):
            batch: Batch | None = messages
            msgs: list[bytes | Gather] = []
            total = len(messages)
        else:
            batch = None
            msgs = messages if type(messages) is list else list(messages)
            total = len(msgs)
        done = 0
        pump = queue.pump
        try:
            while done < total:
                wakes = self._send_wakes
                try:
                    pump.hold()
                    with contextlib.suppress(QueueFullError):  # not even the first fitted
                        if batch is not None:
                            done += queue.send_batch(batch, done)
                        else:
                            done += queue.send_many(msgs[done:] if done else msgs)
                finally:
                    pump.run_held()
                if done < total and self._send_wakes == wakes:
                    await self._send_lot.park()
        except BaseException as exc:
            exc.sent = done  # type: ignore[attr-defined]
            raise
        await _cancel_shielded_checkpoint()

    # -- receiving ---------------------------------------------------------------------

    def _end(self) -> Exception:
        if self._local_close:
            return trio.ClosedResourceError("message queue was closed")
        queue = self._queue
        if queue.close_cause is CloseCause.CLEAN and not queue.closed_here:
            return trio.EndOfChannel(self._reason)  # the peer closed cleanly
        return trio.BrokenResourceError(self._reason)

    def _taken(self) -> None:
        """Messages left the inbox: reading resumes once it is down to half."""
        if self._paused and len(self._inbox) <= self._limit // 2:
            self._paused = False
            self._queue.resume_reading()

    def _take_arrived(self) -> bool:
        """Whether a message is in the inbox, taken from the link now if need be (when
        the face pulls); raises how the link ended when none is and none will be."""
        inbox = self._inbox
        if not inbox:
            if self._pulls:
                self._pull(inbox, self._limit)
            if not inbox:
                if self._reason is not None:
                    raise self._end()
                return False
        return True

    async def _wait_arrived(self) -> None:
        """Park until a message is in the inbox (or the link ended: raise how)."""
        self._waiting += 1
        try:
            while True:
                arrivals = self._arrivals
                if self._take_arrived():
                    break
                if self._arrivals == arrivals:  # else the take itself let more in: look
                    await self._recv_lot.park()
        finally:
            self._waiting -= 1

    def receive_nowait(self) -> bytes:
        """The next message, or ``trio.WouldBlock`` when none has arrived."""
        if not self._take_arrived():
            raise trio.WouldBlock
        message = self._inbox.popleft()
        if self._paused:
            self._taken()
        return message

    def receive_many_nowait(self, max_messages: int = DEFAULT_RECEIVE_BUFFER) -> list[bytes]:
        """Every message that has arrived, up to ``max_messages``, in order: an empty list
        when none has (and the link is open); ``receive``'s errors once it has ended and
        every message was received."""
        if not self._take_arrived():
            return []
        inbox = self._inbox
        if max_messages >= len(inbox):
            messages = list(inbox)
            inbox.clear()
        else:
            messages = [inbox.popleft() for _ in range(max_messages)]
        if self._paused:
            self._taken()
        return messages

    async def receive_many(self, max_messages: int = DEFAULT_RECEIVE_BUFFER) -> list[bytes]:
        """Wait for at least one message; return every one that has arrived, up to
        ``max_messages``, in order.  One checkpoint for the batch; ends like
        :meth:`receive`.  Cancelled, it has taken nothing."""
        if max_messages < 1:
            raise ConfigError("max_messages must be at least 1")
        await _checkpoint_if_cancelled()
        if not self._inbox:
            await self._wait_arrived()  # takes what has arrived first, parks if nothing has
        messages = self.receive_many_nowait(max_messages)
        await _cancel_shielded_checkpoint()
        return messages

    async def receive(self) -> bytes:
        """Wait for the next message."""
        await _checkpoint_if_cancelled()
        inbox = self._inbox
        if not inbox:
            if self._pulls:
                self._pull(inbox, self._limit)
            if not inbox:
                await self._wait_arrived()  # looks again, then parks if nothing came
        message = inbox.popleft()
        if self._paused:
            self._taken()
        await _cancel_shielded_checkpoint()
        return message

    def __aiter__(self) -> AsyncMessageQueue:
        return self

    async def __anext__(self) -> bytes:
        # receive()'s body, not a call of it: ``async for`` then runs one coroutine a
        # message, not two (each of the message's two yields passes through one frame)
        await _checkpoint_if_cancelled()
        inbox = self._inbox
        if not inbox:
            if self._pulls:
                self._pull(inbox, self._limit)
            if not inbox:
                try:
                    await self._wait_arrived()
                except trio.EndOfChannel:
                    raise StopAsyncIteration from None
        message = inbox.popleft()
        if self._paused:
            self._taken()
        await _cancel_shielded_checkpoint()
        return message

    # -- closing -----------------------------------------------------------------------

    async def aclose(self) -> None:
        """Flush what was sent, then close; returns once every byte sent has left this end
        (over TCP: handed to the kernel), so the process may end.  If cancelled meanwhile,
        abort the link.

        If the link ended (the peer gone, the connection lost) before every message sent
        had gone into it, the first ``aclose`` raises ``trio.BrokenResourceError`` with
        the reason, which counts them (:attr:`MessageQueue.unsent`): they are lost, and
        a sender that only awaited ``send`` would not know otherwise.  Later calls, and
        a link that ended with nothing left to send, return quietly."""
        first = not self._aclosed
        self._aclosed = True
        self._local_close = self._reason is None
        self._queue.close()
        try:
            await self._closed_event.wait()
            await self._queue.wait_sent()
        except trio.Cancelled:
            self._queue.abort("cancelled while closing")
            raise
        if first and self._queue.unsent:
            raise trio.BrokenResourceError(self._reason)

    async def __aenter__(self) -> AsyncMessageQueue:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        try:
            await self.aclose()
        except trio.BrokenResourceError:
            if exc is None:
                raise  # else the block's own exception says more, and is not hidden
