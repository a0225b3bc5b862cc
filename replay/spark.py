"""The replay's Spark engine: the analysis of :mod:`replay.analysis` on a SparkSession
(``spark-submit replay/job.py`` runs it on any cluster; ``rdvpump trace analyze DIR
--engine spark`` in local mode).  The tasks' work is
:mod:`replay.fold`, shipped to the executors with the tasks; their Python needs pyarrow
and numpy.

Input: the trace files of one or many pumps in DIR (``*.jsonl`` and ``*.parquet``,
schema version :data:`SCHEMA_VERSION`, defined in ``pump/schema.py``).  Output in OUT:
the tables, ``summary.json`` and plots of :mod:`replay.output`.

:class:`Spark` is the engine: two passes over the traces, a census (collected), then one
shuffle keyed by stream (run, link, dir) whose map side cuts each task's message rows
into a block per piece of a stream and whose reduce side folds each piece.  Only the
fold's result is kept (a local checkpoint: rows in the executors' block stores, memory
then disk; small unless the trace breaks many invariants), for the listings.  A local
checkpoint does not survive the loss of an executor; the job then fails and is run
again.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pump import schema as _schema
from replay import fold as _fold
from replay import measure as _measure
from replay.sources import (
    SCHEMA_VERSION,
    TraceError,
    find_traces,
    lacking,
    parquet_metadata,
)

MESSAGE_KINDS = _schema.MESSAGE_KINDS


def trace_schema() -> Any:
    from pyspark.sql import types as T

    types = {"int32": T.IntegerType(), "int": T.LongType(), "float": T.DoubleType(),
             "str": T.StringType()}
    return T.StructType([T.StructField(name, types[kind]) for name, kind in _schema.COLUMNS])


# -- reading ------------------------------------------------------------------------------


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
            raise TraceError(lacking(missing, found))
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


def size_shuffles(spark: Any, files: list[str]) -> None:
    """Spark's shuffles (``spark.sql.shuffle.partitions``) sized to the traces as their
    reading is (:func:`_pack`): as many partitions as cores, more where one would hold
    over ``spark.sql.files.maxPartitionBytes`` of trace, unless the submitter set it.
    Spark's own default, 200 partitions, costs a task each even for a trace of
    kilobytes."""
    if spark.sparkContext.getConf().contains("spark.sql.shuffle.partitions"):
        return
    most = _bytes(spark.conf.get("spark.sql.files.maxPartitionBytes", "128m"))
    total = sum(os.path.getsize(f) for f in files)
    cores = max(1, spark.sparkContext.defaultParallelism)
    spark.conf.set("spark.sql.shuffle.partitions",
                   str(max(cores, math.ceil(total / max(most, 1)))))


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
    cloudpickle.register_pickle_by_value(_schema)  # type: ignore[no-untyped-call]


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


# -- the engine ------------------------------------------------------------------------------

class Spark:
    """:class:`replay.analysis.Engine` on a SparkSession; its Spark jobs are one job
    group, counted by :meth:`jobs`."""

    name = "spark"

    def __init__(self, spark: Any, traces: str,
                 progress: Callable[[str], None] | None = None) -> None:
        self.spark, self.traces, self.progress = spark, traces, progress
        self.sc = spark.sparkContext
        self.group = f"rdvpump-replay-{os.getpid()}-{id(self)}"
        self.sc.setJobGroup(self.group, "rdvpump replay")
        self.stage("reading the traces")
        self.source = _Source(spark, traces)
        self.listed: Any = None

    def stage(self, what: str) -> None:
        if self.progress is not None:
            self.progress(what)

    def census(self) -> list[dict[str, Any]]:
        census = _fold.census

        def partial(table: Any) -> Any:
            return census(table).to_batches()

        return _fold.merge_census(r.asDict() for r in self.source.map(
            partial, _spark_schema(_fold.CENSUS_SCHEMA), _fold.CENSUS_COLUMNS).collect())

    def other_versions(self) -> list[tuple[str, int]]:
        from pyspark.sql import functions as F

        events, _ = load(self.spark, self.traces)
        return sorted((_short(r["file"]), r["v"]) for r in events.where(
            ~F.col("bad") & (F.col("v") != SCHEMA_VERSION)).select("file", "v")
            .distinct().limit(100).collect())

    def corrupt_lines(self) -> list[dict[str, Any]]:
        return _locate_lines(self.spark, self.source.jsonl)

    def fold(self, plan: Any) -> list[dict[str, Any]]:
        """The one shuffle: each piece to one reduce partition (the largest first, each
        to the partition with the fewest rows so far), folded whole there."""
        from pyspark.sql import functions as F

        pieces = plan.pieces
        partitions = max(1, min(int(self.spark.conf.get("spark.sql.shuffle.partitions")),
                                len(pieces)))
        keys = _fold.partition_keys(partitions)
        to = _fold.assign(pieces.rows.tolist(), partitions)
        sids, offsets, route, fold = plan.sids, plan.offsets, _fold.route, _fold.fold
        options = plan.options

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
            yield from fold(blocks, **options).to_batches()

        table = (self.source.map(routed, "key int, piece int, block binary",
                                 _fold.ROUTE_COLUMNS)
                 .repartition(partitions, "key")
                 .mapInArrow(folded, _spark_schema(_fold.FOLDED)).localCheckpoint())
        self.listed = table.where(F.col("part") == _fold.LISTED)
        return [r.asDict() for r in table.where(F.col("part") != _fold.LISTED)
                .drop("row").collect()]

    def listing(self, work: Callable[..., Any], args: tuple[Any, ...], schema: Any,
                extra: list[tuple[Any, ...]], count: int, out: str | None, name: str
                ) -> tuple[list[dict[str, Any]], bool]:
        """Up to :data:`replay.measure.COLLECT_LIMIT` rows are collected (the driver
        writes them); beyond that Spark writes ``out/name`` and only the first
        :data:`replay.measure.SUMMARY_LIMIT` are collected."""
        import pyarrow as pa

        def each(batches: Any) -> Any:
            for batch in batches:
                yield from work(pa.Table.from_batches([batch]), *args).to_batches()

        frame = self.listed.mapInArrow(each, _spark_schema(schema))
        if extra:
            frame = frame.unionByName(self.spark.createDataFrame(extra, _spark_schema(schema)))
        frame = frame.orderBy(*schema.names)
        limit = _measure.SUMMARY_LIMIT
        if out is None:
            return [r.asDict() for r in frame.limit(limit).collect()], False
        if count <= _measure.COLLECT_LIMIT:
            return [r.asDict() for r in frame.collect()], False
        frame.write.mode("overwrite").parquet(str(Path(out) / name))
        return [r.asDict() for r in frame.limit(limit).collect()], True

    def jobs(self) -> int:
        return len(self.sc.statusTracker().getJobIdsForGroup(self.group))

    def close(self) -> None:
        self.sc.cancelJobGroup(self.group)  # nothing is left running; ends the group
        self.sc.setLocalProperty("spark.jobGroup.id", None)


def _spark_schema(arrow: Any) -> Any:
    """The Spark schema of an Arrow schema of :mod:`replay.fold` (written there once)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(arrow)
