"""The replay's figures by the plainest means: the executable specification.

One Python loop over the rows of a directory of Parquet traces, with dicts and lists
(no Arrow compute, numpy or Spark): every invariant (duplicate send, duplicate
delivery, delivered but never sent, FIFO per link and direction, size mismatch),
undelivered messages with their causes, exact latency percentiles per link and
direction, messages per run, receiving broker and second, refusals and sizes.  The
fold (:mod:`replay.fold`, which both engines run) is held to it by the tests, and
``rdvpump bench replay`` checks the Spark job against it at scale and times it as the
baseline.  It writes no files and draws no plots.

The rules, as the code states them: times are aligned by each pump's latest ``clock``
row, and each run's seconds counted from its first event; a message is (run, link, dir,
seq); its first send and first delivery give its latency; a delivery is out of order
when it reached its receiver (by pump step, then row) before an earlier seq of the same
stream did; an undelivered message's cause is
``peer_failed`` when its link ended by a failure, ``in_flight`` when it ended with a
reason, else ``run_ended``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pump.schema import Cause, Kind, Outcome, Violation


@dataclass
class _Rows:
    """What one pass over the rows keeps."""

    offsets: dict[tuple[str, str], tuple[float, float]]  # (run, pump): latest clock
    events: int = 0
    kinds: dict[str, int] = field(default_factory=dict)
    ends: dict[tuple[str, str], list[Any]] = field(default_factory=dict)  # (at, reason), failed
    refusals: dict[str, int] = field(default_factory=dict)
    # per message: sends, deliveries, sent_at, delivered_at, size, size_max,
    # delivered_size, delivered_size_max, (least step, least row) of the deliveries
    messages: dict[tuple[Any, ...], list[Any]] = field(default_factory=dict)
    senders: dict[tuple[str, str, str], str] = field(default_factory=dict)
    receivers: dict[tuple[str, str, str], str] = field(default_factory=dict)
    firsts: dict[str, float] = field(default_factory=dict)  # each run's first aligned time


_COLUMNS = ["run", "pump", "step", "time", "kind", "broker", "link", "dir", "seq", "size",
            "outcome", "reason", "monotonic"]


def figures(directory: Path) -> dict[str, Any]:
    """The figures of the Parquet traces in ``directory`` (see the module's text)."""
    import pyarrow.parquet as pq

    tables = [pq.read_table(path, columns=_COLUMNS)
              for path in sorted(directory.glob("*.parquet"))]
    rows = _Rows(_clock_offsets(tables))  # every time is aligned before it is used
    for table in tables:
        _tally(table, rows)
    return _judge(rows)


def _clock_offsets(tables: list[Any]) -> dict[tuple[str, str], tuple[float, float]]:
    """Each pump's latest ``clock`` row: (its time, monotonic minus time)."""
    offsets: dict[tuple[str, str], tuple[float, float]] = {}
    for table in tables:
        for run, pump, time_, kind, mono in zip(*(table.column(c).to_pylist() for c in (
                "run", "pump", "time", "kind", "monotonic")), strict=True):
            if kind == Kind.CLOCK and ((run, pump) not in offsets
                                    or time_ > offsets[(run, pump)][0]):
                offsets[(run, pump)] = (time_, mono - time_)
    return offsets


def _tally(table: Any, rows: _Rows) -> None:
    """One table's rows into ``rows``: kinds, each message's sends and deliveries, each
    link's first end, refusals."""
    offsets, messages, ends = rows.offsets, rows.messages, rows.ends
    kinds, refusals, firsts = rows.kinds, rows.refusals, rows.firsts
    rows.events += table.num_rows
    cols = [table.column(c).to_pylist() for c in _COLUMNS]
    for row, (run, pump, step, time_, kind, broker, link, dir_, seq, size, outcome,
              reason, _) in enumerate(zip(*cols, strict=True)):
        kinds[kind] = kinds.get(kind, 0) + 1
        at = time_ + offsets.get((run, pump), (0.0, 0.0))[1]
        if at < firsts.get(run, at + 1.0):
            firsts[run] = at
        if kind == Kind.SEND or kind == Kind.DELIVER:
            m = messages.get((run, link, dir_, seq))
            if m is None:
                m = messages[(run, link, dir_, seq)] = [0, 0, None, None, None, None,
                                                        None, None, None]
            if kind == Kind.SEND:
                rows.senders.setdefault((run, link, dir_), broker)
                m[0] += 1
                m[2] = at if m[2] is None else min(m[2], at)
                m[4] = size if m[4] is None else min(m[4], size)
                m[5] = size if m[5] is None else max(m[5], size)
            else:
                rows.receivers.setdefault((run, link, dir_), broker)
                m[1] += 1
                m[3] = at if m[3] is None else min(m[3], at)
                m[6] = size if m[6] is None else min(m[6], size)
                m[7] = size if m[7] is None else max(m[7], size)
                m[8] = (step, row) if m[8] is None else (min(m[8][0], step),
                                                         min(m[8][1], row))
        elif kind in (Kind.DISCONNECT, Kind.CLOSE, Kind.FAIL, Kind.PROTOCOL_ERROR) and link:
            end = ends.setdefault((run, link), [None, False])
            if reason is not None and (end[0] is None or (at, reason) < end[0]):
                end[0] = (at, reason)
            if kind in (Kind.FAIL, Kind.PROTOCOL_ERROR) or (kind == Kind.DISCONNECT
                                                      and outcome != Outcome.CLEAN):
                end[1] = True
        elif kind == Kind.REFUSE and outcome != Outcome.INBOUND:
            refusals[reason] = refusals.get(reason, 0) + 1


def _judge(rows: _Rows) -> dict[str, Any]:
    """Each message judged in (run, link, dir, seq) order: violations, undelivered causes,
    latencies, sizes, messages per run, receiver and second; then the figures."""
    violations: list[tuple[Any, ...]] = []
    undelivered: dict[str, int] = {}
    latencies: dict[tuple[str, str, str], list[float]] = {}
    per_second: dict[tuple[str, str, int], list[int]] = {}
    sizes: dict[int, int] = {}
    last: dict[tuple[str, str, str], tuple[Any, ...]] = {}
    messages, ends = rows.messages, rows.ends
    for key in sorted(messages):
        sends, deliveries, sent_at, delivered_at, size, size_max, dsize, dsize_max, pos = \
            messages[key]
        stream = key[:3]
        if sends > 1:
            violations.append((*key, Violation.DUPLICATE_SEND))
        if deliveries > 1:
            violations.append((*key, Violation.DUPLICATE_DELIVERY))
        if deliveries and not sends:
            violations.append((*key, Violation.NEVER_SENT))
        if sends and deliveries and not size == size_max == dsize == dsize_max:
            violations.append((*key, Violation.SIZE_MISMATCH))
        if pos is not None:
            before = last.get(stream)
            if before is not None and before[0] > pos:
                violations.append((*stream, before[1], Violation.OUT_OF_ORDER))
            last[stream] = (pos, key[3])
        if sends:
            bucket = 0 if size <= 0 else 1 << (size - 1).bit_length()
            sizes[bucket] = sizes.get(bucket, 0) + 1
        if sends and not deliveries:
            end = ends.get(key[:2]) or [None, False]
            cause = (Cause.PEER_FAILED if end[1] else Cause.IN_FLIGHT if end[0]
                     else Cause.RUN_ENDED)
            undelivered[cause] = undelivered.get(cause, 0) + 1
        if sends and deliveries:
            latencies.setdefault(stream, []).append(delivered_at - sent_at)
            cell = per_second.setdefault(
                (key[0], rows.receivers[stream], int(delivered_at - rows.firsts[key[0]])),
                [0, 0])
            cell[0] += 1
            cell[1] += dsize
    percentiles = {}
    for stream, values in latencies.items():
        values.sort()
        n = len(values)
        percentiles[stream] = [values[min(n - 1, int(q * n))] for q in (0.5, 0.9, 0.99)] \
            + [values[-1]]
    by_type: dict[str, int] = {}
    for violation in violations:
        by_type[violation[-1]] = by_type.get(violation[-1], 0) + 1
    return {"events": rows.events, "events_by_kind": rows.kinds, "violations": len(violations),
            "violations_by_type": by_type,
            "undelivered_by_cause": undelivered,
            "matched": sum(len(v) for v in latencies.values()),
            "latency_per_stream": percentiles, "per_second": per_second,
            "per_second_rows": len(per_second), "refusals": rows.refusals, "sizes": sizes,
            "senders": len(rows.senders)}
