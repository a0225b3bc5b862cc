"""The second pass of the replay: every figure that needs the messages.

The census (:class:`replay.census.Census`) numbers the streams (run, link, direction)
and cuts long ones into pieces; the engine folds each piece whole
(:func:`replay.fold.fold`, one row per group a message counts in); here the rows are
added up into the per-stream figures, the percentiles, the time bins and the histograms,
FIFO is checked where two pieces of a stream meet, and the engine is asked for the
listings of the messages that broke an invariant or were never delivered.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from typing import Any, Protocol

from replay import fold as _fold
from replay.census import Census

#: Violations and undelivered messages listed in summary.json (all are in Parquet).
SUMMARY_LIMIT = 100
#: Violations and undelivered messages up to this many are collected and written by the
#: driver; beyond it Spark writes them (and summary.json lists the first SUMMARY_LIMIT).
COLLECT_LIMIT = 100_000
#: Time bins across the run in the plots.
PLOT_BINS = 200
#: Latency histogram buckets per decade.
BUCKETS_PER_DECADE = 20

_STREAM = ["run", "link", "dir"]

#: Latency buckets per decade for the percentiles: a bucket's largest latency is at most
#: 0.23 % above its smallest.  Latencies of 1 ns or less (zero and negative ones, from
#: clocks out of line, included) share one bucket.
FINE_PER_DECADE = 1000
#: The percentiles reported, per link and direction and over the run.
QUANTILES = (0.5, 0.9, 0.99)
# the parts of the fold's result (measure)
_BIN, _SECOND, _LATENCY, _HISTOGRAM = _fold.BIN, _fold.SECOND, _fold.LATENCY, _fold.HISTOGRAM
_FIRST, _LAST = _fold.FIRST, _fold.LAST
#: The most rows of a stream folded at once (see :data:`replay.fold.PIECE_ROWS`).
PIECE_ROWS = _fold.PIECE_ROWS
#: The most bytes of blocks a reduce task holds in memory (see
#: :data:`replay.fold.HELD_BYTES`).
HELD_BYTES = _fold.HELD_BYTES

class Plan:
    """What the fold needs to know from the census: each stream's number (``sid``), each
    pump's clock offset, the pieces of the streams, and the bins."""

    def __init__(self, census: Census) -> None:
        self.sids = census.sid_of
        self.offsets = census.offsets
        self.pieces = _fold.Pieces(census.loads, census.lows, census.highs, PIECE_ROWS)
        self.start = census.start
        self.width = bin_width(census.duration)
        self.options: dict[str, Any] = {"start": self.start, "width": self.width,
                        "per_second": self.width > 1.0, "fine_per_decade": FINE_PER_DECADE,
                        "buckets_per_decade": BUCKETS_PER_DECADE, "held_bytes": HELD_BYTES}


class Engine(Protocol):
    """What :func:`analyze` asks of the engine that reads the traces: passes over every
    row (a table of them at a time, :mod:`replay.fold`'s work), and the listings."""

    #: "local" or "spark"
    name: str

    def census(self) -> list[dict[str, Any]]:
        """:func:`replay.fold.census` of every table of trace rows, added up
        (:func:`replay.fold.merge_census`)."""

    def other_versions(self) -> list[tuple[str, int]]:
        """(file, version) of the rows of another schema version, sorted, up to 100."""

    def corrupt_lines(self) -> list[dict[str, Any]]:
        """File, line (from 1) and text (up to 200 characters) of the first corrupt lines
        of the JSON Lines traces (up to 1,000), in file and line order."""

    def fold(self, plan: Plan) -> list[dict[str, Any]]:
        """The rows of :func:`replay.fold.fold` over every message row, routed by
        :func:`replay.fold.route` as ``plan`` says, but for the listed ones
        (:data:`replay.fold.LISTED`): those stay with the engine for :meth:`listing`."""

    def listing(self, work: Callable[..., Any], args: tuple[Any, ...], schema: Any,
                extra: list[tuple[Any, ...]], count: int, out: str | None, name: str
                ) -> tuple[list[dict[str, Any]], bool]:
        """``work(table, *args)`` over the listed rows of the last :meth:`fold` (an Arrow table of
        :data:`replay.fold.FOLDED` rows to one of ``schema``), with the rows ``extra``,
        sorted by every column (nulls first); the rows (or, when ``count`` is large and
        ``out`` given, the first :data:`replay.measure.SUMMARY_LIMIT`) and whether the engine wrote
        the table ``out/name`` itself."""

    def stage(self, what: str) -> None:
        """Tell the caller the analysis's stage."""

    def jobs(self) -> int:
        """Spark jobs run so far for this analysis (0 for the local engine)."""

    def close(self) -> None:
        """Release what the passes held (a Spark local checkpoint, tables in memory)."""


def measure(engine: Engine, census: Census, out: str | None) -> dict[str, Any]:
    """Every figure that needs the messages, from the fold of every piece of every stream.

    Each piece of a stream (:class:`replay.fold.Pieces`: the whole stream, or a range of
    seqs of one over :data:`PIECE_ROWS` rows) is folded whole (:func:`replay.fold.fold`);
    FIFO where two pieces meet is checked here (:func:`replay.fold.across_pieces`).  Each
    message counts in a few groups at once, told apart by ``part``: its stream and time
    bin (the per-link figures and the plots), its stream and second (when bins are wider
    than a second), its stream and fine latency bucket (the percentiles), its latency and
    size bucket (the histograms), and, for a message that broke an invariant or was
    never delivered, its own row (the listings, which stay with the engine).  The
    percentiles come from the latency buckets: each the largest latency of the bucket the
    percentile falls in, at most 0.23 % above the exact percentile (see
    :data:`FINE_PER_DECADE`).
    """
    plan = Plan(census)
    engine.stage("every figure of every link and direction (one aggregation)")
    small = engine.fold(plan)
    found: dict[str, Any] = {"bin_width": plan.width}
    by_part: dict[int, list[Any]] = {p: [] for p in (_BIN, _SECOND, _LATENCY, _HISTOGRAM,
                                                     _FIRST, _LAST)}
    for r in small:
        by_part[r["part"]].append(r)
    quantiles = _quantiles(by_part[_LATENCY], census)
    found["streams"] = _stream_rows(by_part[_BIN], quantiles, census)
    # FIFO across the pieces of long streams: one violation for each pair out of order
    across = [(*census.sids[sid], late, "out of order", f"delivered after seq {seq}")
              for sid, late, seq in _fold.across_pieces(by_part[_FIRST] + by_part[_LAST])]
    late = Counter(a[:3] for a in across)
    for r in found["streams"]:
        r["out of order"] += late[(r["run"], r["link"], r["dir"])]
    found["overall"] = _overall_row(by_part[_BIN], quantiles.get(None), census)
    found["runs"] = {run: _overall_row([r for r in by_part[_BIN]
                                        if census.stream_of(r)[0] == run],
                                       quantiles.get((run,)), census)
                     for run in census.run_durations}

    found["bins"] = _binned(by_part[_BIN], census)
    found["per_second"] = None if plan.width <= 1.0 else _binned(by_part[_SECOND], census)
    found["histogram"] = [{"latency_bucket": r["k1"], "size_bucket": r["k2"],
                           "journeys": r["journeys"], "messages": r["messages"],
                           "bytes": r["bytes"]} for r in by_part[_HISTOGRAM]]
    _listings(engine, census, found, across, out)
    return found


def _binned(rows: list[Any], census: Census) -> list[dict[str, Any]]:
    return [{**dict(zip(_STREAM, census.stream_of(r), strict=True)), "bin": r["k1"],
             "messages": r["journeys"], "bytes": r["delivered_bytes"]}
            for r in rows if r["k1"] is not None]


def _listings(engine: Engine, census: Census, found: dict[str, Any], across: list[Any],
              out: str | None) -> None:
    """The violations and the undelivered messages, each listed by the engine (rows, or
    a frame written to ``out``) when there is any."""
    streams = found["streams"]
    violation_count = sum(sum(r[name] for name in _fold.VIOLATIONS) for r in streams)
    undelivered_count = sum(r["undelivered"] for r in streams)
    found["violation_count"], found["undelivered_count"] = violation_count, undelivered_count
    found["violations"] = found["undelivered"] = []
    found["violations_frame"] = found["undelivered_frame"] = False
    names = census.sids
    if violation_count:
        engine.stage("listing the violations")
        found["violations"], found["violations_frame"] = engine.listing(
            _fold.violations, (names,), _fold.VIOLATION_ROWS, across, violation_count, out,
            "violations")
    if undelivered_count:
        engine.stage("listing undelivered messages and their causes")
        ends = census.stream_ends()
        found["undelivered"], found["undelivered_frame"] = engine.listing(
            _fold.undelivered, (names, ends), _fold.UNDELIVERED_ROWS, [], undelivered_count,
            out, "undelivered")


def _quantiles(latency: list[Any], census: Census
               ) -> dict[tuple[str | None, ...] | None, list[float]]:
    """The percentiles of each stream's latency, of every latency but the name service's
    (key None) and of each run's (key ``(run,)``), from the fine latency buckets: the
    largest latency of the bucket where each percentile's rank falls (ranks counted from
    1, the rank of q being ceil(q n))."""
    # per stream, and over the run: each bucket's count and largest latency (a stream's
    # bucket comes in a row from each of its pieces)
    cells: dict[tuple[str | None, ...] | None, dict[int, list[Any]]] = {}
    for r in latency:
        stream = census.stream_of(r)
        for key in ((stream, None, (stream[0],)) if stream[:2] not in census.service_links
                    else (stream,)):
            cell = cells.setdefault(key, {}).setdefault(r["k1"], [0, r["max"]])
            cell[0] += r["journeys"]
            cell[1] = max(cell[1], r["max"])
    return {key: _fold.quantile_of([(k, n, m) for k, (n, m) in buckets.items()], QUANTILES)
            for key, buckets in cells.items()}


def _stream_rows(bins: list[Any], quantiles: dict[Any, list[float]], census: Census
                 ) -> list[dict[str, Any]]:
    """Per stream: messages matched, latency percentiles and max, undelivered messages
    and the count of each violation."""
    sums: dict[tuple[str, str, str], dict[str, Any]] = {}
    for r in bins:
        key = census.stream_of(r)
        s = sums.setdefault(key, {"run": key[0], "link": key[1], "dir": key[2],
                                  "messages": 0, "max": None, "undelivered": 0,
                                  **{name: 0 for name in _fold.VIOLATIONS}})
        s["messages"] += r["journeys"]
        if r["max"] is not None:
            s["max"] = r["max"] if s["max"] is None else max(s["max"], r["max"])
        for name in ("undelivered", *_fold.VIOLATIONS):
            s[name] += r[name]
    for key, s in sums.items():
        s["q"] = quantiles.get(key)
    return list(sums.values())


def _overall_row(bins: list[Any], q: list[float] | None, census: Census) -> dict[str, Any]:
    """Every latency but the name service's: count, percentiles, max, first and last."""
    mine = [r for r in bins if r["journeys"]
            and census.stream_of(r)[:2] not in census.service_links]
    return {"n": sum(r["journeys"] for r in mine), "q": q,
            "max": max((r["max"] for r in mine), default=None),
            "first": min((r["first"] for r in mine), default=None),
            "last": max((r["last"] for r in mine), default=None)}


def bin_width(duration: float) -> float:
    """A round bin width (1, 2 or 5 times a power of ten) that cuts the run into at most
    :data:`PLOT_BINS` bins; below a second, a whole number of bins makes a second."""
    target = max(duration / PLOT_BINS, 1e-6)
    exponent = math.floor(math.log10(target))
    for step in (1, 2, 5, 10):
        width = step * 10.0 ** exponent
        if width >= target * (1 - 1e-9):
            return float(f"{width:.12g}")
    raise AssertionError("unreachable")
