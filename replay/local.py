"""The replay's engine in this process: the traces read into Arrow tables, the same work
as on Spark (:mod:`replay.fold`), no JVM.

For traces that fit in memory: every row is held while the analysis runs (about 100
bytes a row; ``rdvpump trace analyze --engine auto`` uses this engine for traces of up to
:data:`replay.sources.LOCAL_BYTES` on disk).  Parquet traces are read with pyarrow as
the Spark tasks read them (:func:`replay.fold.read_unit`); JSON Lines are read here, with
the rules of Spark's JSON reader in its permissive mode, so that a line is corrupt here
exactly when it is there: blank lines are skipped; a line that is not a JSON object, or
whose field has a value of the wrong type for the trace's schema (a string where a
number goes, a fraction or a number out of range where an integer goes, an object or a
list where a number goes), is a corrupt row; a number, ``true``/``false``, an object or a
list where a string goes is kept as its JSON text; fields that are not the trace's are
ignored.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pump import schema as _schema

from . import fold as _fold
from .measure import SUMMARY_LIMIT, Plan
from .sources import find_traces, parquet_metadata

#: The trace's columns with their Arrow types.
_TYPES = [(name, _fold.ARROW_TYPES[kind]) for name, kind in _schema.COLUMNS]
_INT_RANGE = {"int32": (-(1 << 31), (1 << 31) - 1), "int": (-(1 << 63), (1 << 63) - 1)}
#: Corrupt lines located, at most.
_LOCATED = 1000


def leave_pandas_out() -> None:
    """Tell pyarrow, in a process that runs only this engine, that pandas is absent.

    pyarrow imports pandas (if installed) the first time almost any of its functions
    runs, only to recognise pandas objects if it is handed any; this engine hands it
    none, and the import is a fifth of a small trace's analysis.  pyarrow tries the
    import once and remembers the outcome: here it fails, so nothing else imports it.
    A later ``to_pandas()`` still imports pandas then.  Not for a process where pyarrow
    may be handed pandas objects (Spark's driver, a notebook)."""
    import sys

    if "pandas" in sys.modules:
        return

    class _Absent:
        @staticmethod
        def find_spec(name: str, path: Any = None, target: Any = None) -> None:
            if name == "pandas":
                raise ModuleNotFoundError("left out", name=name)

    sys.meta_path.insert(0, _Absent)
    try:
        pa.array([0])  # the one import pyarrow tries
    finally:
        sys.meta_path.remove(_Absent)


class Local:
    """:class:`replay.analysis.Engine` in this process."""

    name = "local"

    def __init__(self, traces: str, progress: Callable[[str], None] | None = None) -> None:
        self.progress = progress
        self.stage("reading the traces")
        jsonl, parquet = find_traces(traces)
        self.tables: list[pa.Table] = []
        self.files: list[str] = []  # each table's file
        self.corrupt: list[dict[str, Any]] = []
        typed = list(_schema.COLUMNS)
        for index, path in enumerate(parquet):
            meta = parquet_metadata(path)
            offset = 0
            for group in range(meta.num_row_groups):
                self.tables.append(_fold.read_unit(path, group, index, offset, typed))
                self.files.append(os.path.abspath(path))
                offset += meta.row_group(group).num_rows
        for index, path in enumerate(jsonl, start=len(parquet)):
            self.tables.append(_read_jsonl(path, index, self.corrupt))
            self.files.append(os.path.abspath(path))
        self.listed: pa.Table | None = None

    def stage(self, what: str) -> None:
        if self.progress is not None:
            self.progress(what)

    def census(self) -> list[dict[str, Any]]:
        return _fold.merge_census(
            r for table in self.tables for r in _fold.census(table).to_pylist())

    def other_versions(self) -> list[tuple[str, int]]:
        found = set()
        for file, table in zip(self.files, self.tables, strict=True):
            good = table.filter(pc.invert(table.column("bad")))
            for version in pc.unique(good.column("v")).drop_null().to_pylist():
                if version != _schema.SCHEMA_VERSION:
                    found.add((file, version))
        return sorted(found)[:100]

    def corrupt_lines(self) -> list[dict[str, Any]]:
        return sorted(self.corrupt, key=lambda c: (c["file"], c["line"]))[:_LOCATED]

    def fold(self, plan: Plan) -> list[dict[str, Any]]:
        pieces = plan.pieces
        to = np.zeros(len(pieces), dtype=np.int64)
        blocks = ((piece, block) for table in self.tables
                  for _, piece, block in _fold.route(table, plan.sids, plan.offsets, pieces,
                                                     to, [0]))
        folded = _fold.fold(blocks, **plan.options)
        listed = folded.column("part").to_numpy() == _fold.LISTED
        self.listed = folded.filter(pa.array(listed))
        small: list[dict[str, Any]] = folded.filter(pa.array(~listed)).drop_columns(
            ["row"]).to_pylist()
        return small

    def listing(self, work: Callable[..., Any], args: tuple[Any, ...], schema: Any,
                extra: list[tuple[Any, ...]], count: int, out: str | None, name: str
                ) -> tuple[list[dict[str, Any]], bool]:
        del count, name  # the rows are all here; the driver writes the table
        assert self.listed is not None, "listing() comes after fold()"
        rows = work(self.listed, *args).to_pylist()
        rows += [dict(zip(schema.names, row, strict=True)) for row in extra]
        rows = _fold.in_order(rows, schema.names)
        # every row for the driver to write (this engine has them all in memory anyway);
        # without an output, only those the summary lists
        return (rows if out is not None else rows[:SUMMARY_LIMIT]), False

    def jobs(self) -> int:
        return 0

    def close(self) -> None:
        self.tables, self.listed = [], None


def _read_jsonl(path: str, index: int, corrupt: list[dict[str, Any]]) -> pa.Table:
    """The rows of a JSON Lines trace as an Arrow table of the trace's columns, with
    ``bad`` and ``ord`` (the file's index, then the row's place), as
    :func:`replay.fold.read_unit` gives a Parquet trace's; its corrupt lines added to
    ``corrupt`` (up to :data:`_LOCATED`).

    pyarrow's JSON reader reads a file whose every line is a good row (it refuses a line
    that is not an object, and a value of another type than the schema's, as the rules
    above do); a file it refuses, or with rows lacking a kind or a version, is read line
    by line."""
    table = _read_clean(path)
    if table is not None:
        rows = np.arange(table.num_rows, dtype=np.int64) + (index << 40)
        return table.append_column("bad", pa.array(np.zeros(table.num_rows, dtype=bool))
                                   ).append_column("ord", pa.array(rows))
    columns: dict[str, list[Any]] = {name: [] for name, _ in _TYPES}
    bad: list[bool] = []
    where = os.path.abspath(path)
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            line = raw.rstrip(b"\n").rstrip(b"\r")
            if not line.strip():
                continue
            row = _parse(line)
            broken = row is None or row["kind"] is None or row["v"] is None
            if row is None:
                row = dict.fromkeys(columns)
            for name, values in columns.items():
                values.append(row[name])
            bad.append(broken)
            if broken and len(corrupt) < _LOCATED:
                corrupt.append({"file": where, "line": number,
                                "text": line.decode("utf-8", "replace")[:200]})
    arrays = [pa.array(columns[name], type) for name, type in _TYPES]
    rows = np.arange(len(bad), dtype=np.int64) + (index << 40)
    return pa.table([*arrays, pa.array(bad, pa.bool_()), pa.array(rows)],
                    names=[*(name for name, _ in _TYPES), "bad", "ord"])


def _read_clean(path: str) -> pa.Table | None:
    """The file by pyarrow's JSON reader, or None if a line is corrupt or lacks a kind or
    a version."""
    import pyarrow.json as pj

    schema = pa.schema(_TYPES)
    try:
        table = pj.read_json(path, read_options=pj.ReadOptions(use_threads=False,
                                                               block_size=16 << 20),
                             parse_options=pj.ParseOptions(
                                 explicit_schema=schema, unexpected_field_behavior="ignore"))
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return None
    if table.column("kind").null_count or table.column("v").null_count:
        return None
    return table.select(schema.names).combine_chunks()


def _parse(line: bytes) -> dict[str, Any] | None:
    """One line as a row of the trace's columns, or None when it is corrupt."""
    try:
        value = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(value, dict):
        return None
    row: dict[str, Any] = {}
    for name, kind in _schema.COLUMNS:
        field = value.get(name)
        if field is None:
            row[name] = None
        elif kind == "str":
            row[name] = field if isinstance(field, str) else json.dumps(
                field, separators=(",", ":"))
        elif kind == "float":
            if isinstance(field, bool) or not isinstance(field, int | float):
                return None
            row[name] = float(field)
        else:
            if type(field) is not int:
                return None
            low, high = _INT_RANGE[kind]
            if not low <= field <= high:
                return None
            row[name] = field
    return row
