"""A checker of what the clients of a message queue saw: publish, consume and ack
operations, checked against at-least-once delivery.

A history is a sequence of operations in the order they happened (a JSON Lines file,
one operation a line, or built in a program with :class:`History`):

* ``{"op": "publish", "topic", "producer", "sequence", "status", "partition"?,
  "offset"?, "server"?, "epoch"?}`` -- one attempt to publish the message
  ``(topic, producer, sequence)``.  ``status``: ``ok`` (acknowledged: stored as the
  durability policy promised), ``failed`` (refused: the system says it was not
  stored) or ``unknown`` (no answer: it may or may not be stored; a timeout, a lost
  link).  A retry is another publish of the same message.  ``partition`` names the
  queue that holds it (a server, or a replicated group of servers: one sequence of
  offsets), ``offset`` where it was stored there, ``server`` who acknowledged it and
  ``epoch`` the partition's master epoch it acknowledged in.
* ``{"op": "consume", "topic", "group", "producer", "sequence", "partition"?,
  "offset"?, "consumer"?}`` -- a message delivered to a consumer of ``group``.
* ``{"op": "ack", "topic", "group", "partition"?, "offset", "status"}`` -- the group
  acknowledged the message at ``offset`` (``status`` ``ok`` when the system confirmed
  it; anything else is only an attempt).

What is checked (:func:`check_history`), each finding a :class:`HistoryFinding`:

* ``lost``: an acknowledged message that a group never received.  The groups expected
  to receive every message of a topic are those that consumed from it, or those given.
* ``stored twice``: more copies of a message than publishes of it (a server that stored
  one publish twice).  A publish that got no answer and was tried again may leave a
  copy per try: at-least-once allows it, counted (``copies``); with ``idempotent``
  (servers that recognise a retry by its producer and sequence) two offsets of one
  partition are a finding all the same.
* ``delivered after its ack``: a message a group received again after its ack of it
  was confirmed.  Redelivery of an unacknowledged message is at-least-once's right.
* ``out of order``: two messages of one producer in one partition whose offsets do not
  rise with their sequence numbers.
* ``two histories``: one offset of a partition delivered with two different messages
  (a consumer saw a tail that was later cut and written over).
* ``delivered though refused``: a message received whose every publish was refused.
* ``two masters in one epoch``: two servers acknowledged publishes to one partition in
  one epoch.

Losses that a mode allows (an ``async`` replicated group after a failover) are findings
all the same: :attr:`HistoryReport.counts` counts each kind, and the caller decides what it
accepts.  Nothing here does I/O but :meth:`History.read` and :meth:`History.write`.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import IO, Any

from pump import RdvpumpError

#: The statuses of a publish.
PUBLISH_STATUSES = ("ok", "failed", "unknown")
#: The kinds of finding, in the order a report lists them.
KINDS = ("lost", "stored twice", "delivered after its ack", "out of order",
         "two histories", "delivered though refused", "two masters in one epoch")

_Key = tuple[str, str, int]  # (topic, producer, sequence): one message


class HistoryError(RdvpumpError, ValueError):
    """A history that cannot be read: the line and what is wrong with it."""


@dataclass(frozen=True, slots=True)
class Published:
    topic: str
    producer: str
    sequence: int
    status: str = "ok"
    partition: str | None = None
    offset: int | None = None
    server: str | None = None
    epoch: int | None = None
    op: str = field(default="publish", init=False)


@dataclass(frozen=True, slots=True)
class Consumed:
    topic: str
    group: str
    producer: str
    sequence: int
    partition: str | None = None
    offset: int | None = None
    consumer: str | None = None
    op: str = field(default="consume", init=False)


@dataclass(frozen=True, slots=True)
class Acked:
    topic: str
    group: str
    offset: int
    status: str = "ok"
    partition: str | None = None
    op: str = field(default="ack", init=False)


Operation = Published | Consumed | Acked
_TYPES: dict[str, type[Published] | type[Consumed] | type[Acked]] = {
    "publish": Published, "consume": Consumed, "ack": Acked}
_FIELDS = {name: {f: t for f, t in kind.__annotations__.items() if f != "op"}
           for name, kind in _TYPES.items()}


@dataclass(frozen=True)
class HistoryFinding:
    kind: str
    topic: str
    detail: str
    producer: str | None = None
    sequence: int | None = None
    group: str | None = None
    partition: str | None = None


@dataclass
class HistoryReport:
    """What :func:`check_history` found, and counts of what the history holds."""

    findings: list[HistoryFinding]
    counts: dict[str, int]

    @property
    def ok(self) -> bool:
        return not self.findings

    def of(self, kind: str) -> list[HistoryFinding]:
        return [f for f in self.findings if f.kind == kind]

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "counts": self.counts,
                "findings": [asdict(f) for f in self.findings]}


class History:
    """Operations in the order they happened; :meth:`check` checks them."""

    def __init__(self, operations: Iterable[Operation] = ()) -> None:
        self.operations: list[Operation] = list(operations)

    def __iter__(self) -> Iterator[Operation]:
        return iter(self.operations)

    def __len__(self) -> int:
        return len(self.operations)

    def publish(self, topic: str, producer: str, sequence: int, status: str = "ok", *,
                partition: str | None = None, offset: int | None = None,
                server: str | None = None, epoch: int | None = None) -> None:
        if status not in PUBLISH_STATUSES:
            raise ValueError(f"a publish's status is one of {', '.join(PUBLISH_STATUSES)}, "
                             f"not {status!r}")
        self.operations.append(Published(topic, producer, sequence, status, partition, offset,
                                       server, epoch))

    def consume(self, topic: str, group: str, producer: str, sequence: int, *,
                partition: str | None = None, offset: int | None = None,
                consumer: str | None = None) -> None:
        self.operations.append(Consumed(topic, group, producer, sequence, partition, offset,
                                       consumer))

    def ack(self, topic: str, group: str, offset: int, status: str = "ok", *,
            partition: str | None = None) -> None:
        self.operations.append(Acked(topic, group, offset, status, partition))

    def check(self, groups: Mapping[str, Iterable[str]] | None = None, *,
              idempotent: bool = False) -> HistoryReport:
        return check_history(self.operations, groups, idempotent=idempotent)

    def write(self, out: IO[str]) -> None:
        """The history as JSON Lines (fields that are None left out)."""
        for op in self.operations:
            row = {"op": op.op, **{k: v for k, v in asdict(op).items()
                                   if v is not None and k != "op"}}
            out.write(json.dumps(row) + "\n")

    @classmethod
    def read(cls, lines: Iterable[str]) -> History:
        """A history from JSON Lines; :class:`HistoryError` names the first bad line."""
        history = cls()
        for number, line in enumerate(lines, start=1):
            if line.strip():
                history.operations.append(_parse(line, number))
        return history


def _parse(line: str, number: int) -> Operation:
    try:
        row = json.loads(line)
    except ValueError as exc:
        raise HistoryError(f"line {number}: not JSON: {exc}") from None
    if not isinstance(row, dict):
        raise HistoryError(f"line {number}: not a JSON object")
    kind = row.pop("op", None)
    if kind not in _TYPES:
        raise HistoryError(f"line {number}: 'op' is one of publish, consume, ack, "
                           f"not {kind!r}")
    fields = _FIELDS[kind]
    unknown = sorted(set(row) - set(fields))
    if unknown:
        raise HistoryError(f"line {number}: a {kind} has no field {unknown[0]!r}")
    for name, annotation in fields.items():
        value = row.get(name)
        required = "None" not in annotation and name not in ("status",)
        if value is None:
            if required:
                raise HistoryError(f"line {number}: a {kind} needs {name!r}")
            continue
        want = int if annotation.startswith("int") else str
        if type(value) is not want:
            raise HistoryError(f"line {number}: {name!r} is a{'n' * (want is int)} "
                               f"{want.__name__}, not {value!r}")
    if kind == "publish" and row.get("status", "ok") not in PUBLISH_STATUSES:
        raise HistoryError(f"line {number}: a publish's status is one of "
                           f"{', '.join(PUBLISH_STATUSES)}, not {row['status']!r}")
    return _TYPES[kind](**row)


def check_history(operations: Iterable[Operation],
                  groups: Mapping[str, Iterable[str]] | None = None, *,
                  idempotent: bool = False) -> HistoryReport:
    """Check a history (see the module); ``groups``: the groups expected to receive
    every acknowledged message of each topic (by default, each topic's groups that
    consumed from it); ``idempotent``: a retried publish must not leave a second copy
    in one partition."""
    seen = _Seen()
    for op in operations:
        if isinstance(op, Published):
            seen.published(op)
        elif isinstance(op, Consumed):
            seen.consumed(op)
        elif op.status == "ok":
            seen.acked.add((op.topic, op.group, op.partition, op.offset))
    findings, counts, stored = seen.findings, seen.counts, seen.stored
    findings += _lost(seen.statuses, seen.received, groups, counts)
    findings += _stored_twice(stored, seen.tries, idempotent)
    findings += _out_of_order(stored)
    findings += _conflicts(seen.at_offset, seen.statuses, seen.received, seen.masters)
    counts["messages"] = len(seen.statuses)
    counts["acknowledged"] = sum("ok" in s for s in seen.statuses.values())
    counts["copies"] = sum(len(offsets) for keys in stored.values()
                           for offsets in keys.values()) - len(seen.partitions_of)
    for kind in KINDS:
        counts[kind] = sum(f.kind == kind for f in findings)
    findings.sort(key=lambda f: KINDS.index(f.kind))
    return HistoryReport(findings, dict(sorted(counts.items())))


class _Seen:
    """What a history's operations say, gathered in one pass for the checks."""

    def __init__(self) -> None:
        self.findings: list[HistoryFinding] = []
        self.statuses: dict[_Key, set[str]] = {}
        self.stored: dict[tuple[str, str], dict[_Key, set[int]]] = {}  # (topic, partition)
        self.partitions_of: dict[_Key, set[str]] = {}
        self.received: dict[tuple[str, str], set[_Key]] = {}  # (topic, group)
        #: (topic, partition, offset): the messages seen there
        self.at_offset: dict[tuple[str, str, int], set[_Key]] = {}
        #: (topic, group, partition, offset) acknowledged, and delivered again after that
        self.acked: set[tuple[str, str, str | None, int]] = set()
        self.again: set[tuple[str, str, str | None, int]] = set()
        self.masters: dict[tuple[str, int], set[str]] = {}  # (partition, epoch): servers
        self.counts: Counter[str] = Counter()
        self.tries: Counter[_Key] = Counter()

    def published(self, op: Published) -> None:
        key = (op.topic, op.producer, op.sequence)
        self.statuses.setdefault(key, set()).add(op.status)
        self.tries[key] += 1
        self.counts[f"publishes {op.status}"] += 1
        if op.partition is not None and op.offset is not None:
            _store(self.stored, self.partitions_of, self.at_offset, key, op.topic,
                   op.partition, op.offset)
        if op.status == "ok" and op.partition is not None and op.epoch is not None \
                and op.server is not None:
            self.masters.setdefault((op.partition, op.epoch), set()).add(op.server)

    def consumed(self, op: Consumed) -> None:
        key = (op.topic, op.producer, op.sequence)
        self.counts["deliveries"] += 1
        if key in self.received.setdefault((op.topic, op.group), set()):
            self.counts["redeliveries"] += 1
        self.received[(op.topic, op.group)].add(key)
        if op.partition is None or op.offset is None:
            return
        _store(self.stored, self.partitions_of, self.at_offset, key, op.topic, op.partition,
               op.offset)
        where = (op.topic, op.group, op.partition, op.offset)
        if where in self.acked and where not in self.again:
            self.again.add(where)
            self.findings.append(HistoryFinding(
                "delivered after its ack", op.topic,
                f"offset {op.offset} of {op.partition} delivered to {op.group} after the "
                f"group's ack of it was confirmed", op.producer, op.sequence, op.group,
                op.partition))


def _conflicts(at_offset: dict[tuple[str, str, int], set[_Key]],
               statuses: dict[_Key, set[str]], received: dict[tuple[str, str], set[_Key]],
               masters: dict[tuple[str, int], set[str]]) -> list[HistoryFinding]:
    """Two messages at one offset, a message received though every publish of it was
    refused, two servers acknowledging for one partition in one epoch."""
    found = [HistoryFinding("two histories", topic, f"offset {offset} of {partition} holds "
                            f"{len(keys)} different messages: "
                            + ", ".join(f"{p}#{s}" for _, p, s in sorted(keys)),
                            partition=partition)
             for (topic, partition, offset), keys in sorted(at_offset.items())
             if len(keys) > 1]
    refused = {key for key, seen in statuses.items() if seen == {"failed"}}
    found += [HistoryFinding("delivered though refused", topic, f"{producer}#{sequence} was "
                             f"received by {group}, but every publish of it was refused",
                             producer, sequence, group)
              for (topic, group), keys in sorted(received.items())
              for (_, producer, sequence) in sorted(keys & refused)]
    found += [HistoryFinding("two masters in one epoch", "", f"{partition}: epoch {epoch} "
                             f"acknowledged by {', '.join(sorted(servers))}",
                             partition=partition)
              for (partition, epoch), servers in sorted(masters.items())
              if len(servers) > 1]
    return found


def _store(stored: dict[tuple[str, str], dict[_Key, set[int]]],
           partitions_of: dict[_Key, set[str]],
           at_offset: dict[tuple[str, str, int], set[_Key]],
           key: _Key, topic: str, partition: str, offset: int) -> None:
    stored.setdefault((topic, partition), {}).setdefault(key, set()).add(offset)
    partitions_of.setdefault(key, set()).add(partition)
    at_offset.setdefault((topic, partition, offset), set()).add(key)


def _lost(statuses: dict[_Key, set[str]], received: dict[tuple[str, str], set[_Key]],
          groups: Mapping[str, Iterable[str]] | None, counts: Counter[str]) -> list[HistoryFinding]:
    expected: dict[str, set[str]] = {}
    if groups is not None:
        expected = {topic: set(names) for topic, names in groups.items()}
    else:
        for topic, group in received:
            expected.setdefault(topic, set()).add(group)
    found = []
    for key, seen in sorted(statuses.items()):
        topic, producer, sequence = key
        for group in sorted(expected.get(topic, ())):
            if key in received.get((topic, group), ()):
                continue
            if "ok" in seen:
                found.append(HistoryFinding("lost", topic, f"{producer}#{sequence} was "
                                     f"acknowledged and {group} never received it",
                                     producer, sequence, group))
            elif "unknown" in seen:
                counts["unacknowledged never received"] += 1
    return found


def _stored_twice(stored: dict[tuple[str, str], dict[_Key, set[int]]],
                  tries: Counter[_Key], idempotent: bool) -> list[HistoryFinding]:
    """More copies of a message than publishes of it; with ``idempotent``, any second
    copy in one partition."""
    copies: Counter[_Key] = Counter()
    for keys in stored.values():
        for key, offsets in keys.items():
            copies[key] += len(offsets)
    found = []
    for (topic, partition), keys in sorted(stored.items()):
        for key, offsets in sorted(keys.items()):
            _, producer, sequence = key
            if len(offsets) > 1 and (idempotent or copies[key] > max(tries[key], 1)):
                found.append(HistoryFinding(
                    "stored twice", topic, f"{producer}#{sequence} at offsets "
                    f"{', '.join(map(str, sorted(offsets)))} of {partition} "
                    f"({tries[key]} publishes of it)", producer, sequence,
                    partition=partition))
    return found


def _out_of_order(stored: dict[tuple[str, str], dict[_Key, set[int]]]) -> list[HistoryFinding]:
    """Per partition and producer, in sequence order: each message's offset above the one
    before it (a message stored twice counts at its first offset)."""
    found = []
    for (topic, partition), keys in sorted(stored.items()):
        by_producer: dict[str, list[tuple[int, int]]] = {}
        for (_, producer, sequence), offsets in keys.items():
            by_producer.setdefault(producer, []).append((sequence, min(offsets)))
        for producer, pairs in sorted(by_producer.items()):
            pairs.sort()
            for (s1, o1), (s2, o2) in zip(pairs, pairs[1:], strict=False):
                if o2 < o1:
                    found.append(HistoryFinding("out of order", topic, f"{producer}#{s2} at offset "
                                         f"{o2} of {partition}, before {producer}#{s1} at "
                                         f"{o1}", producer, s2, partition=partition))
    return found
