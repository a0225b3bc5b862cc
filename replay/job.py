"""Replay pump traces with Spark: rebuild every link's life and every message's journey.

Runs unchanged under ``spark-submit replay/job.py --traces DIR --out DIR`` on any
cluster (it needs pyspark, and the trace schema: ``pump.schema`` when rdvpump is
installed, else ``pump/schema.py`` beside this file, which needs only the
standard library; ``rich`` is used when present), and as ``rdvpump trace
analyze DIR`` in local mode.  The tasks' work is :mod:`replay.fold`, shipped to the
executors with the tasks; their Python needs pyarrow and numpy.

Input: the trace files of one or many pumps in DIR (``*.jsonl`` and ``*.parquet``,
schema version :data:`SCHEMA_VERSION`, defined in ``pump/schema.py``).  Output in OUT:

- Parquet tables: ``links``, ``violations``, ``undelivered``, ``latency``,
  ``throughput``, ``refusals``, ``sizes``, ``latency_histogram``;
- ``summary.json`` (counts, the violations and undelivered messages, up to a limit);
- ``throughput.png`` (messages delivered per broker over the run), ``latency.png``
  (a histogram of delivery latency) and ``links.png`` (the life of the first links).

Checks: every delivered message was sent; FIFO per link and direction (a
delivery with a lower sequence number than the one before it); no duplicate send
or delivery; every delivery has its send's size.  Each sent message that was never
delivered is listed with its cause: ``peer failed`` (a task of the link failed, or it
ended on an error), ``link closed with it in flight``, or ``run ended``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


def _sibling(module: str, path: str) -> Any:
    """A module of this checkout by its file, for spark-submit without rdvpump installed."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        module, Path(__file__).resolve().parents[1] / path)
    assert spec is not None and spec.loader is not None
    loaded = importlib.util.module_from_spec(spec)
    sys.modules[module] = loaded  # so that it can be pickled by value for the workers
    spec.loader.exec_module(loaded)
    return loaded


try:
    from pump import RdvpumpError
    from pump import schema as _schema
except ImportError:  # spark-submit of a checkout, without rdvpump installed

    class RdvpumpError(Exception):  # type: ignore[no-redef]
        """Stands in for pump.RdvpumpError where rdvpump is not installed."""

    _schema = _sibling("rdvpump_trace_schema", "pump/schema.py")
try:
    from replay import plots as _plots
except ImportError:
    _plots = _sibling("rdvpump_replay_plots", "replay/plots.py")
try:
    from replay import fold as _fold
except ImportError:
    _fold = _sibling("rdvpump_replay_fold", "replay/fold.py")

#: The trace schema version this job reads (pump/schema.py is the one definition).
SCHEMA_VERSION: int = _schema.SCHEMA_VERSION

_OLDER = ("; traces of an older schema are not read (version 2 kept the monotonic clock in "
          "'reason' and named disconnects 'error'): record the run again with this rdvpump")

#: Violations and undelivered messages listed in summary.json (all are in Parquet).
SUMMARY_LIMIT = 100


class TraceError(RdvpumpError, ValueError):
    """The traces cannot be analysed (missing, empty, another schema version)."""


def trace_schema() -> Any:
    from pyspark.sql import types as T

    types = {"int32": T.IntegerType(), "int": T.LongType(), "float": T.DoubleType(),
             "str": T.StringType()}
    return T.StructType([T.StructField(name, types[kind]) for name, kind in _schema.COLUMNS])


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


def load(spark: Any, traces: str) -> tuple[Any, list[str]]:
    """All rows of the traces as one Spark DataFrame, with ``file``, ``ord`` (order within
    the file) and ``bad`` (a corrupt line, or a row without kind or version), and the
    JSON Lines files.  The analysis reads Parquet with :class:`_Source` instead; this is
    for ad hoc queries (and the benchmark's floor).  Nothing is computed here.
    """
    from pyspark.sql import functions as F

    jsonl, parquet = find_traces(traces)
    schema = trace_schema()
    names = [f.name for f in schema.fields]
    frames = []
    if jsonl:
        frames.append(_jsonl_events(spark, jsonl).withColumn("file", F.input_file_name()))
    if parquet:
        pq = spark.read.parquet(*parquet)
        missing = [n for n in names if n not in pq.columns]
        if missing:
            found = [r["v"] for r in pq.select("v").distinct().collect()] if "v" in pq.columns \
                else []
            raise TraceError(_lacking(missing, found))
        frames.append(pq.select(*[F.col(n).cast(schema[n].dataType) for n in names],
                                F.monotonically_increasing_id().alias("ord"),
                                (F.col("kind").isNull() | F.col("v").isNull()).alias("bad"),
                                F.input_file_name().alias("file")))
    events = frames[0]
    for frame in frames[1:]:
        events = events.unionByName(frame)
    return events, jsonl


def _jsonl_events(spark: Any, jsonl: list[str]) -> Any:
    """The rows of JSON Lines traces, with ``ord`` and ``bad`` (Spark's reader keeps a
    corrupt line as a row of nulls)."""
    from pyspark.sql import functions as F

    schema = trace_schema()
    raw = (spark.read.schema(_with_corrupt(schema)).option("mode", "PERMISSIVE")
           .option("columnNameOfCorruptRecord", "_corrupt_record").json(jsonl))
    bad = (F.col("_corrupt_record").isNotNull() | F.col("kind").isNull()
           | F.col("v").isNull())
    return raw.select(*[f.name for f in schema.fields],
                      F.monotonically_increasing_id().alias("ord"), bad.alias("bad"))


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
        raise TraceError(_lacking(missing, found))
    return meta


def _lacking(missing: list[str], found: list[Any]) -> str:
    return (f"Parquet traces lack the columns {', '.join(missing)}: trace schema version "
            f"{SCHEMA_VERSION} expected, found "
            f"{', '.join(map(str, sorted(found))) or 'none'}{_OLDER}")


class _Source:
    """The traces as Arrow tables inside Spark tasks (:meth:`map`).

    A Parquet trace is read by pyarrow in the tasks, its row groups packed into one task
    per core (:func:`_pack`): its strings stay dictionary codes (Spark's reader would make
    a Java string of each).  JSON Lines go through Spark's reader, which keeps a corrupt
    line as a bad row.
    """

    def __init__(self, spark: Any, traces: str) -> None:

        self.spark = spark
        self.jsonl, parquet = find_traces(traces)
        self.units: list[tuple[str, int, int, int]] = []
        sizes: list[int] = []
        for index, path in enumerate(parquet):
            meta = parquet_metadata(path)
            offset = 0
            for group in range(meta.num_row_groups):
                rows = meta.row_group(group)
                self.units.append((path, group, index, offset))
                offset += rows.num_rows
                sizes.append(sum(rows.column(c).total_compressed_size
                                 for c in range(rows.num_columns)))
        #: The row groups each task reads, packed as Spark packs a file scan's splits.
        self.tasks = _pack(sizes, spark)
        self.events = _jsonl_events(spark, self.jsonl) if self.jsonl else None

    def map(self, work: Callable[[Any], Any], schema: Any, columns: Sequence[str]) -> Any:
        """A DataFrame of ``work(table)`` (record batches of ``schema``) over every table
        of trace rows: ``columns`` of the trace (Parquet is read for these only), with
        ``bad`` and ``ord``."""
        _ship_by_value()
        frames = []
        if self.units:
            units = self.units
            kinds = dict(_schema.COLUMNS)
            typed = [(name, kinds[name]) for name in columns]
            read = _fold.read_unit

            def each_unit(batches: Any) -> Any:
                for batch in batches:
                    for task in batch.column(0).to_pylist():
                        for i in tasks[task]:
                            path, group, index, offset = units[i]
                            yield from work(read(path, group, index, offset, typed))

            tasks = self.tasks
            frames.append(self.spark.range(0, len(tasks), 1, len(tasks))
                          .mapInArrow(each_unit, schema))
        if self.events is not None:
            def each_batch(batches: Any) -> Any:
                import pyarrow as pa

                for batch in batches:
                    yield from work(pa.Table.from_batches([batch]))

            frames.append(self.events.mapInArrow(each_batch, schema))
        frame = frames[0]
        for other in frames[1:]:
            frame = frame.unionByName(other)
        return frame


def _pack(sizes: list[int], spark: Any) -> list[list[int]]:
    """Row groups (bytes on disk each) cut into tasks of contiguous row groups and near
    equal bytes: as many tasks as cores (Spark's default parallelism), more where a task
    would read over ``spark.sql.files.maxPartitionBytes``, never more than row groups.
    One task per row group would cost a task's fixed overhead (tens of ms) for each."""
    most = _bytes(spark.conf.get("spark.sql.files.maxPartitionBytes", "128m"))
    cores = max(1, spark.sparkContext.defaultParallelism)
    total = sum(sizes)
    count = max(1, min(len(sizes), max(cores, math.ceil(total / max(most, 1)))))
    tasks: list[list[int]] = [[] for _ in range(count)]
    before = 0
    for i, size in enumerate(sizes):  # each row group to the task its middle byte is in
        tasks[min(count - 1, int((before + size / 2) * count / max(total, 1)))].append(i)
        before += size
    return [task for task in tasks if task]


def _bytes(text: str) -> int:
    """A Spark size ("128m", "4194304", "1g") in bytes."""
    text = text.strip().lower().rstrip("b")
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def _ship_by_value() -> None:
    """The workers get :mod:`replay.fold` with the functions, not by import: they need
    neither rdvpump nor this checkout."""
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(_fold)  # type: ignore[no-untyped-call]


def _with_corrupt(schema: Any) -> Any:
    from pyspark.sql import types as T

    return T.StructType([*schema.fields, T.StructField("_corrupt_record", T.StringType())])


def _short(file: str) -> str:
    for prefix in ("file://", "file:"):
        if file.startswith(prefix):
            return file[len(prefix):]
    return file


def _locate_lines(spark: Any, jsonl: list[str]) -> list[dict[str, Any]]:
    """File and line of the first corrupt lines (up to 1,000), in two small jobs.

    Every split of every file is read once, in parallel: the lines of a split keep their
    order, so a line's number is its place in its split plus the lines of the splits
    before it in the same file.
    """
    from pyspark.sql import functions as F

    if not jsonl:
        return []
    parsed = F.from_json("value", _with_corrupt(trace_schema()),
                         {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": "_corrupt_record"})
    lines = (spark.read.text(jsonl)
             .select(F.input_file_name().alias("file"),
                     F.input_file_block_start().alias("block"),
                     F.monotonically_increasing_id().alias("id"), "value"))
    splits = {(r["file"], r["block"]): (r["first"], r["n"]) for r in lines.groupBy(
        "file", "block").agg(F.min("id").alias("first"), F.count("*").alias("n")).collect()}
    before: dict[tuple[str, int], int] = {}
    for file in {f for f, _ in splits}:
        total = 0
        for block in sorted(b for f, b in splits if f == file):
            before[(file, block)] = total
            total += splits[(file, block)][1]
    bad = (lines.withColumn("p", parsed)
           .where((F.trim("value") != "") & (F.col("p._corrupt_record").isNotNull()
                                            | F.col("p.kind").isNull() | F.col("p.v").isNull()))
           .orderBy("file", "block", "id").limit(1000).collect())
    return [{"file": _short(r["file"]),
             "line": before[(r["file"], r["block"])] + r["id"]
             - splits[(r["file"], r["block"])][0] + 1,
             "text": r["value"][:200]} for r in bad]


# -- analysis -----------------------------------------------------------------------------

#: The kinds that tell a link's life; they carry the link id.
LIFE_KINDS = _fold.LIFE_KINDS
#: The kinds that end a link.
END_KINDS = ("disconnect", "close", "fail", "protocol_error")
MESSAGE_KINDS = _fold.MESSAGE_KINDS
#: Violations and undelivered messages up to this many are collected and written by the
#: driver; beyond it Spark writes them (and summary.json lists the first SUMMARY_LIMIT).
COLLECT_LIMIT = 100_000
#: Time bins across the run in the plots.
PLOT_BINS = 200
#: Latency histogram buckets per decade.
BUCKETS_PER_DECADE = 20

_STREAM = ["run", "link", "dir"]
_KEY = [*_STREAM, "seq"]


class _Jobs:
    """Counts the Spark jobs of one analysis (a job group) and reports its stages."""

    def __init__(self, spark: Any, progress: Callable[[str], None] | None) -> None:
        self.sc = spark.sparkContext
        self.group = f"rdvpump-replay-{os.getpid()}-{id(self)}"
        self.sc.setJobGroup(self.group, "rdvpump replay")
        self.progress = progress

    def stage(self, what: str) -> None:
        if self.progress is not None:
            self.progress(what)

    def count(self) -> int:
        return len(self.sc.statusTracker().getJobIdsForGroup(self.group))

    def done(self) -> None:
        self.sc.cancelJobGroup(self.group)  # nothing is left running; ends the group
        self.sc.setLocalProperty("spark.jobGroup.id", None)


def analyze(spark: Any, traces: str, out: str | None = None, *,
            progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Check and measure the traces; write the tables and plots to ``out`` if given.

    Two passes over the traces, the work of each task done on Arrow tables by
    :mod:`replay.fold` (pyarrow and numpy in Spark's Python workers):

    1. a census of the events (counts and times per pump, kind, stream and link event;
       small), added up by the driver;
    2. one shuffle keyed by stream (run, link, dir): the map side cuts each task's
       message rows into a block per piece of a stream (the whole stream, or a range of
       seqs of a long one), the reduce side folds each piece into one row per sequence
       number, checks FIFO in seq order, and counts every message in its groups
       (per-link figures, time bins, latency buckets, histograms, and the messages to
       list: :func:`_measure`); the driver checks FIFO where pieces meet.

    Only that result is kept (a local checkpoint: rows in the executors' block stores,
    memory then disk; small unless the trace breaks many invariants).  A local
    checkpoint does not survive the loss of an executor; the job then fails and is run
    again.  The small results are collected and written by the driver.
    ``progress`` is told each stage; ``summary["spark_jobs"]`` counts the Spark jobs.
    """
    jobs = _Jobs(spark, progress)
    if out is not None:  # the driver's own imports, while Spark works
        threading.Thread(target=_import_writers, daemon=True).start()
    try:
        jobs.stage("reading the traces")
        source = _Source(spark, traces)
        jobs.stage("census of the events")
        census = _Census(_census_rows(source))
        census.check(spark, traces)
        corrupt: list[dict[str, Any]] = []
        if census.corrupt:
            jobs.stage("locating corrupt lines")
            corrupt = _locate_lines(spark, source.jsonl)
        jobs.stage("matching sends and deliveries (one shuffle by link and direction)")
        found = _measure(spark, source, census, jobs, out)
        summary = _summary(traces, census, corrupt, found)
        if out is not None:
            jobs.stage("writing tables and plots")
            _write(Path(out), census, found, summary)
        summary["spark_jobs"] = jobs.count()
        if out is not None:
            Path(out, "summary.json").write_text(json.dumps(summary, indent=2, default=str)
                                                 + "\n")
        return summary
    finally:
        jobs.done()


def _import_writers() -> None:
    import matplotlib.backends.backend_agg  # noqa: F401
    import matplotlib.figure  # noqa: F401
    import pyarrow.parquet  # noqa: F401


def _census_rows(source: _Source) -> list[dict[str, Any]]:
    """The census (:func:`replay.fold.census`) of every table, added up."""
    census = _fold.census

    def partial(table: Any) -> Any:
        return census(table).to_batches()

    return _fold.merge_census(r.asDict() for r in source.map(
        partial, _spark_schema(_fold.CENSUS_SCHEMA), _fold.CENSUS_COLUMNS).collect())


def _spark_schema(arrow: Any) -> Any:
    """The Spark schema of an Arrow schema of :mod:`replay.fold` (written there once)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(arrow)


def _violations(per_seq: Any) -> Any:
    """Each broken invariant of a message, as (run, link, dir, seq, violation, detail)."""
    from pyspark.sql import functions as F

    sends, deliveries, seq = F.col("sends"), F.col("deliveries"), F.col("seq")
    delivered_size = F.when(F.col("delivered_size") != F.col("size"),
                            F.col("delivered_size")).otherwise(F.col("delivered_size_max"))

    def case(name: str, at: Any, *detail: Any) -> Any:
        return F.when(F.expr(_VIOLATION_FLAGS[name]), F.struct(
            at.alias("seq"), F.lit(name).alias("violation"), F.concat(*detail).alias("detail")))

    found = F.filter(F.array(
        case("duplicate send", seq, F.lit("sent "), sends.cast("string"), F.lit(" times")),
        case("duplicate delivery", seq, F.lit("delivered "), deliveries.cast("string"),
             F.lit(" times")),
        case("delivered but never sent", seq, F.lit("delivered "), deliveries.cast("string"),
             F.lit(" times, never sent")),
        case("out of order", F.col("late"), F.lit("delivered after seq "),
             seq.cast("string")),
        case("size mismatch", seq, F.lit("sent "), F.col("size").cast("string"),
             F.lit(" bytes, delivered "), delivered_size.cast("string"))),
        lambda v: v.isNotNull())
    return (per_seq.select(*_STREAM, F.explode(found).alias("v"))
            .select(*_STREAM, "v.seq", "v.violation", "v.detail"))


_VIOLATION_FLAGS = {
    "duplicate send": "sends > 1",
    "duplicate delivery": "deliveries > 1",
    "delivered but never sent": "deliveries > 0 AND sends = 0",
    "out of order": "late IS NOT NULL",
    "size mismatch": ("sends > 0 AND deliveries > 0 AND (size != size_max OR "
                      "delivered_size != size OR delivered_size_max != size)"),
}


#: Latency buckets per decade for the percentiles: a bucket's largest latency is at most
#: 0.23 % above its smallest.  Latencies of 1 ns or less (zero and negative ones, from
#: clocks out of line, included) share one bucket.
FINE_PER_DECADE = 1000
#: The percentiles reported, per link and direction and over the run.
QUANTILES = (0.5, 0.9, 0.99)
# the parts of the fold's result (_measure)
_BIN, _SECOND, _LATENCY, _HISTOGRAM, _LISTED = (_fold.BIN, _fold.SECOND, _fold.LATENCY,
                                                 _fold.HISTOGRAM, _fold.LISTED)
_FIRST, _LAST = _fold.FIRST, _fold.LAST
#: The most rows of a stream folded at once (see :data:`replay.fold.PIECE_ROWS`).
PIECE_ROWS = _fold.PIECE_ROWS
#: The most bytes of blocks a reduce task holds in memory (see
#: :data:`replay.fold.HELD_BYTES`).
HELD_BYTES = _fold.HELD_BYTES

def _measure(spark: Any, source: _Source, census: _Census, jobs: _Jobs,
             out: str | None) -> dict[str, Any]:
    """Every figure that needs the messages, from the job's one shuffle by stream.

    Each piece of a stream (:class:`replay.fold.Pieces`: the whole stream, or a range of
    seqs of one over :data:`PIECE_ROWS` rows) goes to one reduce partition (the largest
    first, each to the partition with the fewest rows so far), where it is folded whole
    (:func:`replay.fold.fold`); FIFO where two pieces meet is checked here
    (:func:`replay.fold.across_pieces`).  Each message counts in a few groups at once, told apart
    by ``part``: its stream and time bin (the per-link figures and the plots), its
    stream and second (when bins are wider than a second), its stream and fine latency
    bucket (the percentiles), its latency and size bucket (the histograms), and, for a
    message that broke an invariant or was never delivered, its own row (the listings).
    The result is small but for the listings, and is kept as a local checkpoint; the
    percentiles come from its latency buckets: each the largest latency of the bucket
    the percentile falls in, at most 0.23 % above the exact percentile (see
    :data:`FINE_PER_DECADE`).
    """
    from pyspark.sql import functions as F

    width = _bin_width(census.duration)
    pieces = _fold.Pieces(census.loads, census.lows, census.highs, PIECE_ROWS)
    partitions = max(1, min(int(spark.conf.get("spark.sql.shuffle.partitions")),
                            len(pieces)))
    keys = _fold.partition_keys(partitions)
    to = _fold.assign(pieces.rows.tolist(), partitions)
    sids, offsets, route, fold = census.sid_of, census.offsets, _fold.route, _fold.fold
    start, held = census.start, HELD_BYTES

    def routed(table: Any) -> Any:
        import pyarrow as pa

        blocks = route(table, sids, offsets, pieces, to, keys)
        if blocks:
            yield pa.record_batch([pa.array([k for k, _, _ in blocks], pa.int32()),
                                   pa.array([p for _, p, _ in blocks], pa.int32()),
                                   pa.array([b for _, _, b in blocks], pa.binary())],
                                  names=["key", "piece", "block"])

    def folded(batches: Any) -> Any:
        blocks = (pair for batch in batches for pair in zip(
            batch.column(1).to_pylist(), batch.column(2).to_pylist(), strict=True))
        yield from fold(blocks, start=start, width=width, per_second=width > 1.0,
                        fine_per_decade=FINE_PER_DECADE,
                        buckets_per_decade=BUCKETS_PER_DECADE,
                        held_bytes=held).to_batches()

    jobs.stage("every figure of every link and direction (one aggregation)")
    table = (source.map(routed, "key int, piece int, block binary", _fold.ROUTE_COLUMNS)
             .repartition(partitions, "key")
             .mapInArrow(folded, _spark_schema(_fold.FOLDED)).localCheckpoint())
    found: dict[str, Any] = {"bin_width": width}
    small = table.where(F.col("part") != _LISTED).drop("row").collect()
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
    found["per_second"] = None if width <= 1.0 else binned(by_part[_SECOND])
    found["histogram"] = [{"latency_bucket": r["k1"], "size_bucket": r["k2"],
                           "journeys": r["journeys"], "messages": r["messages"],
                           "bytes": r["bytes"]} for r in by_part[_HISTOGRAM]]
    streams = found["streams"]
    violation_count = sum(sum(r[name] for name in _VIOLATION_FLAGS) for r in streams)
    undelivered_count = sum(r["undelivered"] for r in streams)
    found["violation_count"], found["undelivered_count"] = violation_count, undelivered_count
    found["violations"] = found["undelivered"] = []
    found["violations_frame"] = found["undelivered_frame"] = False
    flagged_rows = census.named(spark, table.where(F.col("part") == _LISTED)).select(
        *_STREAM, "row.*")
    if violation_count:
        jobs.stage("listing the violations")
        listing = _violations(flagged_rows)
        if across:
            listing = listing.unionByName(spark.createDataFrame(
                across, "run string, link string, dir string, seq bigint, "
                        "violation string, detail string"))
        found["violations"], found["violations_frame"] = _listed(
            listing.orderBy(*_KEY, "violation"), violation_count, out, "violations")
    if undelivered_count:
        jobs.stage("listing undelivered messages and their causes")
        ends = spark.createDataFrame(census.stream_ends(), _STREAM_ENDS)
        frame = (flagged_rows.where((F.col("sends") > 0) & (F.col("deliveries") == 0))
                 .join(F.broadcast(ends), _STREAM, "left")
                 .select(*_KEY, "sender", "sent_at", "size",
                         F.coalesce("cause", F.lit("run ended")).alias("cause"), "end_reason",
                         F.coalesce("service", F.lit(False)).alias("service"))
                 .orderBy(*_KEY))
        found["undelivered"], found["undelivered_frame"] = _listed(
            frame, undelivered_count, out, "undelivered")
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
                                  **{name: 0 for name in _VIOLATION_FLAGS}})
        s["messages"] += r["journeys"]
        if r["max"] is not None:
            s["max"] = r["max"] if s["max"] is None else max(s["max"], r["max"])
        for name in ("undelivered", *_VIOLATION_FLAGS):
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


def _listed(frame: Any, count: int, out: str | None, name: str) -> tuple[list[dict[str, Any]],
                                                                        bool]:
    """The rows of a listing for the summary, and whether Spark wrote the table itself:
    up to :data:`COLLECT_LIMIT` rows are collected (the driver writes them), beyond that
    Spark writes ``out/name`` and only the first :data:`SUMMARY_LIMIT` are collected."""
    if out is None:
        return [r.asDict() for r in frame.limit(SUMMARY_LIMIT).collect()], False
    if count <= COLLECT_LIMIT:
        return [r.asDict() for r in frame.collect()], False
    frame.write.mode("overwrite").parquet(str(Path(out) / name))
    return [r.asDict() for r in frame.limit(SUMMARY_LIMIT).collect()], True

_STREAM_ENDS = ("run string, link string, dir string, sender string, cause string, "
                "end_reason string, service boolean")


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
            if r["kind"] == "clock" and r["clock"] is not None:
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
            if r["kind"] == "refuse" and r["outcome"] != "inbound":
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
        sends = [r for r in good if r["kind"] == "send"]
        self.sent_sizes = None if not sends else {
            "min": min(r["min_size"] for r in sends),
            "mean": sum(r["bytes"] for r in sends) / sum(r["n"] for r in sends),
            "max": max(r["max_size"] for r in sends)}

    def stream_of(self, row: Any) -> tuple[str, str, str]:
        """(run, link, dir) of a row of the fold, keyed by ``sid``."""
        return self.sids[row["sid"]]

    def named(self, spark: Any, frame: Any) -> Any:
        """``frame`` keyed by ``sid``, with run, link and dir instead."""
        from pyspark.sql import functions as F

        names = spark.createDataFrame(
            [(sid, *stream) for sid, stream in sorted(self.sids.items())],
            "sid long, run string, link string, dir string")
        return frame.join(F.broadcast(names), "sid").drop("sid")

    def offset(self, row: Any) -> float:
        return self.offsets.get((row["run"], row["pump"]), 0.0)

    def _message(self, r: Any, link: dict[str, Any]) -> None:
        stream = self.streams.setdefault((r["run"], r["link"], r["dir"]), {
            "sender": None, "receiver": None, "send_pumps": set(), "deliver_pumps": set(),
            "sent": 0, "delivered": 0})
        stream["sent" if r["kind"] == "send" else "delivered"] += r["n"]
        if r["kind"] == "send":
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
            if r["kind"] == "connect" and r["connect_time"] is not None:
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
        if kind == "accept" and link["accepted_at"] is None:
            link.update(accepted_at=at, acceptor=r["broker"], connector=r["peer"],
                        port=r["port"])
        if kind == "disconnect" and link["disconnected_at"] is None:
            link.update(disconnected_at=at, disconnect_reason=r["reason"])
        if kind == "close" and r["reason"] is not None:
            link["close_reasons"].add(r["reason"])
        if kind in END_KINDS:
            link["ended_at"] = at if link["ended_at"] is None else link["ended_at"]
            if link["end_reason"] is None:
                link["end_reason"] = r["reason"]
            if kind in ("fail", "protocol_error") or (
                    kind == "disconnect" and r["outcome"] != "clean"):
                link["failed"] = True

    def check(self, spark: Any, traces: str) -> None:
        """Raise :class:`TraceError` for rows of another schema version (naming their
        files: a second, small job, only then) or for no events at all."""
        from pyspark.sql import functions as F

        if any(v != SCHEMA_VERSION for v in self.versions):
            events, _ = load(spark, traces)
            other = sorted((r["file"], r["v"]) for r in events.where(
                ~F.col("bad") & (F.col("v") != SCHEMA_VERSION)).select("file", "v")
                .distinct().limit(100).collect())
            listing = "; ".join(f"{_short(f)} has version {v}" for f, v in other[:5])
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
            return "peer failed", life["end_reason"]
        if life is not None and life["end_reason"] is not None:
            return "link closed with it in flight", life["end_reason"]
        return "run ended", None

    def stream_ends(self) -> list[tuple[Any, ...]]:
        return [(run, link, d, s["sender"], *self.cause(run, link),
                 (run, link) in self.service_links)
                for (run, link, d), s in sorted(self.streams.items())]

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
    by_type = {name: sum(r[name] for r in found["streams"]) for name in _VIOLATION_FLAGS}
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


# -- entry points -------------------------------------------------------------------------


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


#: JVM settings.  "production" keeps the full JIT (C1, then C2) and the parallel
#: collector, for throughput; "quick" stops at the C1 compiler and uses the serial
#: collector: it starts and warms up faster, and wins on traces that take seconds.
JVM_PROFILES = {"production": "-XX:+UseParallelGC",
                "quick": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"}
#: Traces smaller than this on disk (JSON Lines, Parquet: about 200,000 events either way)
#: are analysed with the quick profile by default; on larger ones the full JIT wins.
QUICK_BYTES = {"jsonl": 32 << 20, "parquet": 4 << 20}


def jvm_for(traces: str) -> str:
    """The JVM profile for these traces: quick under :data:`QUICK_BYTES`, else production."""
    jsonl, parquet = find_traces(traces)
    share = (sum(os.path.getsize(f) for f in jsonl) / QUICK_BYTES["jsonl"]
             + sum(os.path.getsize(f) for f in parquet) / QUICK_BYTES["parquet"])
    return "quick" if share < 1 else "production"


#: Bumped when the job comes to load other classes (a new kind of Spark work): a new
#: archive is then written, since an old one lacks them.  2: the Python workers' Arrow.
_ARCHIVED_CLASSES = 2


def class_archive(profile: str) -> tuple[str, str | None]:
    """JVM options for a class-data-sharing archive of Spark's classes, and the path the
    archive is written to when this JVM exits (None when it is already there).

    Loading Spark's classes from an archive instead of its jars saves about two
    seconds of every start on this machine.  The first run writes the archive (about
    170 MB) under ``$XDG_CACHE_HOME/rdvpump`` (``~/.cache/rdvpump``) for the JVM, the
    pyspark version, the profile and :data:`_ARCHIVED_CLASSES`; a run that finds a
    finished one promotes it, and removes the archives of older generations of the same
    pyspark.  Set ``RDVPUMP_SPARK_CDS=0`` to go without.
    """
    if os.environ.get("RDVPUMP_SPARK_CDS", "1") == "0":
        return "", None
    import shutil as _shutil

    import pyspark

    java = os.path.realpath(_shutil.which("java") or "java")
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rdvpump"
    final = cache / _archive_name(java, profile)
    for other in cache.glob(f"spark-{pyspark.__version__}-*.jsa"):  # older generations
        if other.name not in {_archive_name(java, p) for p in JVM_PROFILES}:
            other.unlink(missing_ok=True)
    quiet = "-Xlog:cds=off -Xlog:cds+dynamic=off -Xshare:auto"
    for done in sorted(cache.glob(final.name + ".*")):  # written by JVMs that have exited
        pid = done.suffix[1:]
        if pid.isdigit() and not _alive(int(pid)):
            if final.exists():
                done.unlink(missing_ok=True)
            else:
                os.replace(done, final)
    if final.exists():
        return f"{quiet} -XX:SharedArchiveFile={final}", None
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError:
        return "", None
    pending = f"{final}.{os.getpid()}"
    return f"{quiet} -XX:ArchiveClassesAtExit={pending}", pending


def _archive_name(java: str, profile: str) -> str:
    import hashlib

    import pyspark

    tag = hashlib.sha256(f"{java}\0{pyspark.__version__}\0{profile}\0{_ARCHIVED_CLASSES}"
                         .encode()).hexdigest()[:12]
    return f"spark-{pyspark.__version__}-{tag}.jsa"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def session(master: str | None = None, *, app: str = "rdvpump-replay",
            log4j: str | None = None, warehouse: str | None = None,
            driver_memory: str = "2g", jvm: str = "production",
            shuffle_partitions: int = 4) -> Any:
    """A SparkSession on ``master`` with the JVM profile ``jvm`` (:data:`JVM_PROFILES`);
    ``master`` None leaves everything to spark-submit.

    Spark logs errors only (``replay/log4j2.properties``); ``log4j=""`` keeps Spark's
    own logging, another path names a log4j2 configuration file.
    """
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app)
    if master is not None:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        archive, _ = class_archive(jvm)
        if log4j is None:
            log4j = str(Path(__file__).resolve().parent / "log4j2.properties")
        jopts = " ".join(filter(None, (
            f"-Dlog4j.configurationFile=file:{log4j}" if log4j else "", JVM_PROFILES[jvm],
            archive)))
        builder = (builder.master(master)
                   .config("spark.ui.enabled", "false")
                   .config("spark.ui.showConsoleProgress", "false")
                   .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
                   .config("spark.driver.host", "127.0.0.1")
                   .config("spark.driver.bindAddress", "127.0.0.1")
                   .config("spark.driver.memory", driver_memory)
                   .config("spark.driver.extraJavaOptions", jopts))
        if warehouse:
            builder = builder.config("spark.sql.warehouse.dir", warehouse)
    builder = builder.config("spark.sql.session.timeZone", "UTC")
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--traces", required=True, help="directory of trace files")
    parser.add_argument("--out", required=True, help="directory for tables, summary, plots")
    parser.add_argument("--master", default=None, help="Spark master (spark-submit's default)")
    args = parser.parse_args(argv)
    try:
        find_traces(args.traces)  # fail fast, before a JVM starts
    except TraceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    spark = session(args.master)
    try:
        summary = analyze(spark, args.traces, args.out)
    except TraceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        spark.stop()
    print_summary(summary)
    return 1 if summary["violation_count"] else 0


if __name__ == "__main__":
    sys.exit(main())
