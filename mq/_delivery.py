"""An MQ server's client links and what it sends them: deliveries as ``messages``
frames, replies, RPC replies and pushes, each kept in order while a link's queue is full.

A dispatch appends each delivery to its consumer's link (``ClientLink.batch``); the
server then flushes each link's batch as one ``messages`` frame per topic and group:
the records' fields as columns (:mod:`._wire`), their bodies back to back.  A link that
asked for shared frames (a cluster's server relaying several groups of a topic) gets one
frame for the groups handed the same messages, naming them all.  A frame
ends once it holds :data:`FRAME_BYTES` of bodies, so that a wide window behind a deep
backlog never makes a frame larger than a link carries.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import groupby
from operator import attrgetter, itemgetter
from typing import Any, Protocol

from brokermgr import Sent, encode, send
from channels import DEFAULT_RING_CAPACITY, Gather, MessageQueue

from ._topic import Delivery, Member
from ._wire import pack_column

__all__ = ["FRAME_BYTES", "FRAME_ROOM", "ClientLink", "Links", "messages_frame"]

#: Bytes of bodies after which a ``messages`` frame ends (the message that passes it is
#: the last): frames that fit a link's ring are taken out of it whole, larger ones are
#: put together piece by piece, which costs more (``bench mq`` at 64 KiB shows it).
FRAME_BYTES = DEFAULT_RING_CAPACITY * 3 // 4
#: Bytes of a link's largest frame kept for a delivery's header: a message's body is at
#: most the link's maximum message size less this.
FRAME_ROOM = 64 << 10


_topic_group = attrgetter("topic", "group")
_offset = attrgetter("record.offset")
_count = attrgetter("deliveries")
_first = itemgetter(0)
_second = itemgetter(1)


@dataclass
class ClientLink:
    """One link's consumers and the messages its queue did not take yet."""

    queue: MessageQueue
    #: what RPC replies are routed by (a request on an ``rpc`` topic carries it)
    caller_id: str = ""
    #: receiver names this link answers to (``receive``)
    names: set[str] = field(default_factory=set)
    consumers: dict[tuple[str, str], Member] = field(default_factory=dict)
    outbox: deque[bytes | Gather] = field(default_factory=deque)
    #: deliveries of the dispatch under way, sent as one ``messages`` frame each
    batch: list[Delivery] = field(default_factory=list)
    #: the link takes one frame for several groups of a topic (a cluster's server that
    #: relays them): groups handed the same messages in one dispatch share a frame
    shared_frames: bool = False

    def send(self, message: bytes | Gather) -> None:
        """Send, or keep for when the queue drains (bounded: credits bound deliveries,
        and a request gets one reply)."""
        if self.outbox:
            self.outbox.append(message)
            return
        if send(self.queue, message, what=self._what()) is Sent.FULL:
            self.outbox.append(message)

    def drained(self) -> None:
        """The queue has room again: what it kept goes, in order, while it fits."""
        while self.outbox:
            if send(self.queue, self.outbox[0], what=self._what()) is not Sent.SENT:
                return
            self.outbox.popleft()

    def flush(self) -> None:
        """The deliveries of one dispatch to this link, one ``messages`` frame (or more,
        past :data:`FRAME_BYTES`) per topic and group."""
        batch = self.batch[:]
        self.batch.clear()
        keys = list(map(_topic_group, batch))
        first = keys[0]
        if keys.count(first) == len(keys):
            self._send_messages(first[0], [first[1]], batch)
            return
        by_group: dict[tuple[str, str], list[Delivery]] = {}
        # runs of one topic and group, each kept in order
        for key, run in groupby(zip(keys, batch, strict=True), _first):
            by_group.setdefault(key, []).extend(map(_second, run))
        if self.shared_frames:
            self._send_shared(by_group)
            return
        for (topic, group), deliveries in by_group.items():
            self._send_messages(topic, [group], deliveries)

    def _send_shared(self, by_group: dict[tuple[str, str], list[Delivery]]) -> None:
        """One frame for the groups of a topic that were handed the same messages (the
        same offsets, each delivered as many times): a cluster's root sends a message
        once to a server for all the groups the server relays."""
        alike: dict[tuple[str, tuple[int, ...], tuple[int, ...]],
                    tuple[list[str], list[Delivery]]] = {}
        for (topic, group), deliveries in by_group.items():
            key = (topic, tuple(map(_offset, deliveries)), tuple(map(_count, deliveries)))
            alike.setdefault(key, ([], deliveries))[0].append(group)
        for (topic, _, _), (groups, deliveries) in alike.items():
            self._send_messages(topic, groups, deliveries)

    def _send_messages(self, topic: str, groups: list[str], deliveries: list[Delivery]
                       ) -> None:
        start = size = 0
        for i, delivery in enumerate(deliveries):
            size += len(delivery.record.body)
            if size >= FRAME_BYTES:
                self._send_frame(topic, groups, deliveries[start:i + 1])
                start, size = i + 1, 0
        if start < len(deliveries):
            self._send_frame(topic, groups, deliveries[start:])

    def _send_frame(self, topic: str, groups: list[str], deliveries: list[Delivery]
                    ) -> None:
        self.send(messages_frame(topic, groups[0], [d.record for d in deliveries],
                                 [d.deliveries for d in deliveries],
                                 groups if len(groups) > 1 else None))

    def _what(self) -> str:
        return f"mq client {self.queue.remote_id}"


class _Stored(Protocol):
    """What a ``messages`` frame carries of a message (a :class:`~._record.Record`, or
    a message a cluster's server relays)."""

    offset: int
    tag: str | None
    producer: str
    sequence: int
    timestamp: int

    @property
    def body(self) -> bytes | memoryview: ...


def messages_frame(topic: str, group: str, records: Sequence[_Stored],
                   deliveries: list[int], groups: list[str] | None = None
                   ) -> bytes | Gather:
    """One ``messages`` frame: the records' fields as columns (:mod:`._wire`), each one's
    count of ``deliveries``, their bodies back to back; ``groups``, when the frame serves
    several groups at once (``group`` is the first of them)."""
    header: dict[str, Any] = {
        "cmd": "messages", "topic": topic, "group": group, "count": len(records),
        "offsets": pack_column([r.offset for r in records], counting=True),
        "sizes": pack_column([len(r.body) for r in records]),
        "tags": pack_column([r.tag for r in records]),
        "producers": pack_column([r.producer for r in records]),
        "sequences": pack_column([r.sequence for r in records], counting=True),
        "deliveries": pack_column(deliveries),
        "timestamps": pack_column([r.timestamp for r in records])}
    if groups is not None:
        header["groups"] = groups
    return encode(header, [r.body for r in records])


class Links:
    """A server's client links, by queue, by caller id (RPC replies are routed by it)
    and by receiver name (pushes go to every link answering to one)."""

    def __init__(self) -> None:
        self.by_queue: dict[MessageQueue, ClientLink] = {}
        self.by_caller: dict[str, ClientLink] = {}
        self.receivers: dict[str, list[ClientLink]] = {}
        self._count = 0

    def __iter__(self) -> Iterator[ClientLink]:
        return iter(self.by_queue.values())

    def get(self, queue: MessageQueue) -> ClientLink | None:
        return self.by_queue.get(queue)

    def of(self, queue: MessageQueue) -> ClientLink:
        """The link of ``queue``, made on its first request."""
        link = self.by_queue.get(queue)
        if link is None:
            self._count += 1
            link = self.by_queue[queue] = ClientLink(queue, f"{queue.remote_id}#{self._count}")
            self.by_caller[link.caller_id] = link
        return link

    def answer_to(self, link: ClientLink, name: str) -> None:
        """``link`` answers to receiver ``name`` from now on."""
        if name not in link.names:
            link.names.add(name)
            self.receivers.setdefault(name, []).append(link)

    def drop(self, queue: MessageQueue) -> ClientLink | None:
        """The link of a closed queue, no longer routed to (its consumers are the
        caller's to detach)."""
        link = self.by_queue.pop(queue, None)
        if link is None:
            return None
        self.by_caller.pop(link.caller_id, None)
        for name in link.names:
            held = self.receivers.get(name, [])
            if link in held:
                held.remove(link)
            if not held:
                self.receivers.pop(name, None)
        return link

    def flush(self) -> None:
        """Send every link's batch of deliveries."""
        for link in self.by_queue.values():
            if link.batch:
                link.flush()

    def clear_batches(self) -> None:
        """A dispatch failed: what it batched is not sent (it is in flight already, and
        redelivered after the ack timeout)."""
        for link in self.by_queue.values():
            link.batch.clear()
