"""What a client of an MQ server receives: consumed messages (:class:`Message`), the
subscriptions they come from (:class:`Subscription`: ``async for``, ``receive``,
``receive_many``, acks) and what is pushed to a receiver name (:class:`Receiver`,
:class:`Pushed`).

A subscription's frames come from its client's link (:mod:`._client`), one list of
messages per frame, bounded by its window.  It keeps the offsets delivered on the
current link and not acknowledged yet, and those that had come on a lost link: an ack
of one of those is not sent (the server delivers them again after a reconnect).
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

from brokermgr import Sent, ServiceError
from channels import QueueFullError

from ._wire import pack_column

if TYPE_CHECKING:
    from ._client import MqClient


@dataclass(slots=True)
class Message:
    """A consumed message; ``deliveries`` > 1 means it was delivered before (read-only by
    convention: one is made per message, and a slotted class is several times cheaper
    to make than a frozen one)."""

    topic: str
    group: str
    offset: int
    tag: str | None
    producer: str
    sequence: int
    deliveries: int
    timestamp: int
    body: bytes
    subscription: Subscription

    async def ack(self) -> None:
        """Acknowledge this message (:meth:`Subscription.ack` batches several)."""
        await self.subscription.ack([self.offset])

    def ack_nowait(self) -> None:
        """The listener face's ack (:meth:`Subscription.ack_nowait`)."""
        self.subscription.ack_nowait([self.offset])


@dataclass(frozen=True)
class Pushed:
    """A message pushed to a receiver name; ``sender`` is the pushing link's id."""

    to: str
    sender: str
    body: bytes


class Receiver:
    """What is pushed to one receiver name (``async for``)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.inbox, self._out = trio.open_memory_channel[Pushed](math.inf)

    def __aiter__(self) -> AsyncIterator[Pushed]:
        return self._out.__aiter__()

    async def receive(self) -> Pushed:
        return await self._out.receive()


class Subscription:
    """Messages of one topic and group, as they are pushed (``async for``)."""

    def __init__(self, client: MqClient, topic: str, group: str, window: int, *,
                 on_message: Callable[[Message], object] | None = None) -> None:
        self.client = client
        self.topic = topic
        self.group = group
        self.window = window
        self.on_message = on_message
        #: Its first consume was answered (until then a reconnect does not repeat it).
        self.active = False
        # the messages of each frame, as one list (bounded by the window: the server
        # pushes at most that many unacknowledged); _ready holds what is left of one
        self.inbox, self._frames = trio.open_memory_channel[list[Message]](math.inf)
        self._ready: deque[Message] = deque()
        #: Called with an error of this subscription's acks (or of a consume a reconnect
        #: repeated); without it the error is raised by the next call.
        self.on_error: Callable[[ServiceError], object] | None = None
        self._error: ServiceError | None = None
        #: Offsets delivered on the current link and not acknowledged yet (in order), and
        #: those that had come on a lost link: an ack of one of these is not sent.
        self.held: dict[int, None] = {}
        self.stale: dict[int, None] = {}
        self.max_held = 4 * window + 1024
        #: Messages of this client's own producer are acknowledged, not handed out.
        self.no_local = False

    def link_lost(self) -> None:
        stale = self.stale
        stale.update(self.held)
        self.held = {}
        if len(stale) > self.max_held:
            for offset in list(itertools.islice(stale, len(stale) - self.max_held)):
                del stale[offset]

    def failed(self, error: ServiceError) -> None:
        """An error of a request sent without waiting (an ack): to :attr:`on_error`, or
        kept for the next call to raise."""
        if self.on_error is not None:
            self.on_error(error)
        elif self._error is None:
            self._error = error
            with contextlib.suppress(trio.ClosedResourceError):
                self.inbox.send_nowait([])  # a receive waiting for a frame raises it now

    def _raise_failed(self) -> None:
        error, self._error = self._error, None
        if error is not None:
            raise error

    def resume(self) -> None:
        """After a reconnect: consume again (fire and forget; errors come back logged)."""
        self.client.link.send({"cmd": "consume", "topic": self.topic, "group": self.group,
                               "window": self.window})

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Message:
        try:
            return await self.receive()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None

    async def receive(self) -> Message:
        """The next message (``trio.EndOfChannel`` once the subscription is closed).  A
        cancelled receive loses nothing.  Raises the error of an earlier ack, if one came
        (see the module)."""
        self._raise_failed()
        return (await self._wait_ready()).popleft()

    async def receive_many(self, max_count: int = 1000) -> list[Message]:
        """Wait for a message, then take every one already here (at most ``max_count``):
        one await for a whole frame of them."""
        self._raise_failed()
        ready = await self._wait_ready()
        while len(ready) < max_count:
            try:
                ready.extend(self._frames.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel):
                break
        if len(ready) <= max_count:
            messages = list(ready)
            ready.clear()
            return messages
        return [ready.popleft() for _ in range(max_count)]

    async def _wait_ready(self) -> deque[Message]:
        """The messages here, at least one, after a checkpoint (waiting for a frame when
        none is here)."""
        ready = self._ready
        if ready:
            await trio.lowlevel.checkpoint()
        while not ready:  # (another task may have taken them meanwhile)
            ready.extend(await self._frames.receive())
            if not ready:
                self._raise_failed()  # woken by an error (see failed)
        return ready

    async def ack(self, offsets: Sequence[int]) -> None:
        """Acknowledge offsets of this subscription (any number at once).  An ack lost
        with its link means those messages are delivered again.  Raises the error of an
        earlier ack, if one came."""
        self._raise_failed()
        link = self.client.link
        message = self.ack_request(offsets)
        if message is None:
            await trio.lowlevel.checkpoint()
            return
        while link.send(message) is Sent.FULL:
            await link.room.wait()  # past the high-water mark: wait, do not drop it
        await trio.lowlevel.checkpoint()

    def ack_nowait(self, offsets: Sequence[int]) -> None:
        """The listener face's ack; :class:`~channels.QueueFullError` if the link is past
        its high-water mark (nothing sent: ack again from ``on_drained``).  Raises the
        error of an earlier ack when there is no ``on_error``."""
        self._raise_failed()
        message = self.ack_request(offsets)
        if message is not None and self.client.link.send(message) is Sent.FULL:
            raise QueueFullError("the link is past its high-water mark; ack again later")

    def ack_request(self, offsets: Sequence[int]) -> dict[str, Any] | None:
        """The ack of ``offsets``, less those delivered on a link since lost (None if that
        leaves none); offsets never delivered stay in it, for the server to refuse."""
        held, stale = self.held, self.stale
        named = set(offsets)
        if len(named) == len(offsets) and held.keys() >= named:  # each once, all held
            deque(map(held.__delitem__, offsets), 0)
            offsets = list(offsets)
        else:
            kept = []
            for offset in offsets:
                if offset in held:
                    del held[offset]
                    kept.append(offset)
                elif offset in stale:
                    del stale[offset]  # came on a lost link: delivered again, acked then
                else:
                    kept.append(offset)  # not held: the server says why (409)
            offsets = kept
        if not offsets:
            return None
        request: dict[str, Any] = {"cmd": "ack", "topic": self.topic, "group": self.group,
                                   "offsets": offsets}
        if offsets and type(first := pack_column(offsets, counting=True)) is int:
            request.update(offsets=first, count=len(offsets))  # consecutive: the first
        return request

    async def close(self) -> None:
        self.client.subscriptions.pop((self.topic, self.group), None)
        self.inbox.close()
        await self.client.request({"cmd": "unconsume", "topic": self.topic,
                                   "group": self.group})
