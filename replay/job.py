"""Replay pump traces with Spark: ``spark-submit replay/job.py --traces DIR --out DIR``.

Runs unchanged on any cluster (it needs pyspark, pyarrow, numpy and matplotlib, and
rdvpump installed or the checkout this file is in: see :func:`_checkout`; ``rich`` is
used when present).  The engine is :class:`replay.spark.Spark`, the analysis
:mod:`replay.analysis`'s.

Input: the trace files of one or many pumps in DIR (``*.jsonl`` and ``*.parquet``,
schema version :data:`~replay.sources.SCHEMA_VERSION`, defined in ``pump/schema.py``).
Output in OUT: the tables, ``summary.json`` and plots of :mod:`replay.output`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path


def _checkout() -> None:
    """Without rdvpump installed (``spark-submit`` of a checkout): the packages ``pump``
    and ``replay`` of the checkout this file is in, their modules imported from it by
    name as usual, but without running the packages' ``__init__`` (the pump's loads the
    compiled ring buffer); the modules the replay imports from ``pump`` (``schema`` and
    ``_errors``) need only the standard library."""
    import importlib.util

    root = Path(__file__).resolve().parents[1]
    for name in ("pump", "replay"):
        spec = importlib.util.spec_from_file_location(
            name, root / name / "__init__.py", submodule_search_locations=[str(root / name)])
        assert spec is not None
        sys.modules[name] = importlib.util.module_from_spec(spec)
    from pump._errors import RdvpumpError

    sys.modules["pump"].RdvpumpError = RdvpumpError  # type: ignore[attr-defined]


try:
    import pump  # noqa: F401 - rdvpump installed
except ImportError:
    _checkout()

from replay.analysis import run  # noqa: E402 - after the checkout's packages, if any
from replay.jvm import ending, start_spark  # noqa: E402
from replay.output import print_summary  # noqa: E402
from replay.sources import TraceError, find_traces  # noqa: E402
from replay.spark import Spark, size_shuffles  # noqa: E402


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--traces", required=True, help="directory of trace files")
    parser.add_argument("--out", required=True, help="directory for tables, summary, plots")
    parser.add_argument("--master", default=None, help="Spark master (spark-submit's default)")
    args = parser.parse_args(argv)
    try:
        jsonl, parquet = find_traces(args.traces)  # fail fast, before a JVM starts
    except TraceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        with ending(start_spark(args.master)) as spark:
            size_shuffles(spark, [*jsonl, *parquet])
            summary = run(Spark(spark, args.traces), args.traces, args.out)
    except TraceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print_summary(summary)
    return 1 if summary["violation_count"] else 0


if __name__ == "__main__":
    sys.exit(main())
