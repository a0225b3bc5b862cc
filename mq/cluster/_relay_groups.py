"""The consume groups a cluster's server serves from its root (:mod:`._relay`): the
messages the root delivered, the consumers here, and the frames between them.

A frame from the root that a group here takes whole (nothing of the group waiting, and
a consumer with credits for all of it) goes on to that consumer as it came, renamed for
the group (:class:`RelayedFrame`): its columns and bodies are not taken apart, and
the consumer holds each of its offsets through the one frame.  Otherwise it waits
whole, and a consumer with room for less of it is passed a part of it
(:meth:`RelayedFrame.part`, its columns and bodies cut where the part ends).  Only what
a consumer that left held is taken apart into messages (:class:`Relayed`), delivered
again in frames made here.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any

from brokermgr import Template
from channels import Gather

from ..topics._delivery import ClientLink, messages_frame
from ..topics._held import Held
from ..topics._stretch import extends
from ..topics._turns import InTurn
from ..topics._wire import check_column, pack_column, unpack_column, unpack_offsets, unpack_sizes

__all__ = ["LocalConsumer", "RelayGroup", "Relayed", "RelayedFrame", "relayed_messages"]


@dataclass(slots=True)
class Relayed:
    """A message the root delivered to this server for one of its consumers.  Never
    changed once made: the groups of one frame share it."""

    offset: int
    tag: str | None
    producer: str
    sequence: int
    deliveries: int
    timestamp: int
    body: bytes


_COLUMNS = ("offsets", "sizes", "tags", "producers", "sequences", "deliveries", "timestamps")


class RelayedFrame:
    """A ``messages`` frame from the root, checked (:meth:`check`) and kept as it came:
    passed on whole to a consumer here (:meth:`forward`), and taken apart only for what
    goes elsewhere (:meth:`message_at`).  Never changed once made: the groups of the
    frame share it."""

    __slots__ = ("obj", "topic", "count", "offsets", "_messages", "_head", "_columns")

    def __init__(self, obj: dict[str, Any], topic: str, count: int,
                 offsets: range | list[int]) -> None:
        self.obj = obj
        self.topic = topic
        self.count = count
        self.offsets = offsets
        self._messages: dict[int, Relayed] | None = None
        self._head: Template | None = None  # the header but its group, encoded once
        self._columns: dict[str, list[Any]] | None = None  # unpacked, for its parts

    @classmethod
    def check(cls, obj: dict[str, Any]) -> RelayedFrame:
        """The frame ``obj`` (a decoded ``messages`` frame); ValueError (or KeyError,
        TypeError) if it is not one: a count, columns of that many values, sizes adding
        up to the body."""
        count = obj["count"]
        if type(count) is not int or count < 1:
            raise ValueError(f"count {count!r}")
        offsets = unpack_offsets(obj["offsets"], count)
        unpack_sizes(obj["sizes"], count, obj.get("body", b""))
        for name in _COLUMNS[2:]:
            check_column(obj[name], count, counting=name == "sequences")
        return cls(obj, obj["topic"], count, offsets)

    def forward(self, group: str) -> bytes | Gather:
        """The frame for a consumer of ``group`` here: the root's columns and bodies."""
        obj = self.obj
        head = self._head
        if head is None:  # the columns are encoded once for all the frame's groups
            header = {name: obj[name] for name in _COLUMNS}
            header.update(cmd="messages", topic=self.topic, count=self.count)
            head = self._head = Template(header, "group")
        return head.encode(group, obj.get("body", b""))

    @property
    def size(self) -> int:
        """Bytes of the frame's bodies."""
        return len(self.obj.get("body", b""))

    def extends(self) -> bool:
        """Whether the frame may extend a stretch of what the root sent (see
        :mod:`mq.topics._stretch`)."""
        return extends(self.obj)

    def part(self, start: int, count: int) -> RelayedFrame:
        """The frame's ``count`` messages from its ``start``-th, as a frame of their own
        (the frame itself when that is all of it)."""
        if start == 0 and count == self.count:
            return self
        columns = self._columns
        if columns is None:
            obj, n = self.obj, self.count
            columns = self._columns = {name: unpack_column(
                obj[name], n, counting=name in ("offsets", "sequences")) for name in _COLUMNS}
            columns["ends"] = list(accumulate(columns["sizes"]))
        ends = columns["ends"]
        stop = start + count
        low = ends[start - 1] if start else 0
        obj = {name: pack_column(columns[name][start:stop],
                                 counting=name in ("offsets", "sequences"))
               for name in _COLUMNS}
        obj.update(topic=self.topic, count=count,
                   body=memoryview(self.obj.get("body", b""))[low:ends[stop - 1]])
        return RelayedFrame(obj, self.topic, count,
                            self.offsets[start:stop])

    def message_at(self, offset: int) -> Relayed:
        """The frame's message at ``offset`` (one of its offsets)."""
        if self._messages is None:
            self._messages = {m.offset: m for m in relayed_messages(self.obj)}
        return self._messages[offset]


@dataclass(eq=False)
class LocalConsumer:
    """A client link here consuming a shared topic's group through the root."""

    link: ClientLink
    window: int
    #: offset -> the message held (or the whole frame it came in, passed on as it was:
    #: its offsets one range when consecutive)
    held: Held[Relayed | RelayedFrame] = field(default_factory=Held)
    #: Offsets held when the root's link was lost: their acks are not passed on (the
    #: root delivers them again).
    stale: set[int] = field(default_factory=set)

    @property
    def credits(self) -> int:
        return self.window - len(self.held)


@dataclass(eq=False)
class RelayGroup(InTurn[LocalConsumer]):
    """One consume group of a shared topic, as this server serves it from the root."""

    topic: str
    group: str
    consumers: list[LocalConsumer] = field(default_factory=list)
    #: What the root sent waiting for a consumer with credits: its frames kept whole (a
    #: consumer is passed one, or a part of one, as it came), and messages taken apart
    #: (a leaving consumer's, to deliver again).
    pending: deque[Relayed | RelayedFrame] = field(default_factory=deque)
    #: The root answered this server's consume on the current link.
    subscribed: bool = False
    turn: int = 0

    def frame(self, messages: list[Relayed]) -> bytes | Gather:
        """A ``messages`` frame of ``messages`` for a consumer here, as the root's are
        made."""
        return messages_frame(self.topic, self.group, messages,
                              [m.deliveries for m in messages])


def relayed_messages(obj: dict[str, Any]) -> list[Relayed]:
    """The messages of a ``messages`` frame from the root; ValueError (or KeyError,
    TypeError) if it is not one."""
    count = obj["count"]
    if type(count) is not int or count < 1:
        raise ValueError(f"count {count!r}")
    offsets = unpack_column(obj["offsets"], count, counting=True)
    sizes = unpack_column(obj["sizes"], count)
    tags = unpack_column(obj["tags"], count)
    producers = unpack_column(obj["producers"], count)
    sequences = unpack_column(obj["sequences"], count, counting=True)
    deliveries = unpack_column(obj["deliveries"], count)
    timestamps = unpack_column(obj["timestamps"], count)
    body = bytes(obj.get("body", b""))
    if sum(sizes) != len(body):
        raise ValueError(f"sizes add up to {sum(sizes)}, the body has {len(body)} bytes")
    messages = []
    start = 0
    for i in range(count):
        end = start + sizes[i]
        messages.append(Relayed(offsets[i], tags[i], producers[i], sequences[i],
                                deliveries[i], timestamps[i], body[start:end]))
        start = end
    return messages


def take_frame(pending: deque[Relayed | RelayedFrame], credits: int, frame_bytes: int,
               tail: int = 0) -> list[Relayed]:
    """The next frame for a consumer with ``credits`` (at least 1) out of the messages at
    the head of ``pending`` (one at least; up to a frame kept whole), taken from it: as
    many messages as the credits allow, ending with the one whose body brings the
    frame's bodies to ``frame_bytes`` or past; and then what is left too, if the credits
    take it all, it is messages only and its bodies are under ``tail`` bytes (no frame
    of a few messages behind a full one)."""
    frame: list[Relayed] = []
    size = 0
    while pending and len(frame) < credits and size < frame_bytes:
        message = pending[0]
        if type(message) is not Relayed:
            break
        pending.popleft()
        frame.append(message)
        size += len(message.body)
    if tail > 0 and pending and size >= frame_bytes and len(pending) <= credits - len(frame):
        rest = 0
        for message in pending:  # at most the credits left of them
            if type(message) is not Relayed:
                break
            rest += len(message.body)
            if rest >= tail:
                break
        else:
            frame += pending  # type: ignore[arg-type]  # (Relayed, each: checked above)
            pending.clear()
    return frame
