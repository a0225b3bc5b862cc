"""What a client of an MQ server receives: consumed messages (:class:`Message`), the
same as columns (:class:`MessageBatch`), the subscriptions they come from
(:class:`Subscription`: ``async for``, ``receive``, ``receive_many``, ``receive_batch``,
acks) and what is pushed to a receiver name (:class:`Receiver`, :class:`Pushed`).

A subscription's frames come from its client's link (:mod:`._client`), one
:class:`MessageBatch` per frame, bounded by its window: a :class:`Message` is made only
when one is asked for, and a body is cut out of its frame only when bodies are.  It
keeps the offsets delivered on the current link and not acknowledged yet, and those
that had come on a lost link: an ack of one of those is not sent (the server delivers
them again after a reconnect).
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import repeat
from operator import attrgetter
from typing import Any, Protocol, overload

import trio

from brokermgr import BrokerLink, ReplyObject, Sent, ServiceError
from channels import SMALL_PIECE, QueueFullError, split_bodies
from pump import ConfigError

from ..topics._held import Held
from ..topics._wire import pack_column


class SubscriptionClient(Protocol):
    """What a subscription asks of its client (:class:`~mq.MqClient`): its link to the
    server, its subscriptions by topic and group, and a request answered."""

    @property
    def link(self) -> BrokerLink: ...

    @property
    def subscriptions(self) -> dict[tuple[str, str], Subscription]: ...

    async def request(self, obj: dict[str, Any]) -> ReplyObject: ...


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


def cut(body: bytes | memoryview, sizes: list[int]) -> Sequence[bytes]:
    """Bodies back to back in ``body`` as bytes each, ``sizes`` long (checked by the
    caller): of one size or small, by :func:`channels.split_bodies`; large ones of
    several sizes copied one by one out of the frame."""
    if not sizes:
        return []
    if sizes.count(sizes[0]) == len(sizes) or len(body) < len(sizes) * SMALL_PIECE:
        return split_bodies(body, sizes)
    view = memoryview(body)
    return [bytes(view[a:b]) for a, b in itertools.pairwise(itertools.accumulate(sizes,
                                                                                   initial=0))]


_OFFSETS = attrgetter("offsets")
#: A batch's columns but its offsets and bodies, in :class:`Message`'s order.
_COLUMNS = ("tags", "producers", "sequences", "deliveries", "timestamps")


def _joined_column(batches: Sequence[MessageBatch], i: int) -> list[Any]:
    """Column ``i`` (of :data:`_COLUMNS`) of ``batches`` one after the other."""
    return list(itertools.chain.from_iterable(map(attrgetter(_COLUMNS[i]), batches)))


def _joined(offsets: list[Sequence[int]]) -> Sequence[int]:
    """Runs of offsets one after the other: one range if they are ranges that follow
    each other, else a list."""
    ranges = [run for run in offsets if isinstance(run, range)]
    if len(ranges) == len(offsets) and all(a.stop == b.start
                                           for a, b in itertools.pairwise(ranges)):
        return range(ranges[0].start, ranges[-1].stop)
    return list(itertools.chain.from_iterable(offsets))


#: A column of a batch: its list, or a call that makes it (made when first read).
Column = list[Any] | Callable[[], list[Any]]


class MessageBatch:
    """Messages of one subscription as columns, in the order they came: what
    :meth:`Subscription.receive_batch` returns (one or more frames' worth).

    ``offsets`` (a ``range`` when they are consecutive, a list otherwise), ``tags``,
    ``producers``, ``sequences``, ``deliveries`` and ``timestamps`` (lists) hold one
    value per message, each made the first time it is read (a frame sends a column of
    equal values as one value); ``bodies`` are cut out of their frames the first time
    they are asked for.  A consumer that works on whole columns makes no object per
    message, and none for the columns it does not read; ``batch[i]``, iterating and
    :meth:`messages` make :class:`Message` objects as they are asked for.  Read-only by
    convention."""

    __slots__ = ("subscription", "offsets", "_columns", "_parts", "_bodies")

    def __init__(self, subscription: Subscription, offsets: Sequence[int],
                 tags: Column, producers: Column, sequences: Column, deliveries: Column,
                 timestamps: Column, *, bodies: Sequence[bytes] | None = None,
                 parts: Sequence[tuple[bytes | memoryview, list[int]]] = ()) -> None:
        self.subscription = subscription
        self.offsets = offsets
        #: tags, producers, sequences, deliveries, timestamps: each a list, or the call
        #: that makes it
        self._columns: list[Column] = [tags, producers, sequences, deliveries, timestamps]
        #: bodies not cut yet: (frame's bodies back to back, their sizes) in order
        self._parts = parts
        self._bodies = bodies

    def _column(self, i: int) -> list[Any]:
        column = self._columns[i]
        if isinstance(column, list):
            return column
        made = self._columns[i] = column()
        return made

    @property
    def tags(self) -> list[str | None]:
        return self._column(0)

    @property
    def producers(self) -> list[str]:
        return self._column(1)

    @property
    def sequences(self) -> list[int]:
        return self._column(2)

    @property
    def deliveries(self) -> list[int]:
        return self._column(3)

    @property
    def timestamps(self) -> list[int]:
        return self._column(4)

    @classmethod
    def of(cls, subscription: Subscription, messages: Sequence[Message]) -> MessageBatch:
        """The batch of ``messages`` (of ``subscription``)."""
        return cls(subscription, [m.offset for m in messages], [m.tag for m in messages],
                   [m.producer for m in messages], [m.sequence for m in messages],
                   [m.deliveries for m in messages], [m.timestamp for m in messages],
                   bodies=[m.body for m in messages])

    @classmethod
    def join(cls, batches: Sequence[MessageBatch]) -> MessageBatch:
        """One batch of ``batches`` (of one subscription), in order; bodies still in
        their frames stay there."""
        first = batches[0]
        offsets = _joined(list(map(_OFFSETS, batches)))
        columns = [partial(_joined_column, batches, i) for i in range(len(_COLUMNS))]
        uncut = [b.uncut for b in batches]
        if all(parts is not None for parts in uncut):
            return cls(first.subscription, offsets, *columns,
                       parts=[part for parts in uncut if parts is not None for part in parts])
        bodies = list(itertools.chain.from_iterable(b.bodies for b in batches))
        return cls(first.subscription, offsets, *columns, bodies=bodies)

    @property
    def topic(self) -> str:
        return self.subscription.topic

    @property
    def group(self) -> str:
        return self.subscription.group

    @property
    def uncut(self) -> Sequence[tuple[bytes | memoryview, list[int]]] | None:
        """The bodies still in their frames (each frame's bodies back to back, and their
        sizes), or None once they were cut."""
        return self._parts if self._bodies is None else None

    @property
    def bodies(self) -> Sequence[bytes]:
        """The messages' bodies, in order."""
        bodies = self._bodies
        if bodies is None:
            parts = self._parts
            if len(parts) == 1:
                bodies = cut(*parts[0])
            else:
                bodies = list(itertools.chain.from_iterable(cut(*part) for part in parts))
            self._bodies, self._parts = bodies, ()
        return bodies

    def __len__(self) -> int:
        return len(self.offsets)

    @overload
    def __getitem__(self, index: int) -> Message: ...

    @overload
    def __getitem__(self, index: slice) -> MessageBatch: ...

    def __getitem__(self, index: int | slice) -> Message | MessageBatch:
        if isinstance(index, slice):
            return MessageBatch(self.subscription, self.offsets[index], self.tags[index],
                                self.producers[index], self.sequences[index],
                                self.deliveries[index], self.timestamps[index],
                                bodies=list(self.bodies[index]))
        subscription = self.subscription
        return Message(subscription.topic, subscription.group, self.offsets[index],
                       self.tags[index], self.producers[index], self.sequences[index],
                       self.deliveries[index], self.timestamps[index], self.bodies[index],
                       subscription)

    def messages(self, start: int = 0, stop: int | None = None) -> list[Message]:
        """The messages from ``start`` up to ``stop`` (the end), as :class:`Message`."""
        cut_at = slice(start, stop)
        return list(self._made(self.offsets[cut_at], self.tags[cut_at],
                               self.producers[cut_at], self.sequences[cut_at],
                               self.deliveries[cut_at], self.timestamps[cut_at],
                               self.bodies[cut_at]))

    def __iter__(self) -> Iterator[Message]:
        return self._made(self.offsets, self.tags, self.producers, self.sequences,
                          self.deliveries, self.timestamps, self.bodies)

    def _made(self, *columns: Sequence[Any]) -> Iterator[Message]:
        subscription = self.subscription
        return map(Message, repeat(subscription.topic), repeat(subscription.group),
                   *columns, repeat(subscription))

    def __repr__(self) -> str:
        return (f"<MessageBatch of {len(self)} messages of {self.topic!r} "
                f"in group {self.group!r}>")

    async def ack(self) -> None:
        """Acknowledge every message of the batch (:meth:`Subscription.ack`)."""
        await self.subscription.ack(self.offsets)

    def ack_nowait(self) -> None:
        """The listener face's ack of every message of the batch
        (:meth:`Subscription.ack_nowait`)."""
        self.subscription.ack_nowait(self.offsets)


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

    def __init__(self, client: SubscriptionClient, topic: str, group: str, window: int, *,
                 on_message: Callable[[Message], object] | None = None) -> None:
        self.client = client
        self.topic = topic
        self.group = group
        self.window = window
        self.on_message = on_message
        #: Its first consume was answered (until then a reconnect does not repeat it).
        self.active = False
        # the messages of each frame, as one batch (bounded by the window: the server
        # pushes at most that many unacknowledged); _ready holds the batches taken off
        # it, of which the first has had its first _taken messages handed out
        self.inbox, self._frames = trio.open_memory_channel[MessageBatch](math.inf)
        self._ready: deque[MessageBatch] = deque()
        self._taken = 0
        #: Called with an error of this subscription's acks (or of a consume a reconnect
        #: repeated); without it the error is raised by the next call.
        self.on_error: Callable[[ServiceError], object] | None = None
        self._error: ServiceError | None = None
        #: Offsets delivered on the current link and not acknowledged yet, and those
        #: that had come on a lost link (in order): an ack of one of these is not sent.
        self.held: Held[None] = Held()
        self.stale: dict[int, None] = {}
        self.max_held = 4 * window + 1024
        #: Messages of this client's own producer are acknowledged, not handed out.
        self.no_local = False

    def link_lost(self) -> None:
        stale = self.stale
        stale.update(self.held.drain())
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
                # a receive waiting for a frame raises it now
                self.inbox.send_nowait(MessageBatch.of(self, []))

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
        ready = await self._wait_ready()
        head, taken = ready[0], self._taken
        self._advance(head, taken + 1)
        return head[taken]

    async def receive_many(self, max_count: int = 1000) -> list[Message]:
        """Wait for a message, then take every one already here (at most ``max_count``):
        one await for a whole frame of them."""
        return [m for batch in await self._take(max_count) for m in batch]

    async def receive_batch(self, max_count: int = 1000) -> MessageBatch:
        """:meth:`receive_many`'s messages as one :class:`MessageBatch`: columns, with no
        object made per message (a consumer that acknowledges whole batches, or reads
        only bodies, pays per frame, not per message)."""
        batches = await self._take(max_count)
        return batches[0] if len(batches) == 1 else MessageBatch.join(batches)

    async def _take(self, max_count: int) -> list[MessageBatch]:
        """What :meth:`receive_many` takes, as the batches (or their parts) it came in."""
        if max_count < 1:
            raise ConfigError("max_count must be at least 1")
        self._raise_failed()
        ready = await self._wait_ready()
        available = sum(map(len, ready)) - self._taken
        while available < max_count:  # frames already here, without waiting
            try:
                batch = self._frames.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel):
                break
            if batch:  # (an error's wake-up: raised by the next call)
                ready.append(batch)
                available += len(batch)
        taken: list[MessageBatch] = []
        count = 0
        while ready and count < max_count:
            head, start = ready[0], self._taken
            stop = min(len(head), start + max_count - count)
            taken.append(head if start == 0 and stop == len(head) else head[start:stop])
            count += stop - start
            self._advance(head, stop)
        return taken

    def _advance(self, head: MessageBatch, stop: int) -> None:
        """The first ``stop`` messages of ``head``, the first batch ready, handed out."""
        if stop >= len(head):
            self._ready.popleft()
            self._taken = 0
        else:
            self._taken = stop

    async def _wait_ready(self) -> deque[MessageBatch]:
        """The batches here, with a message at least, after a checkpoint (waiting for a
        frame when none is here)."""
        ready = self._ready
        if ready:
            await trio.lowlevel.checkpoint()
        while not ready:  # (another task may have taken them meanwhile)
            batch = await self._frames.receive()
            if batch:
                ready.append(batch)
            else:
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
        if type(offsets) is not range and offsets and type(
                first := pack_column(list(offsets), counting=True)) is int:
            offsets = range(first, first + len(offsets))  # consecutive: as a range
        if type(offsets) is range and offsets.step == 1 and held.take_run(offsets):
            # runs held as they came (a batch's offsets), each taken in one step
            if not offsets:
                return None
            return {"cmd": "ack", "topic": self.topic, "group": self.group,
                    "offsets": offsets.start, "count": len(offsets)}
        if held.take_each(offsets):  # single offsets, each once, all held: in C
            offsets = list(offsets)
        else:
            kept = []
            for offset in offsets:
                if held.discard(offset):
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
