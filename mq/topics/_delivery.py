"""An MQ server's client links and what it sends them: deliveries as ``messages``
frames, replies, RPC replies and pushes, each kept in order while a link's queue is full.

A dispatch appends each delivery to its consumer's link (``ClientLink.batch``), or a
lone consumer's whole run of them (a :class:`~._topic.Run`); the
server then flushes each link's batch as one ``messages`` frame per topic and group:
the records' fields as columns (:mod:`._wire`), their bodies back to back.  A link that
asked for shared frames (a cluster's server relaying several groups of a topic) gets one
frame for the groups handed the same messages, naming them all.  A frame
ends once it holds :data:`FRAME_BYTES` of bodies (with a run's small rest, under
:data:`FRAME_TAIL`, taken along), or, of large messages, once it holds
:data:`FRAME_MESSAGES` of them or as many as the link's other end takes whole, so that a
wide window behind a deep backlog never makes a frame larger than a link carries, and a
frame's own cost (its header, its acknowledgement) is not paid for every few messages.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any, Protocol

from brokermgr import Sent, encode, send
from channels import DEFAULT_RING_CAPACITY, Gather, MessageQueue, coalesce

from ..storage._record import Record
from ._group import Delivery, Member, Run
from ._stretch import Stretches, extends
from ._wire import pack_column

__all__ = ["FRAME_BYTES", "FRAME_ROOM", "FRAME_TAIL", "ClientLink", "Links", "messages_frame"]

#: Bytes of bodies after which a ``messages`` frame ends (the message that passes it is
#: the last): frames that fit a link's ring are taken out of it whole, larger ones are
#: put together piece by piece, which costs more (``bench mq`` at 64 KiB shows it).
FRAME_BYTES = DEFAULT_RING_CAPACITY * 3 // 4
#: What is left after a full frame (of a run at the root; of what waits for a consumer
#: at a relaying server), when its bodies are fewer bytes than this, goes in that frame,
#: not in one of its own: a frame may pass FRAME_BYTES by this much rather
#: than leave behind it a frame of a few messages, which costs each hop as much as a
#: full one (two batches of 100 messages of 1,000 bytes dispatched together go as one
#: frame of 200, not 196 and 4).
FRAME_TAIL = FRAME_BYTES // 8
#: Messages a frame of large ones holds, past FRAME_BYTES, as far as the link's other end
#: takes a frame whole (3/4 of :attr:`~channels.MessageQueue.whole_frame_bytes`: a
#: frame of 64 KiB messages over a socket holds 12 of them, not 3).  Each frame costs its
#: header, a consumer's acknowledgement and the work at every hop whatever it holds:
#: ``bench mq`` at 64 KiB `sync` stores and delivers 6-15 % more with 12 a frame, at about
#: 6 % less CPU a message.
FRAME_MESSAGES = 16
#: Bytes of a link's largest frame kept for a delivery's header: a message's body is at
#: most the link's maximum message size less this.
FRAME_ROOM = 64 << 10


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
    #: deliveries of the dispatch under way (one by one, or runs), sent as one
    #: ``messages`` frame per topic and group
    batch: list[Delivery | Run] = field(default_factory=list)
    #: the link takes one frame for several groups of a topic (a cluster's server that
    #: relays them): groups handed the same messages in one dispatch share a frame
    shared_frames: bool = False
    #: a shared-frames link that takes a run it was sent before by name (``cached``,
    #: :mod:`._stretch`; a relaying server asks so, one of an older release does not)
    named_runs: bool = False
    #: such a link's last stretch of each topic's bodies sent (offsets only)
    sent: Stretches[None] = field(default_factory=Stretches)
    #: bytes of bodies a frame of large messages may reach (see :data:`FRAME_MESSAGES`):
    #: 3/4 of the longest frame the link's other end takes whole
    frame_reach: int = FRAME_BYTES

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

    def flush(self, frames: dict[Any, list[_Part]] | None = None) -> None:
        """The deliveries of one dispatch to this link, one ``messages`` frame (or more,
        past :data:`FRAME_BYTES`) per topic and group.  ``frames`` keeps the frames'
        columns and bodies by their content, for the other links of the same dispatch
        (a cluster's root sends the same messages to each of its relaying servers)."""
        batch = self.batch[:]
        self.batch.clear()
        by_group: dict[tuple[str, str], list[Delivery | Run]] = {}
        for piece in batch:  # each group's pieces kept in order
            key = (piece.topic, piece.group)
            pieces = by_group.get(key)
            if pieces is None:
                by_group[key] = [piece]
            else:
                pieces.append(piece)
        if frames is None:
            frames = {}
        if not self.shared_frames:
            for (topic, group), pieces in by_group.items():
                self._send_parts(topic, [group], _parts(topic, pieces, frames, self.frame_reach))
            return
        if len(by_group) == 1:
            ((topic, group), pieces), = by_group.items()
            self._send_shared(topic, [group], pieces, frames)
            return
        # the groups of a topic handed the same messages (the same offsets, each
        # delivered as many times) share a frame: a cluster's root sends a message once
        # to a server for all the groups the server relays
        alike: dict[Any, tuple[str, list[str], list[Delivery | Run]]] = {}
        for (topic, group), pieces in by_group.items():
            alike.setdefault(_content_key(topic, pieces), (topic, [], pieces))[1].append(group)
        for topic, groups, pieces in alike.values():
            self._send_shared(topic, groups, pieces, frames)

    def _send_parts(self, topic: str, groups: list[str], parts: list[_Part]) -> None:
        for columns, bodies in parts:
            header = {"cmd": "messages", "topic": topic, "group": groups[0], **columns}
            if len(groups) > 1:
                header["groups"] = groups
            self.send(encode(header, bodies))

    def _send_shared(self, topic: str, groups: list[str], pieces: list[Delivery | Run],
                     frames: dict[Any, list[_Part]]) -> None:
        """``pieces`` for ``groups`` on a shared-frames link: what of a lone run the link
        was sent before by name (``cached``), the rest with its bodies, each frame that
        :func:`~._stretch.extends` the topic's stretch noted in it."""
        if not self.named_runs:
            self._send_parts(topic, groups, _parts(topic, pieces, frames, self.frame_reach))
            return
        sent = self.sent
        if len(pieces) == 1 and type(run := pieces[0]) is Run:
            records = run.records
            first = records[0].offset
            held = sent.held(topic, first, len(records))
            if held and records[held - 1].offset == first + held - 1:
                header: dict[str, Any] = {"cmd": "messages", "topic": topic,
                                          "group": groups[0], "count": held,
                                          "offsets": first, "cached": True}
                if len(groups) > 1:
                    header["groups"] = groups
                self.send(encode(header))
                if held == len(records):
                    return
                pieces = [Run(topic, run.group, records[held:], run.consumer, run.deadline)]
        parts = _parts(topic, pieces, frames, self.frame_reach)
        for columns, bodies in parts:
            if extends(columns):
                sent.add(topic, columns["offsets"], columns["count"], sum(map(len, bodies)),
                         None)
        self._send_parts(topic, groups, parts)

    def _what(self) -> str:
        return f"mq client {self.queue.remote_id}"


class _Stored(Protocol):
    """What a ``messages`` frame carries of a message (a :class:`~mq.storage._record.Record`, or
    a message a cluster's server relays)."""

    offset: int
    tag: str | None
    producer: str
    sequence: int
    timestamp: int

    @property
    def body(self) -> bytes | memoryview: ...


#: A ``messages`` frame's columns (and count) and its bodies, for any group.
_Part = tuple[dict[str, Any], list[Any]]


def messages_frame(topic: str, group: str, records: Sequence[_Stored],
                   deliveries: list[int], groups: list[str] | None = None
                   ) -> bytes | Gather:
    """One ``messages`` frame: the records' fields as columns (:mod:`._wire`), each one's
    count of ``deliveries``, their bodies back to back; ``groups``, when the frame serves
    several groups at once (``group`` is the first of them)."""
    header: dict[str, Any] = {"cmd": "messages", "topic": topic, "group": group,
                              **_columns(records, [len(r.body) for r in records],
                                         deliveries)}
    if groups is not None:
        header["groups"] = groups
    return encode(header, [r.body for r in records])


def _columns(records: Sequence[_Stored], sizes: list[int], deliveries: list[int] | None
             ) -> dict[str, Any]:
    """The columns of a frame of ``records`` (``deliveries`` None: each a first one)."""
    return {"count": len(records),
            "offsets": pack_column([r.offset for r in records], counting=True),
            "sizes": pack_column(sizes),
            "tags": pack_column([r.tag for r in records]),
            "producers": pack_column([r.producer for r in records]),
            "sequences": pack_column([r.sequence for r in records], counting=True),
            "deliveries": 1 if deliveries is None else pack_column(deliveries),
            "timestamps": pack_column([r.timestamp for r in records])}


def _content_key(topic: str, pieces: list[Delivery | Run]) -> Any:
    """What tells the messages of a group's ``pieces`` from others': a lone run by its
    first and last offsets and length (a run is read from the log in one piece, so two
    runs alike in those hold the same records), else every offset and delivery count."""
    if len(pieces) == 1 and type(run := pieces[0]) is Run:
        records = run.records
        return topic, records[0].offset, records[-1].offset, len(records)
    return (topic, tuple(offset for p in pieces for offset in _offsets(p)),
            tuple(n for p in pieces for n in _counts(p)))


def _offsets(piece: Delivery | Run) -> list[int]:
    if type(piece) is Run:
        return [r.offset for r in piece.records]
    assert type(piece) is Delivery
    return [piece.record.offset]


def _counts(piece: Delivery | Run) -> list[int]:
    return [1] * len(piece.records) if type(piece) is Run else [piece.deliveries]


def _parts(topic: str, pieces: list[Delivery | Run], frames: dict[Any, list[_Part]],
           most: int) -> list[_Part]:
    """The frames of a group's ``pieces``: one per :data:`FRAME_BYTES` of bodies (the
    message that passes it is the last of its frame, or the last of all when what
    follows is under :data:`FRAME_TAIL`), or of large messages up to
    :data:`FRAME_MESSAGES` of them within ``most`` bytes; those of a lone run made once
    (kept in ``frames``) for every link of a dispatch it goes to."""
    deliveries: list[int] | None
    if len(pieces) == 1 and type(run := pieces[0]) is Run:
        records: list[Record] = run.records
        deliveries = None
        key = _content_key(topic, pieces), most
        made = frames.get(key)
        if made is not None:
            return made
        made = frames[key] = []
    else:
        made = []
        records, deliveries = [], []
        for piece in pieces:
            if type(piece) is Run:
                records += piece.records
                deliveries += [1] * len(piece.records)
            else:
                assert type(piece) is Delivery
                records.append(piece.record)
                deliveries.append(piece.deliveries)
    sizes = [len(r.body) for r in records]
    bodies = [r.body for r in records]
    start = 0
    ends = list(accumulate(sizes))
    while start < len(records):
        # the frame ends with the message whose body brings it to FRAME_BYTES or past
        base = ends[start - 1] if start else 0
        end = min(bisect_left(ends, base + FRAME_BYTES, lo=start) + 1, len(records))
        if end - start < FRAME_MESSAGES:  # large messages: more of them, within ``most``
            end = max(end, min(start + FRAME_MESSAGES,
                               bisect_right(ends, base + most, lo=start)))
        if ends[-1] - ends[end - 1] < FRAME_TAIL:
            end = len(records)  # a small rest: in this frame (see FRAME_TAIL)
        # small bodies joined here, once for every link the frame goes to
        made.append((_columns(records[start:end], sizes[start:end],
                              None if deliveries is None else deliveries[start:end]),
                     coalesce(bodies[start:end])))
        start = end
    return made


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
            link = self.by_queue[queue] = ClientLink(
                queue, f"{queue.remote_id}#{self._count}",
                frame_reach=queue.whole_frame_bytes * 3 // 4)
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
        """Send every link's batch of deliveries (a frame's columns made once for all the
        links it goes to)."""
        frames: dict[Any, list[_Part]] = {}
        for link in self.by_queue.values():
            if link.batch:
                link.flush(frames)

    def clear_batches(self) -> None:
        """A dispatch failed: what it batched is not sent (it is in flight already, and
        redelivered after the ack timeout)."""
        for link in self.by_queue.values():
            link.batch.clear()
