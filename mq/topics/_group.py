"""A consume group's parts, sans-I/O: where a new group starts, its members, and the
messages in flight to them (:mod:`._topic` is the topic that moves them)."""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import attrgetter

from pump import ConfigError, RdvpumpError

from ..storage._record import Record
from ._filter import TagFilter
from ._turns import InTurn

#: Unacknowledged messages a consumer holds by default (zbus's consume window).
DEFAULT_WINDOW = 100

_offset = attrgetter("offset")


class UnknownGroupError(RdvpumpError, KeyError):
    """No such consume group on this topic."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class Start:
    """Where a new group starts: ``end`` (zbus's default: where the most advanced group
    reads, or the end if there is none), ``beginning``, ``offset:N``, ``time:MS`` (ms since
    the epoch; zbus left it a stub) or ``copy:GROUP`` (another group's position)."""

    kind: str = "end"
    value: int | str | None = None

    @classmethod
    def parse(cls, text: str | None) -> Start:
        if text is None or text in ("", "end"):
            return cls("end")
        if text == "beginning":
            return cls("beginning")
        kind, sep, value = text.partition(":")
        if sep and kind in ("offset", "time") and value.isdigit():
            return cls(kind, int(value))
        if sep and kind == "copy" and value:
            return cls(kind, value)
        raise ConfigError(f"start {text!r}: expected end, beginning, offset:N, time:MS or "
                         f"copy:GROUP")

    def __str__(self) -> str:
        return self.kind if self.value is None else f"{self.kind}:{self.value}"


class Delivery:
    """A message on its way to a consumer, and then in flight until acknowledged:
    ``deliveries`` counts this one; ``consumer`` holds it until ``deadline`` (the pump's
    clock).  One is made per delivery, so it is a plain slotted class; read-only by
    convention, like :class:`~mq.storage._record.Record`."""

    __slots__ = ("topic", "group", "record", "deliveries", "consumer", "deadline")

    def __init__(self, topic: str, group: str, record: Record, deliveries: int,
                 consumer: Member, deadline: float) -> None:
        self.topic = topic
        self.group = group
        self.record = record
        self.deliveries = deliveries
        self.consumer = consumer
        self.deadline = deadline

    def record_at(self, offset: int) -> Record:
        """The record delivered (as :meth:`Run.record_at`, for what holds either)."""
        return self.record

    def __repr__(self) -> str:
        return (f"<Delivery {self.topic}/{self.group} offset {self.record.offset} "
                f"#{self.deliveries} to {self.consumer.name}>")


class Run:
    """The first deliveries of a run of records (ascending offsets, read from the log in
    one piece) to one consumer at once: what a group of one consumer and no filter is
    handed (a cluster's relaying server, a lone consumer).  One object stands for the
    run's every delivery: in flight, each of its offsets maps to it, and the consumer's
    link frames it whole."""

    __slots__ = ("topic", "group", "records", "consumer", "deadline")

    #: every delivery of a run is a first one
    deliveries = 1

    def __init__(self, topic: str, group: str, records: list[Record], consumer: Member,
                 deadline: float) -> None:
        self.topic = topic
        self.group = group
        self.records = records
        self.consumer = consumer
        self.deadline = deadline

    def record_at(self, offset: int) -> Record:
        """The run's record at ``offset`` (one of its offsets)."""
        records = self.records
        i = offset - records[0].offset
        if 0 <= i < len(records) and records[i].offset == offset:
            return records[i]
        return records[bisect_left(records, offset, key=_offset)]

    def __repr__(self) -> str:
        return (f"<Run {self.topic}/{self.group} offsets {self.records[0].offset}-"
                f"{self.records[-1].offset} to {self.consumer.name}>")


class Member:
    """One member of a consume group (a consumer, server side): ``deliver(delivery)`` is
    called for each message it gets; for a run of first deliveries in order (a consumer
    that has the group's messages to itself), ``deliver_run(run)`` when given, with the
    :class:`Run`, else ``deliver_many(deliveries)`` when given."""

    def __init__(self, name: str, group: str, deliver: Callable[[Delivery], object], *,
                 window: int = DEFAULT_WINDOW,
                 deliver_many: Callable[[list[Delivery]], object] | None = None,
                 deliver_run: Callable[[Run], object] | None = None) -> None:
        if window < 1:
            raise ConfigError(f"window must be at least 1, got {window}")
        self.name = name
        self.group = group
        self.window = window
        self.deliver = deliver
        self.deliver_many = deliver_many
        self.deliver_run = deliver_run
        #: A lone consumer behind is handed messages only once this many credits (or
        #: all there is for it) are free: runs of that many, not one per ack.
        self.min_room = 1
        #: In a group of several, the run it is handed before the next consumer's turn
        #: (more when a batch is larger than the consumers' even shares, fewer when its
        #: credits end first): an eighth of its window, so that frames stay full when
        #: consumers outnumber a batch's messages, and one at a time below a window of 16.
        self.run = max(1, window // 8)
        #: offsets delivered and not acknowledged
        self.in_flight: set[int] = set()

    @property
    def credits(self) -> int:
        return self.window - len(self.in_flight)

    def __repr__(self) -> str:
        return f"<Member {self.name} of {self.group} {len(self.in_flight)}/{self.window}>"


@dataclass
class Group(InTurn["Member"]):
    """A consume group of a topic: where it reads, what it holds, its consumers."""

    name: str
    filter: TagFilter | None
    next_read: int
    #: offset -> its delivery (a :class:`Run` for each offset of one)
    in_flight: dict[int, Delivery | Run] = field(default_factory=dict)
    #: (record, deliveries so far) waiting for a consumer with credits
    redeliver: deque[tuple[Record, int]] = field(default_factory=deque)
    consumers: list[Member] = field(default_factory=list)
    #: where the round robin of consumers starts next
    turn: int = 0
    #: the floor changed since it was last saved
    dirty: bool = True
    dead_letters: int = 0

    @property
    def floor(self) -> int:
        """Every offset below it is handled (acknowledged, dead-lettered or filtered out)."""
        low = self.next_read
        if self.in_flight:
            low = min(low, min(self.in_flight))
        if self.redeliver:
            low = min(low, min(r.offset for r, _ in self.redeliver))
        return low
