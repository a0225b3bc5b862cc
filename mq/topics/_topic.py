"""A topic's consume groups, sans-I/O: who gets which message, credits, acks, redelivery.

Every group gets every message of its topic (that passes its filter);
consumers of one group share the group's messages.  A consumer holds a
*window* of unacknowledged messages (its credits, zbus's ``consume_window``)
and is pushed messages while it has credits -- no request per message.  An
ack names offsets, any number at once.  A message still unacknowledged when
its consumer detaches, or after ``ack_timeout`` seconds, goes to another
consumer of the group (the next with credits) with its delivery count; after
``max_deliveries`` deliveries it goes to the dead-letter callback instead
(the server appends it to the group's dead-letter topic) and counts as
handled.

A group's *floor* is the lowest offset not yet handled: every offset below it
was acknowledged, or skipped by the filter.  The floor is what is persisted
(:class:`~mq.storage._cursor.CursorStore`); after a restart a group starts again at
its floor, so what was delivered but not acknowledged is delivered again
(at least once).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from operator import attrgetter
from typing import Protocol

from pump import ConfigError

from ..storage._files import SyncPoint
from ..storage._record import Entry, Produced, Record
from ..storage._scan import Corruption
from ._filter import TagFilter
from ._group import Delivery, Group, Member, Run, Start, UnknownGroupError

#: Seconds a delivered message may stay unacknowledged before it goes to another consumer.
DEFAULT_ACK_TIMEOUT = 30.0
#: Deliveries of one message before it goes to the dead-letter topic (RocketMQ's 16).
DEFAULT_MAX_DELIVERIES = 16


_offset = attrgetter("offset")


class Log(Protocol):
    """A topic's log (:class:`~mq.storage._log.TopicLog` on disk,
    :class:`~mq.storage._memory.MemoryLog`): what its topic reads and writes, and what
    the server's durability needs of it (:mod:`._commit`, retention, ``query``)."""

    @property
    def persistent(self) -> bool:
        """On disk: its writes are durable once fsynced (a memory log's never are)."""
    @property
    def start_offset(self) -> int: ...
    @property
    def next_offset(self) -> int: ...
    @property
    def durable_offset(self) -> int: ...
    @property
    def corruptions(self) -> list[Corruption]:
        """Damage found in its files (none in memory)."""

    def append(self, messages: Sequence[Entry] | Produced, *, keep: bool = True) -> int:
        """Store messages: the first one's offset; ``keep``: kept in memory for readers
        too (where its records are not there already)."""
    def read(self, offset: int, *, max_count: int = ..., max_bytes: int = ...
             ) -> list[Record]: ...
    def release(self, offset: int) -> None:
        """The groups read from memory have read below ``offset``: not kept for them."""
    def want_written(self) -> None:
        """Keep the next appends as written (a replica follows)."""
    def written_since(self, offset: int, max_bytes: int, max_count: int
                      ) -> tuple[list[bytes | memoryview], int, int] | None:
        """The records from ``offset`` on as its appends wrote them, if it holds them:
        ``(chunks, count, bytes)`` (see :class:`~mq.storage._written.Written`)."""
    def release_written(self, offset: int) -> None:
        """Every replica was sent the records below ``offset``."""
    def offset_for_time(self, timestamp_ms: int) -> int: ...
    def sync(self) -> int: ...
    def prepare_sync(self) -> SyncPoint | None:
        """What an fsync must cover now (None: nothing to fsync); see :mod:`._commit`."""
    def finish_sync(self, point: SyncPoint, error: OSError | None) -> int: ...
    def retain(self, *, max_bytes: int | None = None, max_age: float | None = None
               ) -> int: ...
    def close(self) -> None: ...


class Topic:
    """A topic's log and consume groups.

    ``saved`` maps groups to the floors persisted before (a restart);
    ``clock()`` is the pump's clock (seconds); ``dead(topic, group, record,
    deliveries)`` takes a message that ran out of deliveries.
    """

    def __init__(self, name: str, log: Log, *, clock: Callable[[], float],
                 saved: dict[str, int] | None = None,
                 ack_timeout: float = DEFAULT_ACK_TIMEOUT,
                 max_deliveries: int = DEFAULT_MAX_DELIVERIES,
                 dead: Callable[[str, str, Record, int], object] | None = None,
                 moved: dict[str, None] | None = None) -> None:
        if not ack_timeout > 0 or max_deliveries < 1:
            raise ConfigError("ack_timeout must be positive and max_deliveries at least 1")
        self.name = name
        self.log = log
        self.clock = clock
        self.ack_timeout = ack_timeout
        self.max_deliveries = max_deliveries
        self.dead = dead
        self.groups: dict[str, Group] = {}
        #: Consumers attached to its groups, in all: while there are none, what is
        #: published is not kept in memory for them (its log's tail).
        self.attached = 0
        self._saved = dict(saved or {})
        #: The topics (by name, in the order they moved) whose groups' floors or filters
        #: changed since their holder last looked: this one is added as its own change.
        #: A server shares one among its topics, and ships to its replicas only those.
        self.moved: dict[str, None] = {} if moved is None else moved

    # -- groups ------------------------------------------------------------------------

    def declare_group(self, name: str, *, filter: str | None = None,
                      start: Start | str | None = None) -> Group:
        """Create a group (or change an existing one's filter).  A group saved before a
        restart starts at its saved floor whatever ``start`` says."""
        parsed = TagFilter.parse(filter)
        group = self.groups.get(name)
        if group is not None:
            group.filter = parsed
            self._moved(group)
            return group
        if name in self._saved:
            position = self._saved.pop(name)
        else:
            position = self._start(start if isinstance(start, Start) else Start.parse(start))
        position = min(max(position, self.log.start_offset), self.log.next_offset)
        group = self.groups[name] = Group(name, parsed, position)
        self.moved[self.name] = None
        return group

    def _moved(self, group: Group) -> None:
        """The group's floor (or filter) changed: saved at the next tick, and shipped to
        replicas at the next shipment."""
        group.dirty = True
        self.moved[self.name] = None

    def _start(self, start: Start) -> int:
        log = self.log
        if start.kind == "beginning":
            return log.start_offset
        if start.kind == "offset":
            assert isinstance(start.value, int)
            return start.value
        if start.kind == "time":
            assert isinstance(start.value, int)
            return log.offset_for_time(start.value)
        if start.kind == "copy":
            assert isinstance(start.value, str)
            return self.group(start.value).floor
        if self.groups:
            return max(g.next_read for g in self.groups.values())
        return log.next_offset

    def group(self, name: str) -> Group:
        try:
            return self.groups[name]
        except KeyError:
            raise UnknownGroupError(f"topic {self.name!r} has no consume group {name!r}"
                                    ) from None

    def remove_group(self, name: str) -> Group:
        group = self.group(name)
        for consumer in list(group.consumers):
            self.detach(consumer)
        return self.groups.pop(name)

    # -- consumers ---------------------------------------------------------------------

    def attach(self, consumer: Member) -> None:
        self.group(consumer.group).consumers.append(consumer)
        self.attached += 1

    def detach(self, consumer: Member) -> int:
        """A consumer left: what it held goes to the others; how many messages."""
        group = self.groups.get(consumer.group)
        if group is None or consumer not in group.consumers:
            return 0
        group.consumers.remove(consumer)
        self.attached -= 1
        group.spread_all(list(consumer.runs.values()))
        returned = sorted(consumer.pending)
        for offset in returned:
            pending = group.pending.pop(offset)
            group.redeliver.append((pending.record_at(offset), pending.deliveries))
        consumer.pending.clear()
        return len(returned)

    # -- messages ----------------------------------------------------------------------

    def publish(self, messages: Sequence[Entry] | Produced) -> int:
        """Store messages; the first one's offset.  Nothing is delivered until
        :meth:`dispatch` (the server calls it once they are visible).  With no consumer
        attached they are not kept in memory for readers (they read the file)."""
        return self.log.append(messages, keep=self.attached > 0)

    def dispatch(self, visible: int | None = None) -> int:
        """Push messages below ``visible`` (default: all stored) to consumers with
        credits; how many went."""
        limit = self.log.next_offset if visible is None else visible
        sent = 0
        needed = limit
        for group in self.groups.values():
            sent += self._dispatch(group, limit)
            if group.consumers and group.next_read < needed:
                needed = group.next_read
        # what every group with consumers has read is not kept in memory for them (a
        # group that comes later reads the file; a redelivery is of the record its
        # delivery holds): a topic whose consumers keep up holds little
        self.log.release(needed)
        return sent

    def _dispatch(self, group: Group, limit: int) -> int:
        sent = 0
        deadline = self.clock() + self.ack_timeout
        while group.consumers:
            if group.redeliver:
                consumer = group.pick()
                if consumer is None:
                    return sent
                record, deliveries = group.redeliver.popleft()
                if deliveries >= self.max_deliveries:
                    group.dead_letters += 1
                    self._moved(group)
                    if self.dead is not None:
                        self.dead(self.name, group.name, record, deliveries)
                    continue
                self._send(group, consumer, record, deliveries + 1, deadline)
                sent += 1
                continue
            if group.next_read < self.log.start_offset:
                group.next_read = self.log.start_offset  # retention took them
                self._moved(group)
            if group.next_read >= limit:
                return sent
            credits = 0  # (counted up to what one read takes: a group may have thousands)
            for member in group.consumers:
                room = member.credits
                if room > 0:
                    credits += room
                    if credits >= 1024:
                        break
            if credits == 0:
                return sent
            if len(group.consumers) == 1 and credits < min(group.consumers[0].min_room,
                                                           limit - group.next_read):
                return sent  # until its acks free a batch's worth (see Member)
            records = self.log.read(group.next_read, max_count=min(credits, 1024))
            if not records:
                return sent
            handed, more = self._hand_out(group, records, limit, deadline)
            sent += handed
            if not more:
                return sent
        return sent

    def _hand_out(self, group: Group, records: list[Record], limit: int, deadline: float
                  ) -> tuple[int, bool]:
        """First deliveries of ``records`` (in offset order, from ``group.next_read``) to the
        group's consumers with credits, in turn from the group's turn: each a run of its
        even share of the records or its :attr:`Member.run`, whichever is larger (less if
        its credits end first), then the next; how many went, and whether every record
        was handled (False: a record at ``limit``, or no credits left)."""
        consumers = group.consumers
        n = len(consumers)
        if n == 1 and group.filter is None:
            return self._hand_to_one(group, consumers[0], records, limit, deadline)
        share = -(-len(records) // n)
        filter_, in_flight, topic, name = group.filter, group.pending, self.name, group.name
        i = group.next_ready(group.turn if group.turn < n else 0)
        consumer = consumers[i] if i >= 0 else None
        run = min(consumer.credits, max(share, consumer.run)) if consumer is not None else 0
        sent, served = 0, -1
        done, skipped = True, False
        for record in records:
            offset = record.offset
            if offset >= limit:
                done = False
                break
            if filter_ is not None and not filter_.matches(record.tag):
                group.next_read = offset + 1
                skipped = True  # the floor may move: said once, below
                continue
            if consumer is None:
                done = False
                break
            group.next_read = offset + 1
            in_flight[offset] = delivery = Delivery(topic, name, record, 1, consumer, deadline)
            consumer.pending.add(offset)
            consumer.deliver(delivery)
            sent += 1
            served = i
            run -= 1
            if run:
                continue
            i = group.next_ready(i + 1 if i + 1 < n else 0)
            consumer = consumers[i] if i >= 0 else None
            if consumer is not None:
                run = min(consumer.credits, max(share, consumer.run))
        if served >= 0:  # the turn goes to the one after the last consumer served
            group.turn = served + 1 if served + 1 < n else 0
        if skipped:
            self._moved(group)
        return sent, done

    def _hand_to_one(self, group: Group, consumer: Member, records: list[Record], limit: int,
                     deadline: float) -> tuple[int, bool]:
        """:meth:`_hand_out` for a group of one consumer and no filter (a relaying
        server's group, a lone consumer): the records below ``limit``, as many as its
        credits allow, in one run."""
        room = consumer.credits
        if room <= 0:
            return 0, False
        take = records[:room]
        if take[-1].offset >= limit:  # offsets ascend: keep those below the limit
            take = take[:bisect_left(take, limit, key=_offset)]
            if not take:
                return 0, False
        # in flight whole: one entry, whatever its length (taken apart only if one of its
        # offsets is taken alone)
        group.add_run(run := Run(self.name, group.name, take, consumer, deadline))
        group.next_read = take[-1].offset + 1
        group.turn = 0
        if consumer.deliver_run is not None:
            consumer.deliver_run(run)
        else:
            topic, name = self.name, group.name
            deliveries = [Delivery(topic, name, record, 1, consumer, deadline)
                          for record in take]
            if consumer.deliver_many is not None:
                consumer.deliver_many(deliveries)
            else:
                for delivery in deliveries:
                    consumer.deliver(delivery)
        return len(take), len(take) == len(records)

    def _send(self, group: Group, consumer: Member, record: Record, deliveries: int,
              deadline: float) -> None:
        delivery = Delivery(self.name, group.name, record, deliveries, consumer, deadline)
        group.pending[record.offset] = delivery
        consumer.pending.add(record.offset)
        consumer.deliver(delivery)

    def ack(self, group_name: str, offsets: Iterable[int], consumer: Member | None = None
            ) -> tuple[int, list[int]]:
        """Acknowledge offsets of a group (from ``consumer``, if given: only what it holds):
        how many were acknowledged, and the offsets that were not pending (for that
        consumer): never delivered, acknowledged already, or gone to another consumer."""
        group = self.group(group_name)
        if not isinstance(offsets, (list, range)):
            offsets = list(offsets)
        if group.runs:
            if type(offsets) is range and offsets.step == 1 and offsets and group.take_range(
                    offsets.start, offsets.stop, consumer):
                self._moved(group)  # runs' parts, in a few steps however many offsets
                return len(offsets), []
            group.spread_touched(offsets)  # the runs it names offsets of, one by one
        in_flight = group.pending
        if consumer is not None:
            named = set(offsets)
            if len(named) == len(offsets) and named <= consumer.pending:
                # each once, every one this consumer's: taken in C (what holds an offset
                # in flight is always that offset's consumer's own)
                consumer.pending -= named
                deque(map(in_flight.__delitem__, offsets), 0)
                if named:
                    self._moved(group)
                return len(named), []
        done = 0
        missed: list[int] = []
        for offset in offsets:
            pending = in_flight.get(offset)
            if pending is None or (consumer is not None and pending.consumer is not consumer):
                missed.append(offset)
                continue
            del in_flight[offset]
            pending.consumer.pending.discard(offset)
            done += 1
        if done:
            self._moved(group)
        return done, missed

    def waiting(self, group_name: str) -> bool:
        """Whether the group has consumers and messages for them not handed out yet
        (stored, or to be delivered again): a dispatch may give it some."""
        group = self.group(group_name)
        return bool(group.consumers) and (bool(group.redeliver)
                                          or group.next_read < self.log.next_offset)

    def expire(self, now: float | None = None) -> int:
        """Messages past their ack timeout (at ``now``, the clock's time if not given) go
        back to their group; how many."""
        if now is None:
            now = self.clock()
        late = 0
        for group in self.groups.values():
            if group.runs:  # late runs taken apart: each offset goes back on its own
                group.spread_all([r for r in group.runs.values() if r.deadline <= now])
            in_flight = group.pending
            if not in_flight:
                continue
            # in offset order, only the late ones sorted (a wide window holds thousands)
            for offset in sorted([o for o, p in in_flight.items() if p.deadline <= now]):
                pending = in_flight.pop(offset)
                pending.consumer.pending.discard(offset)
                group.redeliver.append((pending.record_at(offset), pending.deliveries))
                late += 1
        return late

    def empty(self) -> None:
        """Every group skips to the end: what was stored is handled."""
        for group in self.groups.values():
            for run in list(group.runs.values()):
                group.drop_run(run)
            for offset, pending in group.pending.items():
                pending.consumer.pending.discard(offset)
            group.pending.clear()
            group.redeliver.clear()
            group.next_read = self.log.next_offset
            self._moved(group)

    def advance(self, name: str, floor: int) -> None:
        """Another copy of this topic (its master, or the cluster's root a former root
        sent them to) handled the group's messages below ``floor``: they are not
        delivered here, neither for the first time nor again (those given out here and
        not given back stay theirs)."""
        group = self.groups[name]
        floor = min(floor, self.log.next_offset)
        redeliver = group.redeliver
        moved = bool(redeliver) and min(r.offset for r, _ in redeliver) < floor
        if moved:  # given back here, handled there: even below what this copy read
            group.redeliver = deque(r for r in redeliver if r[0].offset >= floor)
        if floor > group.next_read:
            group.next_read = floor
            moved = True
        if moved:
            self._moved(group)

    def cut(self, offset: int) -> None:
        """The log lost its records from ``offset`` on (a replica cut a tail its master
        never had): no group reads or waits for them any more."""
        for group in self.groups.values():
            group.spread_all([r for r in group.runs.values() if r.offsets[-1] >= offset])
            for late in [o for o in group.pending if o >= offset]:
                group.pending.pop(late).consumer.pending.discard(late)
            group.redeliver = deque(r for r in group.redeliver if r[0].offset < offset)
            if group.next_read > offset:
                group.next_read = offset
                self._moved(group)

    # -- figures -----------------------------------------------------------------------

    def lag(self, group_name: str) -> int:
        """Messages of the group not yet handled."""
        return self.log.next_offset - self.group(group_name).floor

    @property
    def depth(self) -> int:
        """The largest lag of any group (zbus's ``messageDepth``)."""
        return max((self.lag(g) for g in self.groups), default=0)

    def floors_to_save(self) -> dict[str, int]:
        """The floors that changed since the last call."""
        out = {}
        for group in self.groups.values():
            if group.dirty:
                out[group.name] = group.floor
                group.dirty = False
        return out
