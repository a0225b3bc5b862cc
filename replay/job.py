"""Replay pump traces with Spark: rebuild every link's life and every message's journey.

Runs unchanged under ``spark-submit replay/job.py --traces DIR --out DIR`` on any
cluster (it needs pyspark, and the trace schema: ``pump.schema`` when rdvpump is
installed, else ``pump/schema.py`` beside this file, which needs only the
standard library; ``rich`` is used when present), and as ``rdvpump trace
analyze DIR`` in local mode.

Input: the trace files of one or many pumps in DIR (``*.jsonl`` and ``*.parquet``,
schema version :data:`SCHEMA_VERSION`, defined in ``pump/schema.py``).  Output in OUT:

- Parquet tables: ``links``, ``violations``, ``undelivered``, ``latency``,
  ``throughput``, ``refusals``, ``sizes``;
- ``summary.json`` (counts, the violations and undelivered messages, up to a limit);
- ``throughput.png`` (messages delivered per second) and ``latency.png``
  (a histogram of delivery latency).

Checks: every delivered message was sent; FIFO per link and direction (a
delivery with a lower sequence number than the one before it); no duplicate
delivery.  Each sent message that was never delivered is listed with its cause:
``peer failed`` (a task of the link failed, or it ended on an error),
``link closed with it in flight``, or ``run ended``.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

try:
    from pump import RdvpumpError
    from pump import schema as _schema
except ImportError:  # spark-submit of a checkout, without rdvpump installed
    import importlib.util

    class RdvpumpError(Exception):  # type: ignore[no-redef]
        """Stands in for pump.RdvpumpError where rdvpump is not installed."""

    _spec = importlib.util.spec_from_file_location(
        "rdvpump_trace_schema", Path(__file__).resolve().parents[1] / "pump" / "schema.py")
    assert _spec is not None and _spec.loader is not None
    _schema = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_schema)

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


def load(spark: Any, traces: str) -> tuple[Any, list[dict[str, Any]]]:
    """All events of the traces, with ``file`` and ``ord`` (order within the file).

    Returns the events and the corrupt lines found (file, line, text); those are
    left out and the rest is analysed.  Raises :class:`TraceError` for a missing
    directory, no events at all, or a file of another schema version.
    """
    from pyspark.sql import functions as F

    jsonl, parquet = find_traces(traces)
    schema = trace_schema()
    names = [f.name for f in schema.fields]
    frames = []
    corrupt: list[dict[str, Any]] = []
    if jsonl:
        with_corrupt = schema.add("_corrupt_record", "string")
        raw = (spark.read.schema(with_corrupt).option("mode", "PERMISSIVE")
               .option("columnNameOfCorruptRecord", "_corrupt_record").json(jsonl)
               .withColumn("file", F.input_file_name())
               .withColumn("ord", F.monotonically_increasing_id()))
        raw = raw.cache()
        bad = raw.where(F.col("_corrupt_record").isNotNull() | F.col("kind").isNull()
                        | F.col("v").isNull())
        bad_rows = bad.select("file", "_corrupt_record", "kind", "v").limit(1000).collect()
        if bad_rows:
            corrupt = _locate_lines(spark, bad_rows)
        frames.append(raw.where(F.col("_corrupt_record").isNull() & F.col("kind").isNotNull()
                                & F.col("v").isNotNull()).select(*names, "file", "ord"))
    if parquet:
        pq = (spark.read.parquet(*parquet).withColumn("file", F.input_file_name())
              .withColumn("ord", F.monotonically_increasing_id()))
        missing = [n for n in names if n not in pq.columns]
        if missing:
            found = [r["v"] for r in pq.select("v").distinct().collect()] if "v" in pq.columns \
                else []
            raise TraceError(f"Parquet traces lack the columns {', '.join(missing)}: trace "
                             f"schema version {SCHEMA_VERSION} expected, found "
                             f"{', '.join(map(str, sorted(found))) or 'none'}{_OLDER}")
        frames.append(pq.select(*[F.col(n).cast(schema[n].dataType) for n in names],
                                "file", "ord"))
    events = frames[0]
    for frame in frames[1:]:
        events = events.unionByName(frame)
    versions = events.groupBy("file", "v").count().collect()
    other = sorted({(r["file"], r["v"]) for r in versions if r["v"] != SCHEMA_VERSION})
    if other:
        listing = "; ".join(f"{_short(f)} has version {v}" for f, v in other[:5])
        raise TraceError(f"trace schema version {SCHEMA_VERSION} expected: {listing}"
                         + (_OLDER if any(v < SCHEMA_VERSION for _, v in other) else ""))
    if not versions:
        raise TraceError(f"the traces in {traces} hold no events"
                         + (f" ({len(corrupt)} corrupt lines)" if corrupt else ""))
    return events, corrupt


def _short(file: str) -> str:
    return file[len("file://"):] if file.startswith("file://") else file


def _locate_lines(spark: Any, bad_rows: list[Any]) -> list[dict[str, Any]]:
    """File and line of each corrupt record (found by reading those files as text)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    wanted: dict[str, set[str]] = {}
    for r in bad_rows:
        text = r["_corrupt_record"] if r["_corrupt_record"] is not None else None
        wanted.setdefault(r["file"], set()).add(text if text is not None else "")
    found: list[dict[str, Any]] = []
    for file, texts in sorted(wanted.items()):
        lines = (spark.read.text(file).withColumn("mid", F.monotonically_increasing_id())
                 .withColumn("line", F.row_number().over(Window.orderBy("mid"))))
        hits = lines.where(F.col("value").isin(list(texts)) | ~F.col("value").contains('"kind"')
                           | ~F.col("value").contains('"v"')).select("line", "value")
        for row in hits.orderBy("line").limit(1000).collect():
            found.append({"file": _short(file), "line": row["line"],
                          "text": row["value"][:200]})
    return found


# -- analysis -----------------------------------------------------------------------------


def analyze(spark: Any, traces: str, out: str | None = None) -> dict[str, Any]:
    """Check and measure the traces; write the tables and plots to ``out`` if given."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    events, corrupt = load(spark, traces)
    # Align the pumps' clocks: a served pump's "clock" event maps its time to the
    # machine's monotonic clock; pumps without one keep their own time.
    clocks = (events.where(F.col("kind") == "clock")
              .groupBy("run", "pump")
              .agg(F.max_by(F.col("monotonic") - F.col("time"), "ord")
                   .alias("offset")))
    events = (events.join(F.broadcast(clocks), ["run", "pump"], "left")
              .withColumn("at", F.col("time") + F.coalesce(F.col("offset"), F.lit(0.0)))
              .drop("offset"))
    events = events.cache()
    key = ["run", "link", "dir", "seq"]
    sends = events.where(F.col("kind") == "send").select(
        *key, F.col("pump").alias("send_pump"), F.col("broker").alias("sender"),
        F.col("at").alias("sent_at"), F.col("size"))
    delivers = events.where(F.col("kind") == "deliver").select(
        *key, F.col("pump").alias("deliver_pump"), F.col("broker").alias("receiver"),
        F.col("at").alias("delivered_at"), F.col("step"), F.col("ord"), F.col("file"),
        F.col("size").alias("delivered_size"))

    # Invariants.
    dup_window = Window.partitionBy(*key).orderBy("step", "ord")
    duplicates = (delivers.withColumn("nth", F.row_number().over(dup_window))
                  .where(F.col("nth") > 1)
                  .select(*key, F.lit("duplicate delivery").alias("violation"),
                          F.concat(F.lit("delivered "), F.col("nth").cast("string"),
                                   F.lit(" times")).alias("detail")))
    unsent = (delivers.join(sends.select(*key), key, "left_anti")
              .select(*key, F.lit("delivered but never sent").alias("violation"),
                      F.concat(F.lit("delivered to "), F.col("receiver"),
                               F.lit(" in pump "), F.col("deliver_pump")).alias("detail")))
    fifo_window = Window.partitionBy("run", "link", "dir").orderBy("step", "ord")
    out_of_order = (delivers.withColumn("before", F.lag("seq").over(fifo_window))
                    .where(F.col("seq") < F.col("before"))
                    .select(*key, F.lit("out of order").alias("violation"),
                            F.concat(F.lit("delivered after seq "),
                                     F.col("before").cast("string")).alias("detail")))
    violations = duplicates.unionByName(unsent).unionByName(out_of_order).cache()

    # Journeys: each delivery matched with its send.
    journeys = (delivers.dropDuplicates(key)
                .join(sends, key, "inner")
                .withColumn("latency", F.col("delivered_at") - F.col("sent_at")))
    journeys = journeys.cache()

    # Undelivered messages and why.
    link_end = (events.where(F.col("kind").isin("disconnect", "close", "fail",
                                                "protocol_error"))
                .groupBy("run", "link")
                .agg(F.max(F.when((F.col("kind") == "fail")
                                  | (F.col("kind") == "protocol_error")
                                  | ((F.col("kind") == "disconnect")
                                     & (F.col("outcome") != "clean")), 1).otherwise(0))
                     .alias("failed"),
                     F.first("reason", ignorenulls=True).alias("end_reason")))
    undelivered = (sends.join(delivers.select(*key), key, "left_anti")
                   .join(link_end, ["run", "link"], "left")
                   .withColumn("cause",
                               F.when(F.col("failed") == 1, F.lit("peer failed"))
                               .when(F.col("end_reason").isNotNull(),
                                     F.lit("link closed with it in flight"))
                               .otherwise(F.lit("run ended")))
                   .select(*key, "sender", "sent_at", "size", "cause", "end_reason")).cache()

    # Links: their life from the events of every pump.
    life = events.where(F.col("link").isNotNull())
    links = (life.groupBy("run", "link").agg(
        F.min(F.when(F.col("kind") == "accept", F.col("at"))).alias("accepted_at"),
        F.first(F.when(F.col("kind") == "accept", F.col("broker")), ignorenulls=True)
        .alias("acceptor"),
        F.first(F.when(F.col("kind") == "accept", F.col("peer")), ignorenulls=True)
        .alias("connector"),
        F.first("port", ignorenulls=True).alias("port"),
        F.sum(F.when((F.col("kind") == "send") & (F.col("dir") == "ca"), 1).otherwise(0))
        .alias("sent_ca"),
        F.sum(F.when((F.col("kind") == "send") & (F.col("dir") == "ac"), 1).otherwise(0))
        .alias("sent_ac"),
        F.sum(F.when(F.col("kind") == "deliver", 1).otherwise(0)).alias("delivered"),
        F.sum(F.when(F.col("kind") == "deliver", F.col("size")).otherwise(0))
        .alias("bytes_delivered"),
        F.min(F.when(F.col("kind") == "disconnect", F.col("at"))).alias("disconnected_at"),
        F.first(F.when(F.col("kind") == "disconnect", F.col("reason")), ignorenulls=True)
        .alias("disconnect_reason"),
        F.collect_set(F.when(F.col("kind") == "close", F.col("reason"))).alias("close_reasons"),
        F.collect_set("pump").alias("pumps"),
    ))

    # Metrics.
    latency = journeys.groupBy("run", "link").agg(
        F.count("*").alias("messages"),
        F.percentile_approx("latency", 0.5, 10000).alias("p50"),
        F.percentile_approx("latency", 0.9, 10000).alias("p90"),
        F.percentile_approx("latency", 0.99, 10000).alias("p99"),
        F.max("latency").alias("max"))
    start = events.agg(F.min("at")).first()[0] or 0.0
    throughput = (journeys.withColumn("second", F.floor(F.col("delivered_at") - F.lit(start)))
                  .groupBy("run", F.col("receiver").alias("broker"), "second")
                  .agg(F.count("*").alias("messages"), F.sum("size").alias("bytes")))
    refusals = (events.where((F.col("kind") == "refuse")
                             & (F.col("outcome").isNull() | (F.col("outcome") != "inbound")))
                .groupBy("reason").count())
    sizes = (sends.withColumn("bucket", F.when(F.col("size") <= 0, F.lit(0)).otherwise(
        F.pow(F.lit(2), F.ceil(F.log2(F.col("size")))).cast("long")))
        .groupBy("bucket").agg(F.count("*").alias("messages"), F.sum("size").alias("bytes")))

    counts = events.groupBy("kind").count().collect()
    kinds = {r["kind"]: r["count"] for r in counts}
    violation_rows = [r.asDict() for r in violations.orderBy(*key, "violation")
                      .limit(SUMMARY_LIMIT).collect()]
    violation_count = violations.count()
    by_cause = {r["cause"]: r["count"] for r in undelivered.groupBy("cause").count().collect()}
    undelivered_rows = [r.asDict() for r in undelivered.orderBy(*key).limit(SUMMARY_LIMIT)
                        .collect()]
    overall = journeys.agg(
        F.count("*").alias("n"),
        F.percentile_approx("latency", [0.5, 0.9, 0.99], 10000).alias("q"),
        F.max("latency").alias("max"), F.min("delivered_at").alias("first"),
        F.max("delivered_at").alias("last"), F.countDistinct("send_pump", "deliver_pump")
        .alias("pump_pairs")).first()
    cross = journeys.where(F.col("send_pump") != F.col("deliver_pump")).count()
    size_stats = sends.agg(F.min("size"), F.avg("size"), F.max("size")).first()
    summary: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "traces": traces,
        "files": events.select("file").distinct().count(),
        "pumps": sorted(r["pump"] for r in events.select("pump").distinct().collect()),
        "runs": sorted(r["run"] for r in events.select("run").distinct().collect()),
        "events": sum(kinds.values()),
        "events_by_kind": dict(sorted(kinds.items())),
        "corrupt_lines": corrupt[:SUMMARY_LIMIT],
        "corrupt_line_count": len(corrupt),
        "links": links.count(),
        "messages_sent": kinds.get("send", 0),
        "messages_delivered": kinds.get("deliver", 0),
        "messages_matched": overall["n"],
        "messages_across_pumps": cross,
        "violation_count": violation_count,
        "violations": violation_rows,
        "undelivered_count": sum(by_cause.values()),
        "undelivered_by_cause": by_cause,
        "undelivered": undelivered_rows,
        "latency_s": None if not overall["n"] else {
            "p50": overall["q"][0], "p90": overall["q"][1], "p99": overall["q"][2],
            "max": overall["max"]},
        "delivered_per_s": (overall["n"] / (overall["last"] - overall["first"])
                            if overall["n"] and overall["last"] > overall["first"] else None),
        "refusals": {r["reason"]: r["count"] for r in refusals.collect()},
        "message_size": None if size_stats[0] is None else {
            "min": size_stats[0], "mean": size_stats[1], "max": size_stats[2]},
    }
    if out is not None:
        target = Path(out)
        target.mkdir(parents=True, exist_ok=True)
        tables = {"links": links, "violations": violations, "undelivered": undelivered,
                  "latency": latency, "throughput": throughput, "refusals": refusals,
                  "sizes": sizes}
        for name, frame in tables.items():
            frame.write.mode("overwrite").parquet(str(target / name))
        per_second = sorted((r["second"], r["messages"]) for r in throughput.groupBy("second")
                            .agg(F.sum("messages").alias("messages")).collect())
        write_line_png(target / "throughput.png", [p[1] for p in per_second],
                       title="MESSAGES DELIVERED PER SECOND")
        histogram = _latency_histogram(journeys)
        write_bar_png(target / "latency.png", histogram, title="LATENCY HISTOGRAM LOG2 US")
        summary["out"] = str(target)
        (target / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    for frame in (events, violations, journeys, undelivered):
        frame.unpersist()
    return summary


def _latency_histogram(journeys: Any) -> list[tuple[str, int]]:
    from pyspark.sql import functions as F

    rows = (journeys.withColumn("b", F.when(F.col("latency") <= 1e-6, F.lit(0)).otherwise(
        F.ceil(F.log2(F.col("latency") * 1e6))).cast("int"))
        .groupBy("b").count().orderBy("b").collect())
    return [(f"{2 ** r['b']}", r["count"]) for r in rows]


# -- plots: PNG without a plotting library ------------------------------------------------

_FONT = {  # 3x5 glyphs, rows top to bottom, '#' is ink
    "0": ("###", "# #", "# #", "# #", "###"), "1": (" # ", "## ", " # ", " # ", "###"),
    "2": ("###", "  #", "###", "#  ", "###"), "3": ("###", "  #", " ##", "  #", "###"),
    "4": ("# #", "# #", "###", "  #", "  #"), "5": ("###", "#  ", "###", "  #", "###"),
    "6": ("###", "#  ", "###", "# #", "###"), "7": ("###", "  #", "  #", "  #", "  #"),
    "8": ("###", "# #", "###", "# #", "###"), "9": ("###", "# #", "###", "  #", "###"),
    "A": (" # ", "# #", "###", "# #", "# #"), "C": ("###", "#  ", "#  ", "#  ", "###"),
    "D": ("## ", "# #", "# #", "# #", "## "), "E": ("###", "#  ", "## ", "#  ", "###"),
    "G": ("###", "#  ", "# #", "# #", "###"), "H": ("# #", "# #", "###", "# #", "# #"),
    "I": ("###", " # ", " # ", " # ", "###"), "K": ("# #", "## ", "#  ", "## ", "# #"),
    "L": ("#  ", "#  ", "#  ", "#  ", "###"), "M": ("# #", "###", "###", "# #", "# #"),
    "N": ("## ", "# #", "# #", "# #", "# #"), "O": ("###", "# #", "# #", "# #", "###"),
    "P": ("###", "# #", "###", "#  ", "#  "), "R": ("## ", "# #", "## ", "# #", "# #"),
    "S": ("###", "#  ", "###", "  #", "###"), "T": ("###", " # ", " # ", " # ", " # "),
    "U": ("# #", "# #", "# #", "# #", "###"), "V": ("# #", "# #", "# #", "# #", " # "),
    "Y": ("# #", "# #", " # ", " # ", " # "), ".": ("   ", "   ", "   ", "   ", " # "),
    "-": ("   ", "   ", "###", "   ", "   "),
}


def _glyph(ch: str) -> tuple[str, ...]:
    return _FONT.get(ch, ("   ",) * 5)


class _Canvas:
    def __init__(self, width: int, height: int) -> None:
        self.w, self.h = width, height
        self.px = bytearray(b"\xff\xff\xff" * width * height)

    def dot(self, x: int, y: int, rgb: tuple[int, int, int]) -> None:
        if 0 <= x < self.w and 0 <= y < self.h:
            i = 3 * (y * self.w + x)
            self.px[i:i + 3] = bytes(rgb)

    def rect(self, x0: int, y0: int, x1: int, y1: int, rgb: tuple[int, int, int]) -> None:
        for y in range(max(0, min(y0, y1)), min(self.h, max(y0, y1) + 1)):
            for x in range(max(0, min(x0, x1)), min(self.w, max(x0, x1) + 1)):
                self.dot(x, y, rgb)

    def line(self, x0: int, y0: int, x1: int, y1: int, rgb: tuple[int, int, int]) -> None:
        steps = max(abs(x1 - x0), abs(y1 - y0), 1)
        for i in range(steps + 1):
            self.rect(round(x0 + (x1 - x0) * i / steps), round(y0 + (y1 - y0) * i / steps),
                      round(x0 + (x1 - x0) * i / steps) + 1,
                      round(y0 + (y1 - y0) * i / steps) + 1, rgb)

    def text(self, x: int, y: int, s: str, scale: int = 2) -> None:
        for k, ch in enumerate(s.upper()):
            for row, bits in enumerate(_glyph(ch)):
                for col, bit in enumerate(bits):
                    if bit == "#":
                        self.rect(x + (4 * k + col) * scale, y + row * scale,
                                  x + (4 * k + col) * scale + scale - 1,
                                  y + row * scale + scale - 1, (0, 0, 0))

    def save(self, path: Path) -> None:
        raw = b"".join(b"\x00" + bytes(self.px[3 * self.w * y:3 * self.w * (y + 1)])
                       for y in range(self.h))

        def chunk(kind: bytes, data: bytes) -> bytes:
            return (struct.pack(">I", len(data)) + kind + data
                    + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))

        png = (b"\x89PNG\r\n\x1a\n"
               + chunk(b"IHDR", struct.pack(">IIBBBBB", self.w, self.h, 8, 2, 0, 0, 0))
               + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))
        path.write_bytes(png)


def _axes(c: _Canvas, title: str, top: float) -> tuple[int, int, int, int]:
    left, right, upper, lower = 70, c.w - 20, 40, c.h - 30
    c.text(left, 12, title)
    c.line(left, upper, left, lower, (0, 0, 0))
    c.line(left, lower, right, lower, (0, 0, 0))
    c.text(4, upper, _compact(top))
    c.text(4, lower - 10, "0")
    return left, right, upper, lower


def _compact(v: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if v >= scale:
            return f"{v / scale:.1f}{unit}"
    return f"{v:.0f}"


def write_line_png(path: Path, values: Sequence[float], *, title: str) -> None:
    """A line plot of ``values`` (one per second) as a PNG."""
    c = _Canvas(640, 320)
    top = max(values, default=0) or 1
    left, right, upper, lower = _axes(c, title, top)
    n = len(values)
    pts = [(left + (right - left) * (i / max(n - 1, 1)), lower - (lower - upper) * v / top)
           for i, v in enumerate(values)]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:], strict=False):
        c.line(round(x0), round(y0), round(x1), round(y1), (31, 119, 180))
    if n == 1:
        c.rect(round(pts[0][0]) - 2, round(pts[0][1]) - 2, round(pts[0][0]) + 2,
               round(pts[0][1]) + 2, (31, 119, 180))
    c.text(left, lower + 8, f"{n} S")
    c.save(path)


def write_bar_png(path: Path, bars: Sequence[tuple[str, int]], *, title: str) -> None:
    """A bar chart of ``(label, count)`` as a PNG."""
    c = _Canvas(640, 320)
    top = max((v for _, v in bars), default=0) or 1
    left, right, upper, lower = _axes(c, title, top)
    n = max(len(bars), 1)
    width = (right - left) / n
    for i, (label, v) in enumerate(bars):
        x0 = round(left + i * width + 2)
        x1 = round(left + (i + 1) * width - 2)
        c.rect(x0, round(lower - (lower - upper) * v / top), x1, lower - 1, (31, 119, 180))
        if len(bars) <= 16:
            c.text(x0, lower + 8, label, scale=1)
    c.save(path)


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


def session(master: str | None = None, *, app: str = "rdvpump-replay",
            log4j: str | None = None, warehouse: str | None = None,
            driver_memory: str = "2g") -> Any:
    """A SparkSession; ``master`` None leaves it to spark-submit."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app)
    if master is not None:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        jopts = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
        if log4j:
            jopts = f"-Dlog4j.configurationFile=file:{log4j} " + jopts
        builder = (builder.master(master)
                   .config("spark.ui.enabled", "false")
                   .config("spark.ui.showConsoleProgress", "false")
                   .config("spark.sql.shuffle.partitions", "4")
                   .config("spark.default.parallelism", "2")
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
