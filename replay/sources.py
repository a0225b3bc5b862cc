"""Where the replay's rows come from: the trace files of a directory (or one file), each
checked before an engine starts, and which engine their size calls for.

Nothing here reads rows: the engines do (:mod:`replay.local` in this process,
:mod:`replay.job` on Spark), each from the files found here.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pump import RdvpumpError
from pump import schema as _schema

#: The trace schema version the replay reads (pump/schema.py is the one definition).
SCHEMA_VERSION: int = _schema.SCHEMA_VERSION

#: What an error about traces of an older schema version adds.
OLDER = ("; traces of an older schema are not read (version 2 kept the monotonic clock in "
         "'reason' and named disconnects 'error'): record the run again with this rdvpump")


class TraceError(RdvpumpError, ValueError):
    """The traces cannot be analysed (missing, empty, another schema version)."""


def find_traces(traces: str) -> tuple[list[str], list[str]]:
    """The JSON Lines and Parquet files of a trace directory (or one trace file)."""
    path = Path(traces)
    if not path.exists():
        raise TraceError(f"no such trace directory: {traces}")
    one = not path.is_dir()  # a file named itself (or a device: read as one, or refused)
    files = [path] if one else sorted(p for p in path.iterdir() if p.is_file())
    jsonl = [str(p) for p in files if p.suffix == ".jsonl"]
    parquet = [str(p) for p in files if p.suffix == ".parquet"]
    if not jsonl and not parquet:
        if one:
            raise TraceError(f"{traces} is not a trace file (*.jsonl, *.parquet) or a "
                             "directory of them")
        raise TraceError(f"no trace files (*.jsonl, *.parquet) in {traces}")
    return jsonl, parquet


def check_traces(traces: str) -> tuple[list[str], list[str]]:
    """:func:`find_traces`, each Parquet trace readable with the trace's columns (from its
    footer: no rows are read), and the first row of each file of this schema version,
    so that what is no trace, or a trace this version does not read, is said before a
    JVM starts.  (The engines check every row's version.)"""
    jsonl, parquet = find_traces(traces)
    other: list[tuple[str, int]] = []
    for path in parquet:
        meta = parquet_metadata(path)
        if meta.num_row_groups and meta.row_group(0).num_rows:
            stats = meta.row_group(0).column(meta.schema.names.index("v")).statistics
            if stats is not None and stats.has_min_max:
                other += [(path, v) for v in sorted({stats.min, stats.max})
                          if v != SCHEMA_VERSION]
    for path in jsonl:
        version = _first_version(path)
        if version is not None and version != SCHEMA_VERSION:
            other.append((path, version))
    if other:
        listing = "; ".join(f"{f} has version {v}" for f, v in other[:5])
        raise TraceError(f"trace schema version {SCHEMA_VERSION} expected: {listing}"
                         + (OLDER if any(v < SCHEMA_VERSION for _, v in other) else ""))
    return jsonl, parquet


def _first_version(path: str, lines: int = 10) -> int | None:
    """The schema version of the first trace row among a JSON Lines file's first
    ``lines`` lines (corrupt ones are skipped here and reported by the engines)."""
    import json

    with open(path, "rb") as f:
        for _, line in zip(range(lines), f, strict=False):
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and isinstance(row.get("v"), int):
                return int(row["v"])
    return None


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
            f"{', '.join(map(str, sorted(found))) or 'none'}{OLDER}")


#: Traces smaller than this on disk (JSON Lines, Parquet: about 400,000 events either way)
#: are analysed in this process by default (``engine_for``), larger ones on Spark.
LOCAL_BYTES = {"jsonl": 64 << 20, "parquet": 8 << 20}


def under(traces: str, limits: dict[str, int]) -> bool:
    """Whether the traces are smaller than ``limits`` (bytes on disk per format, JSON
    Lines and Parquet each counting for their share)."""
    jsonl, parquet = find_traces(traces)
    share = (sum(os.path.getsize(f) for f in jsonl) / limits["jsonl"]
             + sum(os.path.getsize(f) for f in parquet) / limits["parquet"])
    return share < 1


def engine_for(traces: str) -> str:
    """"local" for traces under :data:`LOCAL_BYTES`, else "spark"."""
    return "local" if under(traces, LOCAL_BYTES) else "spark"
