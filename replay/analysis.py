"""The replay's analysis, whatever runs it: check and measure pump traces.

:func:`analyze` takes an engine that does the work over the trace rows (the
:class:`~replay.measure.Engine` it asks for), and does the rest itself, one module per
step: the trace files and their checks (:mod:`replay.sources`), the census of the events
added up (:mod:`replay.census`), the fold of every stream's messages turned into figures
(:mod:`replay.measure`), and the summary, tables and plots (:mod:`replay.output`).  Two
engines do the same work with the same code (:mod:`replay.fold`, on Arrow tables):
:class:`replay.local.Local` in this process, for traces that fit in memory, and
:class:`replay.spark.Spark` on a SparkSession, local or a cluster.  Nothing here imports
pyspark; :mod:`replay.reference` is the executable specification both are held to.

Checks: every delivered message was sent; FIFO per link and direction (a delivery with a
lower sequence number than the one before it); no duplicate send or delivery; every
delivery has its send's size.  Each sent message that was never delivered is listed with
its cause: ``peer failed`` (a task of the link failed, or it ended on an error), ``link
closed with it in flight``, or ``run ended``.

Output in OUT (:mod:`replay.output`): Parquet tables, ``summary.json`` (counts, the
violations and undelivered messages, up to a limit) and three plots.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from replay import output as _output
from replay.census import Census
from replay.measure import Engine, measure


def analyze(traces: str, out: str | None = None, *, spark: Any = None,
            progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Check and measure the traces; write the tables and plots to ``out`` if given.

    ``spark`` None runs the analysis in this process (:class:`replay.local.Local`), a
    SparkSession runs it there (:class:`replay.spark.Spark`); the results are the same.
    Two passes over the traces, the work of each done on Arrow tables by
    :mod:`replay.fold`:

    1. a census of the events (counts and times per pump, kind, stream and link event;
       small), added up here;
    2. the message rows of each stream (run, link, dir) brought together, cut into
       pieces (the whole stream, or a range of seqs of a long one); each piece folded
       into one row per sequence number, FIFO checked in seq order, and every message
       counted in its groups (per-link figures, time bins, latency buckets, histograms,
       and the messages to list: :func:`replay.measure.measure`); FIFO where pieces meet is checked
       here.

    ``progress`` is told each stage; ``summary["engine"]`` names the engine and
    ``summary["spark_jobs"]`` counts the Spark jobs.
    """
    if spark is None:
        from replay.local import Local

        return run(Local(traces, progress), traces, out)
    from replay.spark import Spark

    return run(Spark(spark, traces, progress), traces, out)


def run(engine: Engine, traces: str, out: str | None = None) -> dict[str, Any]:
    """:func:`analyze` with ``engine``."""
    if out is not None:  # the imports of the writers, while the engine works
        threading.Thread(target=_import_writers, daemon=True).start()
    try:
        engine.stage("census of the events")
        census = Census(engine.census())
        census.check(traces, engine.other_versions)
        corrupt: list[dict[str, Any]] = []
        if census.corrupt:
            engine.stage("locating corrupt lines")
            corrupt = engine.corrupt_lines()
        engine.stage("matching sends and deliveries (one pass by link and direction)")
        found = measure(engine, census, out)
        summary = _output.summarize(traces, census, corrupt, found)
        if out is not None:
            engine.stage("writing tables and plots")
            _output.write(Path(out), census, found, summary)
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
