"""A consume group's parts, sans-I/O: where a new group starts, its members, and the
messages in flight to them (:mod:`._topic` is the topic that moves them)."""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections import deque
from collections.abc import Callable, Iterable, Sequence
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
    run's every delivery, and the consumer's link frames it whole.  In flight it is kept
    whole (:attr:`Group.runs`, by its first offset: one entry, however long); an ack of a
    range of it leaves its part before and its part after whole too (each a run of the
    same records: ``offsets`` says which are its own).  Once something takes one of its
    offsets alone (an ack that lists offsets, its ack timeout, a cut, its consumer
    leaving), each of its offsets left maps to it (:attr:`Group.pending`)."""

    __slots__ = ("topic", "group", "records", "consumer", "deadline", "offsets")

    #: every delivery of a run is a first one
    deliveries = 1

    def __init__(self, topic: str, group: str, records: list[Record], consumer: Member,
                 deadline: float, offsets: range | list[int] | None = None) -> None:
        self.topic = topic
        self.group = group
        self.records = records
        self.consumer = consumer
        self.deadline = deadline
        if offsets is None:
            first, last = records[0].offset, records[-1].offset
            offsets = (range(first, last + 1) if last - first + 1 == len(records)
                       else [record.offset for record in records])
        #: its offsets, ascending (a range when they follow each other): its records',
        #: or some of them (a part of a run, its other offsets acknowledged)
        self.offsets = offsets

    def record_at(self, offset: int) -> Record:
        """The record at ``offset`` (one of its offsets)."""
        records = self.records
        i = offset - records[0].offset
        if 0 <= i < len(records) and records[i].offset == offset:
            return records[i]
        return records[bisect_left(records, offset, key=_offset)]

    def __repr__(self) -> str:
        return (f"<Run {self.topic}/{self.group} offsets {self.offsets[0]}-"
                f"{self.offsets[-1]} to {self.consumer.name}>")


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
        #: offsets delivered and not acknowledged, held one by one
        self.pending: set[int] = set()
        #: the same, held in whole runs (:class:`Run`), by their first offsets, and how
        #: many offsets those are
        self.runs: dict[int, Run] = {}
        self.in_runs = 0

    @property
    def credits(self) -> int:
        return self.window - len(self.pending) - self.in_runs

    @property
    def in_flight(self) -> set[int]:
        """Every offset delivered and not acknowledged (made for the asking: to inspect,
        not on a hot path)."""
        held = set(self.pending)
        for run in self.runs.values():
            held.update(run.offsets)
        return held

    def __repr__(self) -> str:
        return (f"<Member {self.name} of {self.group} "
                f"{len(self.pending) + self.in_runs}/{self.window}>")


@dataclass
class Group(InTurn["Member"]):
    """A consume group of a topic: where it reads, what it holds, its consumers."""

    name: str
    filter: TagFilter | None
    next_read: int
    #: offsets in flight held one by one -> their delivery (a :class:`Run` for each offset
    #: left of one taken apart)
    pending: dict[int, Delivery | Run] = field(default_factory=dict)
    #: runs in flight whole, by their first offsets, none of whose offsets is in
    #: :attr:`pending`; and how many offsets those are
    runs: dict[int, Run] = field(default_factory=dict)
    #: the runs' first offsets, ascending
    starts: list[int] = field(default_factory=list)
    in_runs: int = 0
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
        if self.pending:
            low = min(low, min(self.pending))
        if self.starts:
            low = min(low, self.starts[0])
        if self.redeliver:
            low = min(low, min(r.offset for r, _ in self.redeliver))
        return low

    @property
    def in_flight(self) -> dict[int, Delivery | Run]:
        """Every offset in flight -> its delivery (made for the asking: to inspect, not
        on a hot path; :attr:`in_flight_count` counts them)."""
        held: dict[int, Delivery | Run] = {}
        for run in self.runs.values():
            held.update(dict.fromkeys(run.offsets, run))
        held.update(self.pending)
        return held

    @property
    def in_flight_count(self) -> int:
        return len(self.pending) + self.in_runs

    def unhandled(self) -> set[int]:
        """The offsets below :attr:`next_read` not handled yet: in flight, or waiting to
        be delivered again (made for the asking, not on a hot path)."""
        held = set(self.in_flight)
        held.update(r.offset for r, _ in self.redeliver)
        return held

    def add_run(self, run: Run) -> None:
        """``run`` goes out whole to its consumer."""
        first, count = run.offsets[0], len(run.offsets)
        self.runs[first] = run
        starts = self.starts
        if not starts or first > starts[-1]:
            starts.append(first)  # (runs go out in offset order)
        else:
            insort(starts, first)
        self.in_runs += count
        consumer = run.consumer
        consumer.runs[first] = run
        consumer.in_runs += count

    def drop_run(self, run: Run) -> None:
        """``run``, whole, is no longer in flight (acknowledged, or taken apart)."""
        first, count = run.offsets[0], len(run.offsets)
        del self.runs[first]
        starts = self.starts
        del starts[bisect_left(starts, first)]
        self.in_runs -= count
        consumer = run.consumer
        del consumer.runs[first]
        consumer.in_runs -= count

    def spread(self, run: Run) -> None:
        """Take ``run`` apart: each of its offsets held one by one (still mapped to it)."""
        self.drop_run(run)
        self.pending.update(dict.fromkeys(run.offsets, run))
        run.consumer.pending.update(run.offsets)

    def spread_all(self, runs: Iterable[Run] | None = None) -> None:
        """Take ``runs`` apart (default: every one)."""
        for run in list(self.runs.values() if runs is None else runs):
            self.spread(run)

    def overlapping(self, start: int, stop: int) -> list[Run]:
        """The runs that hold offsets from ``start`` to before ``stop``, in offset order."""
        starts, runs = self.starts, self.runs
        i = bisect_right(starts, start) - 1
        if i < 0 or runs[starts[i]].offsets[-1] < start:
            i += 1
        out = []
        while i < len(starts) and starts[i] < stop:
            out.append(runs[starts[i]])
            i += 1
        return out

    def spread_touched(self, offsets: Sequence[int]) -> None:
        """Take apart the runs that hold any of ``offsets`` (ascending or not): an ack of
        part of a run, say."""
        if not self.runs or not offsets:
            return
        if type(offsets) is range and offsets.step == 1:
            self.spread_all(self.overlapping(offsets.start, offsets.stop))
            return
        starts, runs = self.starts, self.runs
        touched: dict[int, Run] = {}
        for offset in offsets:
            i = bisect_right(starts, offset) - 1
            if i >= 0:
                run = runs[starts[i]]
                if offset <= run.offsets[-1]:
                    touched[starts[i]] = run
        self.spread_all(touched.values())

    def take_range(self, start: int, stop: int, consumer: Member | None) -> bool:
        """Acknowledge the offsets from ``start`` to before ``stop`` if runs in flight hold
        every one of them, runs of consecutive offsets of ``consumer`` (if given): the
        runs' parts acknowledged go, the parts before and after stay whole.  False (and
        nothing taken) otherwise."""
        taken: list[tuple[Run, range]] = []
        at = start
        for run in self.overlapping(start, stop):
            held = run.offsets
            if (type(held) is not range or held.start > at
                    or (consumer is not None and run.consumer is not consumer)):
                return False
            taken.append((run, held))
            at = held.stop
        if at < stop:
            return False
        for run, held in taken:
            self.drop_run(run)
            # its head and its tail stay in flight whole, each with the run's records
            # (shared, not copied: a part knows its offsets, and finds a record by its)
            if held.start < start:
                self.add_run(Run(run.topic, run.group, run.records, run.consumer,
                                 run.deadline, range(held.start, start)))
            if held.stop > stop:
                self.add_run(Run(run.topic, run.group, run.records, run.consumer,
                                 run.deadline, range(stop, held.stop)))
        return True
