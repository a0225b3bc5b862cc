"""The trio face of a MessageQueue, for embedding: ``await send``, ``await receive``, ``async for``.

It runs on a pump served by trio (``await pump.serve()``); its listener side runs
as pump tasks and wakes the trio tasks waiting on it.
"""

from __future__ import annotations

from collections import deque
from types import TracebackType

import trio

from ._cause import CloseCause
from ._errors import QueueFullError
from ._queue import MessageQueue, QueueStatistics

#: Messages held for ``receive`` before the queue stops reading (the sender then waits).
DEFAULT_RECEIVE_BUFFER = 1024


class AsyncMessageQueue:
    """Await-able twin of :class:`MessageQueue`, named like trio's memory channels.

    ``send`` waits while the send backlog is past the high-water mark;
    ``receive`` waits for the next message.  Memory is bounded on both sides:
    at most ``receive_buffer`` messages wait for ``receive`` before reading
    pauses and backpressure reaches the sender.

    End of the link: ``receive`` raises ``trio.EndOfChannel`` after the peer
    closed cleanly and every message it sent was received,
    ``trio.BrokenResourceError`` (reason in the message) if the link broke,
    ``trio.ClosedResourceError`` after our own ``aclose``.
    """

    def __init__(self, queue: MessageQueue, *,
                 receive_buffer: int = DEFAULT_RECEIVE_BUFFER) -> None:
        if receive_buffer < 1:
            raise ValueError("receive_buffer must be at least 1")
        self._queue = queue
        self._limit = receive_buffer
        self._inbox: deque[bytes] = deque()
        self._reason: str | None = None
        self._local_close = False
        self._recv_lot = trio.lowlevel.ParkingLot()
        self._send_lot = trio.lowlevel.ParkingLot()
        self._closed_event = trio.Event()
        queue.set_listener(self)

    # -- listener side: runs as pump tasks ------------------------------------------

    def received(self, message: bytes) -> None:
        inbox = self._inbox
        inbox.append(message)
        if len(inbox) >= self._limit:
            self._queue.pause_reading()
        if self._recv_lot:
            self._recv_lot.unpark()

    def drained(self) -> None:
        self._send_lot.unpark_all()

    def closed(self, reason: str) -> None:
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

    async def send(self, message: bytes) -> None:
        """Queue one message, waiting while the send backlog is past the high-water mark."""
        await trio.lowlevel.checkpoint_if_cancelled()
        while True:
            try:
                self._queue.send(message)
            except QueueFullError:
                await self._send_lot.park()
                continue
            break
        await trio.lowlevel.cancel_shielded_checkpoint()

    def send_nowait(self, message: bytes) -> None:
        """Queue one message or raise :class:`QueueFullError` (a ``trio.WouldBlock``)."""
        self._queue.send(message)

    # -- receiving ---------------------------------------------------------------------

    def _end(self) -> Exception:
        if self._local_close:
            return trio.ClosedResourceError("message queue was closed")
        queue = self._queue
        if queue.close_cause is CloseCause.CLEAN and not queue.closed_here:
            return trio.EndOfChannel(self._reason)  # the peer closed cleanly
        return trio.BrokenResourceError(self._reason)

    def receive_nowait(self) -> bytes:
        """The next message, or ``trio.WouldBlock`` when none has arrived."""
        inbox = self._inbox
        if not inbox:
            if self._reason is not None:
                raise self._end()
            raise trio.WouldBlock
        message = inbox.popleft()
        if len(inbox) <= self._limit // 2 and self._queue.reading_paused:
            self._queue.resume_reading()
        return message

    async def receive(self) -> bytes:
        """Wait for the next message."""
        await trio.lowlevel.checkpoint_if_cancelled()
        while not self._inbox and self._reason is None:
            await self._recv_lot.park()
        message = self.receive_nowait()
        await trio.lowlevel.cancel_shielded_checkpoint()
        return message

    def __aiter__(self) -> AsyncMessageQueue:
        return self

    async def __anext__(self) -> bytes:
        try:
            return await self.receive()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None

    # -- closing -----------------------------------------------------------------------

    async def aclose(self) -> None:
        """Flush what was sent, then close; if cancelled meanwhile, abort the link."""
        self._local_close = self._reason is None
        self._queue.close()
        try:
            await self._closed_event.wait()
        except trio.Cancelled:
            self._queue.abort("cancelled while closing")
            raise

    async def __aenter__(self) -> AsyncMessageQueue:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.aclose()
