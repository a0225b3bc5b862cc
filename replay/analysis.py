"""The replay's analysis, whatever runs it: check and measure pump traces.

:func:`analyze` takes an engine that does the work over the trace rows, and does the
rest itself: it adds up the census, cuts long streams into pieces, turns the folded
figures into the summary, the tables and the plots.  Two engines do the same work with
the same code (:mod:`replay.fold`, on Arrow tables): :class:`replay.local.Local` in this
process, for traces that fit in memory, and :class:`replay.job.Spark` on a Spark
session, local or a cluster.  Nothing here imports pyspark.

Checks: every delivered message was sent; FIFO per link and direction (a delivery with a
lower sequence number than the one before it); no duplicate send or delivery; every
delivery has its send's size.  Each sent message that was never delivered is listed with
its cause: ``peer failed`` (a task of the link failed, or it ended on an error), ``link
closed with it in flight``, or ``run ended``.

Output in OUT: Parquet tables (``links``, ``violations``, ``undelivered``, ``latency``,
``throughput``, ``refusals``, ``sizes``, ``latency_histogram``), ``summary.json`` (counts,
the violations and undelivered messages, up to a limit), and the plots ``throughput.png``
(messages delivered per broker over the run), ``latency.png`` (a histogram of delivery
latency) and ``links.png`` (the life of the first links).
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

try:
    from pump import RdvpumpError
    from pump import schema as _schema
    from replay import fold as _fold
    from replay import plots as _plots
except ImportError:  # spark-submit of a checkout without rdvpump: replay/job.py loaded them

    class RdvpumpError(Exception):  # type: ignore[no-redef]
        """Stands in for pump.RdvpumpError where rdvpump is not installed."""

    _schema = sys.modules["rdvpump_trace_schema"]
    _fold = sys.modules["rdvpump_replay_fold"]
    _plots = sys.modules["rdvpump_replay_plots"]

#: The trace schema version this job reads (pump/schema.py is the one definition).
SCHEMA_VERSION: int = _schema.SCHEMA_VERSION
Kind, Outcome, Cause = _schema.Kind, _schema.Outcome, _schema.Cause
MESSAGE_KINDS = _schema.MESSAGE_KINDS

_OLDER = ("; traces of an older schema are not read (version 2 kept the monotonic clock in "
          "'reason' and named disconnects 'error'): record the run again with this rdvpump")

#: Violations and undelivered messages listed in summary.json (all are in Parquet).
SUMMARY_LIMIT = 100


class TraceError(RdvpumpError, ValueError):
    """The traces cannot be analysed (missing, empty, another schema version)."""



# -- reading ------------------------------------------------------------------------------

def find_traces(traces: str) -> tuple[list[str], list[str]]:
    """The JSON Lines and Parquet files of a trace directory (or one trace file)."""
    path = Path(traces)
    if not path.exists():
        raise TraceError(f"no such trace directory: {traces}")
    files = [path] if path.is_file() else sorted(p for p in path.iterdir() if p.is_file())
    jsonl = [str(p) for p in files if p.suffix == ".jsonl"]
    parquet = [str(p) for p in files if p.suffix == ".parquet"]
    if not jsonl and not parquet:
        raise TraceError(f"no trace files (*.jsonl, *.parquet) in {traces}")
    return jsonl, parquet


def check_traces(traces: str) -> tuple[list[str], list[str]]:
    """:func:`find_traces`, and each Parquet trace readable with the trace's columns (from
    its footer: no rows are read), so that what is no trace is said before a JVM
    starts."""
    jsonl, parquet = find_traces(traces)
    for path in parquet:
        parquet_metadata(path)
    return jsonl, parquet


def parquet_metadata(path: str) -> Any:
    """The footer of a Parquet trace; :class:`TraceError` if pyarrow cannot read it or it
    lacks a column of the trace's schema (an older schema says which version it has)."""
    import pyarrow.parquet as pq

    try:
        meta = pq.ParquetFile(path).metadata
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several kinds
        raise TraceError(f"cannot read the Parquet trace {path}: {exc}") from None
    have = set(meta.schema.names)
    missing = [name for name, _ in _schema.COLUMNS if name not in have]
    if missing:
        import pyarrow.compute as pc

        found = [] if "v" not in have else pc.unique(
            pq.read_table(path, columns=["v"]).column("v")).drop_null().to_pylist()
        raise TraceError(lacking(missing, found))
    return meta


def lacking(missing: list[str], found: list[Any]) -> str:
    """The error for Parquet traces without the columns ``missing`` (``found``: the
    schema versions they hold)."""
    return (f"Parquet traces lack the columns {', '.join(missing)}: trace schema version "
            f"{SCHEMA_VERSION} expected, found "
            f"{', '.join(map(str, sorted(found))) or 'none'}{_OLDER}")



# -- analysis -----------------------------------------------------------------------------

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
# the parts of the fold's result (_measure)
_BIN, _SECOND, _LATENCY, _HISTOGRAM = _fold.BIN, _fold.SECOND, _fold.LATENCY, _fold.HISTOGRAM
_FIRST, _LAST = _fold.FIRST, _fold.LAST
#: The most rows of a stream folded at once (see :data:`replay.fold.PIECE_ROWS`).
PIECE_ROWS = _fold.PIECE_ROWS
#: The most bytes of blocks a reduce task holds in memory (see
#: :data:`replay.fold.HELD_BYTES`).
HELD_BYTES = _fold.HELD_BYTES

#: Traces smaller than this on disk (JSON Lines, Parquet: about 400,000 events either way)
#: are analysed in this process by default (``engine_for``), larger ones on Spark.
LOCAL_BYTES = {"jsonl": 64 << 20, "parquet": 8 << 20}


def under(traces: str, limits: dict[str, int]) -> bool:
    """Whether the traces are smaller than ``limits`` (bytes on disk per format, JSON
    Lines and Parquet each counting for their share)."""
    import os

    jsonl, parquet = find_traces(traces)
    share = (sum(os.path.getsize(f) for f in jsonl) / limits["jsonl"]
             + sum(os.path.getsize(f) for f in parquet) / limits["parquet"])
    return share < 1


def engine_for(traces: str) -> str:
    """"local" for traces under :data:`LOCAL_BYTES`, else "spark"."""
    return "local" if under(traces, LOCAL_BYTES) else "spark"


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
        ``out`` given, the first :data:`SUMMARY_LIMIT`) and whether the engine wrote
        the table ``out/name`` itself."""

    def stage(self, what: str) -> None:
        """Tell the caller the analysis's stage."""

    def jobs(self) -> int:
        """Spark jobs run so far for this analysis (0 for the local engine)."""

    def close(self) -> None:
        """Release what the passes held (a Spark local checkpoint, tables in memory)."""


class Plan:
    """What the fold needs to know from the census: each stream's number (``sid``), each
    pump's clock offset, the pieces of the streams, and the bins."""

    def __init__(self, census: _Census) -> None:
        self.sids = census.sid_of
        self.offsets = census.offsets
        self.pieces = _fold.Pieces(census.loads, census.lows, census.highs, PIECE_ROWS)
        self.start = census.start
        self.width = _bin_width(census.duration)
        self.options: dict[str, Any] = {"start": self.start, "width": self.width,
                        "per_second": self.width > 1.0, "fine_per_decade": FINE_PER_DECADE,
                        "buckets_per_decade": BUCKETS_PER_DECADE, "held_bytes": HELD_BYTES}


def analyze(traces: str, out: str | None = None, *, spark: Any = None,
            progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Check and measure the traces; write the tables and plots to ``out`` if given.

    ``spark`` None runs the analysis in this process (:class:`replay.local.Local`), a
    SparkSession runs it there (:class:`replay.job.Spark`); the results are the same.
    Two passes over the traces, the work of each done on Arrow tables by
    :mod:`replay.fold`:

    1. a census of the events (counts and times per pump, kind, stream and link event;
       small), added up here;
    2. the message rows of each stream (run, link, dir) brought together, cut into
       pieces (the whole stream, or a range of seqs of a long one); each piece folded
       into one row per sequence number, FIFO checked in seq order, and every message
       counted in its groups (per-link figures, time bins, latency buckets, histograms,
       and the messages to list: :func:`_measure`); FIFO where pieces meet is checked
       here.

    ``progress`` is told each stage; ``summary["engine"]`` names the engine and
    ``summary["spark_jobs"]`` counts the Spark jobs.
    """
    if spark is None:
        from replay.local import Local

        return run(Local(traces, progress), traces, out)
    from replay.job import Spark

    return run(Spark(spark, traces, progress), traces, out)


def run(engine: Engine, traces: str, out: str | None = None) -> dict[str, Any]:
    """:func:`analyze` with ``engine``."""
    if out is not None:  # the imports of the writers, while the engine works
        threading.Thread(target=_import_writers, daemon=True).start()
    try:
        engine.stage("census of the events")
        census = _Census(engine.census())
        census.check(engine, traces)
        corrupt: list[dict[str, Any]] = []
        if census.corrupt:
            engine.stage("locating corrupt lines")
            corrupt = engine.corrupt_lines()
        engine.stage("matching sends and deliveries (one pass by link and direction)")
        found = _measure(engine, census, out)
        summary = _summary(traces, census, corrupt, found)
        if out is not None:
            engine.stage("writing tables and plots")
            _write(Path(out), census, found, summary)
        summary["engine"] = engine.name
        summary["spark_jobs"] = engine.jobs()
        if out is not None:
            Path(out, "summary.json").write_text(json.dumps(summary, indent=2, default=str)
                                                 + "\n")
        return summary
    finally:
        engine.close()


def _import_writers() -> None:
    import matplotlib.backends.backend_agg  # noqa: F401
    import matplotlib.figure  # noqa: F401
    import pyarrow.parquet  # noqa: F401


def _measure(engine: Engine, census: _Census, out: str | None) -> dict[str, Any]:
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

    def binned(rows: list[Any]) -> list[dict[str, Any]]:
        return [{**dict(zip(_STREAM, census.stream_of(r), strict=True)), "bin": r["k1"],
                 "messages": r["journeys"], "bytes": r["delivered_bytes"]}
                for r in rows if r["k1"] is not None]

    found["bins"] = binned(by_part[_BIN])
    found["per_second"] = None if plan.width <= 1.0 else binned(by_part[_SECOND])
    found["histogram"] = [{"latency_bucket": r["k1"], "size_bucket": r["k2"],
                           "journeys": r["journeys"], "messages": r["messages"],
                           "bytes": r["bytes"]} for r in by_part[_HISTOGRAM]]
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
    return found


def _quantiles(latency: list[Any], census: _Census
               ) -> dict[tuple[str, str, str] | None, list[float]]:
    """The percentiles of each stream's latency, and (key None) of every latency but the
    name service's, from the fine latency buckets: the largest latency of the bucket
    where each percentile's rank falls (ranks counted from 1, the rank of q being
    ceil(q n))."""
    # per stream, and over the run: each bucket's count and largest latency (a stream's
    # bucket comes in a row from each of its pieces)
    cells: dict[tuple[str, str, str] | None, dict[int, list[Any]]] = {}
    for r in latency:
        stream = census.stream_of(r)
        for key in (stream, None) if stream[:2] not in census.service_links else (stream,):
            cell = cells.setdefault(key, {}).setdefault(r["k1"], [0, r["max"]])
            cell[0] += r["journeys"]
            cell[1] = max(cell[1], r["max"])
    return {key: _fold.quantile_of([(k, n, m) for k, (n, m) in buckets.items()], QUANTILES)
            for key, buckets in cells.items()}


def _stream_rows(bins: list[Any], quantiles: dict[Any, list[float]], census: _Census
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


def _overall_row(bins: list[Any], q: list[float] | None, census: _Census) -> dict[str, Any]:
    """Every latency but the name service's: count, percentiles, max, first and last."""
    mine = [r for r in bins if r["journeys"]
            and census.stream_of(r)[:2] not in census.service_links]
    return {"n": sum(r["journeys"] for r in mine), "q": q,
            "max": max((r["max"] for r in mine), default=None),
            "first": min((r["first"] for r in mine), default=None),
            "last": max((r["last"] for r in mine), default=None)}



def _service(*brokers: str | None) -> bool:
    """The name service's own brokers (the manager, a process's name client, trackers)
    have ids that start with "@"; a link with one at either end is theirs."""
    return any(b is not None and b.startswith("@") for b in brokers)


def _bin_width(duration: float) -> float:
    """A round bin width (1, 2 or 5 times a power of ten) that cuts the run into at most
    :data:`PLOT_BINS` bins; below a second, a whole number of bins makes a second."""
    target = max(duration / PLOT_BINS, 1e-6)
    exponent = math.floor(math.log10(target))
    for step in (1, 2, 5, 10):
        width = step * 10.0 ** exponent
        if width >= target * (1 - 1e-9):
            return float(f"{width:.12g}")
    raise AssertionError("unreachable")



class _Census:
    """What the census aggregation says, in the driver: files, pumps, clocks, streams,
    the life of every link, refusals."""

    def __init__(self, rows: list[Any]) -> None:
        good = [r for r in rows if not r["bad"]]
        self.corrupt = sum(r["n"] for r in rows if r["bad"])
        self.versions = sorted({r["v"] for r in good})
        self.kinds: dict[str, int] = {}
        for r in good:
            self.kinds[r["kind"]] = self.kinds.get(r["kind"], 0) + r["n"]
        self.pumps = sorted({r["pump"] for r in good if r["pump"] is not None})
        self.runs = sorted({r["run"] for r in good if r["run"] is not None})
        # The last clock event of each served pump maps its time to the machine's
        # monotonic clock; pumps without one keep their own time.
        latest: dict[tuple[str, str], tuple[float, float]] = {}
        for r in good:
            if r["kind"] == Kind.CLOCK and r["clock"] is not None:
                key = (r["run"], r["pump"])
                if key not in latest or (r["t1"], r["clock"]) > latest[key]:
                    latest[key] = (r["t1"], r["clock"])
        self.offsets = {key: clock for key, (_, clock) in latest.items()}
        shifted = [(r["t0"] + self.offset(r), r["t1"] + self.offset(r)) for r in good
                   if r["t0"] is not None]
        self.start = min((a for a, _ in shifted), default=0.0)
        self.duration = max((b for _, b in shifted), default=0.0) - self.start
        self.refusals: dict[str, int] = {}
        self.service_refusals: dict[str, int] = {}
        for r in good:
            if r["kind"] == Kind.REFUSE and r["outcome"] != Outcome.INBOUND:
                reason = r["reason"] or "?"
                into = self.service_refusals if _service(r["broker"], r["peer"]) \
                    else self.refusals
                into[reason] = into.get(reason, 0) + r["n"]
        self.streams: dict[tuple[str, str, str], dict[str, Any]] = {}
        #: Each stream (run, link, dir) of the messages by its number (``sid``), and its
        #: messages (rows) and least and greatest seq, for the fold's pieces.
        seen: dict[tuple[str, str, str], list[Any]] = {}
        for r in good:
            if r["kind"] in MESSAGE_KINDS:
                cell = seen.setdefault((r["run"], r["link"], r["dir"]), [0, None, None])
                cell[0] += r["n"]
                cell[1] = _fold.smaller(cell[1], r["min_seq"])
                cell[2] = _fold.larger(cell[2], r["max_seq"])
        ordered = sorted(seen, key=lambda s: tuple((x is not None, x or "") for x in s))
        self.sids: dict[int, tuple[str, str, str]] = dict(enumerate(ordered))
        self.sid_of = {stream: sid for sid, stream in self.sids.items()}
        self.loads, self.lows, self.highs = ([seen[stream][i] for stream in ordered]
                                             for i in range(3))
        self.links: dict[tuple[str, str], dict[str, Any]] = {}
        for r in sorted(good, key=lambda r: (r["t0"] + self.offset(r), str(r["reason"]))):
            if r["link"] is None:
                continue
            link = self.links.setdefault((r["run"], r["link"]), _new_link())
            link["pumps"].add(r["pump"])
            if r["kind"] in MESSAGE_KINDS:
                self._message(r, link)
            else:
                self._life(r, link)
        self._connects(good)
        self.service_links = {key for key, life in self.links.items() if _service(
            life["acceptor"] or key[1].rsplit("/", 1)[0], life["connector"])}
        sends = [r for r in good if r["kind"] == Kind.SEND]
        self.sent_sizes = None if not sends else {
            "min": min(r["min_size"] for r in sends),
            "mean": sum(r["bytes"] for r in sends) / sum(r["n"] for r in sends),
            "max": max(r["max_size"] for r in sends)}

    def stream_of(self, row: Any) -> tuple[str, str, str]:
        """(run, link, dir) of a row of the fold, keyed by ``sid``."""
        return self.sids[row["sid"]]

    def offset(self, row: Any) -> float:
        return self.offsets.get((row["run"], row["pump"]), 0.0)

    def _message(self, r: Any, link: dict[str, Any]) -> None:
        stream = self.streams.setdefault((r["run"], r["link"], r["dir"]), {
            "sender": None, "receiver": None, "send_pumps": set(), "deliver_pumps": set(),
            "sent": 0, "delivered": 0})
        stream["sent" if r["kind"] == Kind.SEND else "delivered"] += r["n"]
        if r["kind"] == Kind.SEND:
            stream["sender"] = min(filter(None, (stream["sender"], r["broker"])), default=None)
            stream["send_pumps"].add(r["pump"])
            if r["dir"] in ("ca", "ac"):  # the links table counts the two directions
                link["sent_" + r["dir"]] += r["n"]
        else:
            stream["receiver"] = min(filter(None, (stream["receiver"], r["broker"])),
                                     default=None)
            stream["deliver_pumps"].add(r["pump"])
            link["delivered"] += r["n"]
            link["bytes_delivered"] += r["bytes"] or 0

    def _connects(self, good: list[Any]) -> None:
        """Each accepted link's connect: the connector's last connect to that broker and
        port at or before the accept."""
        tried: dict[tuple[str, str, str, int], list[float]] = {}
        for r in good:
            if r["kind"] == Kind.CONNECT and r["connect_time"] is not None:
                tried.setdefault((r["run"], r["broker"], r["peer"], r["port"]), []).append(
                    r["connect_time"] + self.offset(r))
        for (run, _), link in self.links.items():
            if link["accepted_at"] is None:
                continue
            times = tried.get((run, link["connector"], link["acceptor"], link["port"]), [])
            before = [t for t in times if t <= link["accepted_at"]]
            link["connected_at"] = max(before) if before else None

    def _life(self, r: Any, link: dict[str, Any]) -> None:
        """Rows come in time order (then by reason): the first one seen wins."""
        at = r["t0"] + self.offset(r)
        kind = r["kind"]
        if kind == Kind.ACCEPT and link["accepted_at"] is None:
            link.update(accepted_at=at, acceptor=r["broker"], connector=r["peer"],
                        port=r["port"])
        if kind == Kind.DISCONNECT and link["disconnected_at"] is None:
            link.update(disconnected_at=at, disconnect_reason=r["reason"])
        if kind == Kind.CLOSE and r["reason"] is not None:
            link["close_reasons"].add(r["reason"])
        if kind in _schema.END_KINDS:
            link["ended_at"] = at if link["ended_at"] is None else link["ended_at"]
            if link["end_reason"] is None:
                link["end_reason"] = r["reason"]
            if kind in (Kind.FAIL, Kind.PROTOCOL_ERROR) or (
                    kind == Kind.DISCONNECT and r["outcome"] != Outcome.CLEAN):
                link["failed"] = True

    def check(self, engine: Engine, traces: str) -> None:
        """Raise :class:`TraceError` for rows of another schema version (naming their
        files: a second pass, only then) or for no events at all."""
        if any(v != SCHEMA_VERSION for v in self.versions):
            other = engine.other_versions()
            listing = "; ".join(f"{f} has version {v}" for f, v in other[:5])
            raise TraceError(f"trace schema version {SCHEMA_VERSION} expected: {listing}"
                             + (_OLDER if any(v < SCHEMA_VERSION for _, v in other) else ""))
        if not self.kinds:
            if self.corrupt:
                raise TraceError(f"no trace events in {traces}: none of its {self.corrupt} "
                                 "lines is a trace row (a JSON object with 'v', 'kind' and "
                                 "the fields of pump/schema.py); is it a trace?")
            raise TraceError(f"the traces in {traces} hold no events")

    def cause(self, run: str, link: str) -> tuple[str, str | None]:
        """Why a message sent on this link may not have arrived, and the link's end."""
        life = self.links.get((run, link))
        if life is not None and life["failed"]:
            return Cause.PEER_FAILED, life["end_reason"]
        if life is not None and life["end_reason"] is not None:
            return Cause.IN_FLIGHT, life["end_reason"]
        return Cause.RUN_ENDED, None

    def stream_ends(self) -> dict[int, tuple[str | None, str, str | None, bool]]:
        """Each stream's sender, the cause of an undelivered message on it, the end of its
        link and whether the link is the name service's, by ``sid``."""
        return {self.sid_of[(run, link, d)]: (s["sender"], *self.cause(run, link),
                                              (run, link) in self.service_links)
                for (run, link, d), s in self.streams.items() if (run, link, d) in self.sid_of}

    def crosses_pumps(self, key: tuple[str, str, str]) -> bool:
        s = self.streams.get(key)
        return s is not None and bool(s["send_pumps"]) and bool(s["deliver_pumps"]) \
            and s["send_pumps"] != s["deliver_pumps"]


def _new_link() -> dict[str, Any]:
    return {"connected_at": None, "accepted_at": None, "acceptor": None, "connector": None,
            "port": None,
            "sent_ca": 0, "sent_ac": 0, "delivered": 0, "bytes_delivered": 0,
            "disconnected_at": None, "disconnect_reason": None, "close_reasons": set(),
            "ended_at": None, "end_reason": None, "failed": False, "pumps": set()}


def _summary(traces: str, census: _Census, corrupt: list[dict[str, Any]],
             found: dict[str, Any]) -> dict[str, Any]:
    overall = found["overall"]
    by_type = {name: sum(r[name] for r in found["streams"]) for name in _fold.VIOLATIONS}
    by_cause: dict[str, int] = {}
    across = 0
    mine = {"sent": 0, "delivered": 0, "matched": 0}
    service = {"links": len(census.service_links), "messages_sent": 0,
               "messages_delivered": 0, "undelivered": 0,
               "refusals": dict(sorted(census.service_refusals.items()))}
    for (run, link, _), stream in census.streams.items():
        if (run, link) in census.service_links:
            service["messages_sent"] += stream["sent"]
            service["messages_delivered"] += stream["delivered"]
        else:
            mine["sent"] += stream["sent"]
            mine["delivered"] += stream["delivered"]
    for r in found["streams"]:
        key = (r["run"], r["link"], r["dir"])
        if (r["run"], r["link"]) in census.service_links:
            service["undelivered"] += r["undelivered"]
            continue
        mine["matched"] += r["messages"]
        if r["undelivered"]:
            cause = census.cause(r["run"], r["link"])[0]
            by_cause[cause] = by_cause.get(cause, 0) + r["undelivered"]
        if census.crosses_pumps(key):
            across += r["messages"]
    n = overall["n"] if overall is not None else 0
    return {
        "schema_version": SCHEMA_VERSION,
        "traces": traces,
        "files": sum(map(len, find_traces(traces))),
        "pumps": census.pumps,
        "runs": census.runs,
        "events": sum(census.kinds.values()),
        "events_by_kind": dict(sorted(census.kinds.items())),
        "corrupt_lines": corrupt[:SUMMARY_LIMIT],
        "corrupt_line_count": census.corrupt,
        "links": len(census.links) - len(census.service_links),
        "messages_sent": mine["sent"],
        "messages_delivered": mine["delivered"],
        "messages_matched": mine["matched"],
        "messages_across_pumps": across,
        "violation_count": found["violation_count"],
        "violations_by_type": {k: v for k, v in by_type.items() if v},
        "violations": found["violations"][:SUMMARY_LIMIT],
        "undelivered_count": sum(by_cause.values()),
        "undelivered_by_cause": dict(sorted(by_cause.items())),
        "undelivered": [u for u in found["undelivered"] if not u["service"]][:SUMMARY_LIMIT],
        "latency_s": None if not n else {
            "p50": overall["q"][0], "p90": overall["q"][1], "p99": overall["q"][2],
            "max": overall["max"]},
        "delivered_per_s": (n / (overall["last"] - overall["first"])
                            if n and overall["last"] > overall["first"] else None),
        "refusals": dict(sorted(census.refusals.items())),
        "name_service": service,
        "message_size": census.sent_sizes,
        "duration_s": census.duration,
        "bin_width_s": found["bin_width"],
    }


def _tables(census: _Census, found: dict[str, Any]) -> dict[str, Any]:
    """The output tables the driver writes, as pyarrow tables."""
    import pyarrow as pa

    def table(rows: list[dict[str, Any]], schema: str) -> Any:
        fields = [f.split(":") for f in schema.split()]
        types = {"s": pa.string(), "i": pa.int64(), "f": pa.float64(), "b": pa.bool_(),
                 "ls": pa.list_(pa.string())}
        arrow = pa.schema([(name, types[t]) for name, t in fields])
        return pa.Table.from_pylist(rows, schema=arrow)

    links = [{"run": run, "link": link, "service": (run, link) in census.service_links,
              **{k: sorted(v) if isinstance(v, set) else v for k, v in life.items()}}
             for (run, link), life in sorted(census.links.items())]
    latency = []
    for r in sorted(found["streams"], key=lambda r: (r["run"], r["link"], r["dir"])):
        s = census.streams.get((r["run"], r["link"], r["dir"]), {})
        q = r["q"] or [None, None, None]
        latency.append({"run": r["run"], "link": r["link"], "dir": r["dir"],
                        "sender": s.get("sender"), "receiver": s.get("receiver"),
                        "messages": r["messages"], "p50": q[0], "p90": q[1], "p99": q[2],
                        "max": r["max"]})
    tables = {
        "links": table(links, "run:s link:s service:b connected_at:f accepted_at:f acceptor:s "
                              "connector:s port:i "
                              "sent_ca:i sent_ac:i delivered:i bytes_delivered:i "
                              "disconnected_at:f disconnect_reason:s close_reasons:ls "
                              "ended_at:f end_reason:s failed:b pumps:ls"),
        "latency": table(latency, "run:s link:s dir:s sender:s receiver:s messages:i p50:f "
                                  "p90:f p99:f max:f"),
        "throughput": table(_per_second(census, found),
                            "run:s broker:s second:i messages:i bytes:i"),
        "refusals": table([{"reason": k, "count": v} for k, v in census.refusals.items()],
                          "reason:s count:i"),
        "sizes": table(_sizes(found), "bucket:i messages:i bytes:i"),
        "latency_histogram": table(_latency_histogram(found), "low_s:f high_s:f messages:i"),
    }
    if not found["violations_frame"]:
        tables["violations"] = table(found["violations"],
                                     "run:s link:s dir:s seq:i violation:s detail:s")
    if not found["undelivered_frame"]:
        tables["undelivered"] = table(found["undelivered"],
                                      "run:s link:s dir:s seq:i sender:s sent_at:f size:i "
                                      "cause:s end_reason:s service:b")
    return tables


def _per_second(census: _Census, found: dict[str, Any]) -> list[dict[str, Any]]:
    """Messages and bytes delivered per receiving broker and second of the run."""
    width = found["bin_width"]
    rows, per = (found["bins"], round(1 / width)) if found["per_second"] is None \
        else (found["per_second"], 1)
    sums: dict[tuple[str, str, int], list[int]] = {}
    for r in rows:
        receiver = census.streams.get((r["run"], r["link"], r["dir"]), {}).get("receiver")
        cell = sums.setdefault((r["run"], receiver or "?", r["bin"] // per), [0, 0])
        cell[0] += r["messages"]
        cell[1] += r["bytes"] or 0
    return [{"run": run, "broker": broker, "second": second, "messages": m, "bytes": b}
            for (run, broker, second), (m, b) in sorted(sums.items())]


def _sizes(found: dict[str, Any]) -> list[dict[str, Any]]:
    sums: dict[int, list[int]] = {}
    for r in found["histogram"]:
        if r["messages"]:
            cell = sums.setdefault(r["size_bucket"], [0, 0])
            cell[0] += r["messages"]
            cell[1] += r["bytes"] or 0
    return [{"bucket": k, "messages": m, "bytes": b} for k, (m, b) in sorted(sums.items())]


def _latency_histogram(found: dict[str, Any]) -> list[dict[str, Any]]:
    counts: dict[int, int] = {}
    for r in found["histogram"]:
        if r["journeys"]:
            counts[r["latency_bucket"]] = counts.get(r["latency_bucket"], 0) + r["journeys"]
    return [{"low_s": 10 ** (b / BUCKETS_PER_DECADE), "high_s": 10 ** ((b + 1)
                                                                    / BUCKETS_PER_DECADE),
             "messages": n} for b, n in sorted(counts.items())]


def _write(target: Path, census: _Census, found: dict[str, Any],
           summary: dict[str, Any]) -> None:
    """The tables (Parquet, a directory each, as Spark writes them) and the plots."""
    import pyarrow.parquet as pq

    target.mkdir(parents=True, exist_ok=True)
    tables = _tables(census, found)
    for name, table in tables.items():
        folder = target / name
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir()
        pq.write_table(table, folder / "part-00000.parquet")
    title = "run " + ", ".join(census.runs)
    width = found["bin_width"]
    per_broker: dict[str, dict[int, int]] = {}
    per_link: dict[tuple[str, str], dict[int, int]] = {}
    for r in found["bins"]:
        receiver = census.streams.get((r["run"], r["link"], r["dir"]), {}).get("receiver")
        series = per_broker.setdefault(receiver or "?", {})
        series[r["bin"]] = series.get(r["bin"], 0) + r["messages"]
        cells = per_link.setdefault((r["run"], r["link"]), {})
        cells[r["bin"]] = cells.get(r["bin"], 0) + r["messages"]
    _plots.throughput(target / "throughput.png", per_broker, width=width,
                      bins=math.ceil(census.duration / width) + 1,
                      duration=census.duration, title=title)
    _plots.latency(target / "latency.png", _latency_histogram(found),
                   summary["latency_s"], least=_fold.LEAST_LATENCY_S, title=title)
    lives = [{"link": f"{link}" if len(census.runs) == 1 else f"{run}:{link}",
              "start": None if life["accepted_at"] is None
              else life["accepted_at"] - census.start,
              "end": None if life["ended_at"] is None else life["ended_at"] - census.start,
              "connect": None if life["connected_at"] is None
              else life["connected_at"] - census.start,
              "bins": per_link.get((run, link), {})}
             for (run, link), life in census.links.items()]
    _plots.timeline(target / "links.png", lives, width=width, duration=census.duration,
                    title=title)



# -- output ---------------------------------------------------------------------------

def print_summary(summary: dict[str, Any]) -> None:
    """The summary on the terminal: a rich table when rich is there, else plain lines."""
    lat = summary["latency_s"] or {}
    rows = [
        ("trace files / pumps", f"{summary['files']} / {len(summary['pumps'])}"),
        ("events", f"{summary['events']:,}"),
        ("links", f"{summary['links']:,}"),
        ("messages sent / delivered", f"{summary['messages_sent']:,} / "
                                      f"{summary['messages_delivered']:,}"),
        ("delivered in another pump", f"{summary['messages_across_pumps']:,}"),
        ("violations", f"{summary['violation_count']:,}"),
        ("undelivered", ", ".join(f"{k}: {v:,}" for k, v in
                                  summary["undelivered_by_cause"].items()) or "0"),
        ("latency p50 / p90 / p99 / max", " / ".join(
            "-" if lat.get(k) is None else f"{lat[k] * 1e6:,.1f} us"
            for k in ("p50", "p90", "p99", "max"))),
        ("refusals", ", ".join(f"{k}: {v}" for k, v in summary["refusals"].items()) or "0"),
        *([("name service (apart from the above)",
            f"{ns['links']} links, {ns['messages_sent']:,} messages sent, "
            f"{ns['undelivered']} undelivered")] if (ns := summary["name_service"])["links"]
          else []),
        ("corrupt lines", str(summary["corrupt_line_count"])),
    ]
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        for k, v in rows:
            print(f"{k}: {v}")
    else:
        table = Table(title=f"replay of {summary['traces']}")
        table.add_column("what")
        table.add_column("value", justify="right")
        for k, v in rows:
            style = "red" if k == "violations" and summary["violation_count"] else None
            table.add_row(k, v, style=style)
        Console().print(table)
    for v in summary["violations"][:10]:
        print(f"violation: {v['violation']} link {v['link']} dir {v['dir']} seq {v['seq']}: "
              f"{v['detail']}")
    for c in summary["corrupt_lines"][:10]:
        print(f"corrupt line {c['file']}:{c['line']}: {c['text'][:80]}", file=sys.stderr)
