"""The replay job's work inside Spark tasks, on Arrow tables (pyarrow and numpy only).

:mod:`replay.job` wires these into Spark; nothing here imports pyspark, and the job ships
this module to the workers by value, so that they need neither rdvpump nor this file.

- :func:`read_unit` reads one row group of a Parquet trace: the dictionary-encoded
  strings stay codes, nothing is decoded row by row.
- :func:`census` takes the census of one table of trace rows (counts and times per pump,
  kind, stream and link event), a partial that the driver adds up (:func:`merge_census`).
- :func:`route` cuts the message rows of one table into one Arrow block per piece of a
  stream: the map side of the job's one shuffle, keyed by stream (run, link, dir).  A
  piece is a stream's whole, or, for a long stream, a range of its sequence numbers
  (:func:`pieces`), so that a task holds at most :data:`PIECE_ROWS` rows at once.
- :func:`fold` folds one reduce partition's pieces, one at a time: one row per
  (stream, seq), the FIFO check in seq order, then every figure that needs the
  messages, grouped; and each piece's first and last delivery, for the driver to check
  FIFO across the pieces of a stream (:func:`across_pieces`).  The blocks wait for
  their piece's turn in memory up to :data:`HELD_BYTES`, then in a file.

Null semantics are those of the SQL the job used before (a minimum skips nulls and is
null when every value is; a count counts values; a comparison with a null is not a hit).

One module although it is long: it is what the job ships to the workers by value, and
its functions are the hot path of either engine (every row of a trace goes through
:func:`census`, :func:`route` and :func:`fold`, vectorised with numpy; the longest
functions are the fold's groupings, each a run of array operations over one piece).
"""

from __future__ import annotations

import io
import math
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pump import schema as _schema

# the trace's words, from its schema (re-exported: the engines and the benchmark use them)
Kind, Cause, Violation = _schema.Kind, _schema.Cause, _schema.Violation
LIFE_KINDS, MESSAGE_KINDS, VIOLATIONS = (_schema.LIFE_KINDS, _schema.MESSAGE_KINDS,
                                         _schema.VIOLATIONS)

#: The trace's string columns, read as dictionaries.
STRINGS = ("run", "pump", "kind", "broker", "peer", "link", "dir", "outcome", "reason")
#: The Arrow type of each trace column (pump/schema.py's kinds).
ARROW_TYPES = {"int32": pa.int32(), "int": pa.int64(), "float": pa.float64(), "str": pa.string()}


#: The census's group: what the driver's ``_Census`` reads of each row, with these sums.
CENSUS_KEYS = ("bad", "v", "run", "pump", "kind", "broker", "link", "dir", "peer", "port",
               "connect_time", "reason", "outcome")
CENSUS_SCHEMA = pa.schema([
    ("bad", pa.bool_()), ("v", pa.int32()), ("run", pa.string()), ("pump", pa.string()),
    ("kind", pa.string()), ("broker", pa.string()), ("link", pa.string()),
    ("dir", pa.string()), ("peer", pa.string()), ("port", pa.int64()),
    ("connect_time", pa.float64()), ("reason", pa.string()), ("outcome", pa.string()),
    ("n", pa.int64()), ("t0", pa.float64()), ("t1", pa.float64()), ("bytes", pa.int64()),
    ("min_size", pa.int64()), ("max_size", pa.int64()), ("clock_at", pa.float64()),
    ("clock", pa.float64()), ("min_seq", pa.int64()), ("max_seq", pa.int64())])

#: The columns each pass reads (``bad`` needs kind and v).
CENSUS_COLUMNS = ("v", "run", "pump", "kind", "broker", "link", "dir", "peer", "port", "time",
                  "reason", "outcome", "size", "monotonic", "seq")
ROUTE_COLUMNS = ("v", "run", "pump", "kind", "link", "dir", "time", "seq", "size", "step")

#: One message row on its way through the shuffle.
ROUTED = pa.schema([("sid", pa.int32()), ("seq", pa.int64()), ("send", pa.bool_()),
                    ("at", pa.float64()), ("size", pa.int64()), ("step", pa.int64()),
                    ("ord", pa.int64())])

# The parts of the one aggregation (the rows of :func:`fold`'s result), by ``part``;
# FIRST and LAST: a piece's first and last delivery in seq order (k1 the piece, k2 the
# seq, with step and ord).
BIN, SECOND, LATENCY, HISTOGRAM, LISTED, FIRST, LAST = range(7)
#: The most rows of a stream folded at once: a longer stream is cut into pieces by seq
#: (a fold holds about 250 bytes a row).
PIECE_ROWS = 1_000_000
#: The least latency the buckets tell apart: less (zero and negative ones, from clocks
#: out of line, included) counts as this.
LEAST_LATENCY_S = 1e-9
#: The most bytes of shuffled blocks a reduce task holds in memory while it waits for
#: all of them; past that, they wait in a temporary file (:class:`_Held`).
HELD_BYTES = 64 << 20
LISTED_ROW = pa.struct([("seq", pa.int64()), ("sends", pa.int64()),
                        ("deliveries", pa.int64()), ("late", pa.int64()),
                        ("size", pa.int64()), ("size_max", pa.int64()),
                        ("delivered_size", pa.int64()), ("delivered_size_max", pa.int64()),
                        ("sent_at", pa.float64())])
FOLDED = pa.schema([
    ("sid", pa.int64()), ("part", pa.int32()), ("k1", pa.int64()), ("k2", pa.int64()),
    ("row", LISTED_ROW), ("journeys", pa.int64()), ("messages", pa.int64()),
    ("bytes", pa.int64()), ("delivered_bytes", pa.int64()), ("max", pa.float64()),
    ("first", pa.float64()), ("last", pa.float64()), ("undelivered", pa.int64()),
    *[(name, pa.int64()) for name in VIOLATIONS], ("step", pa.int64()), ("ord", pa.int64())])


# -- reading ------------------------------------------------------------------------------


def read_unit(path: str, row_group: int, file_index: int, offset: int,
              columns: Sequence[tuple[str, str]]) -> pa.Table:
    """One row group of a Parquet trace, its columns of the trace schema's types (strings
    as dictionaries), with ``bad`` (no kind or no version) and ``ord`` (the row's place:
    the file's index, then its row number in the file)."""
    import pyarrow.parquet as pq

    names = [name for name, _ in columns]
    table = pq.ParquetFile(path, read_dictionary=[n for n in names if n in STRINGS]
                           ).read_row_group(row_group, columns=names, use_threads=False)
    arrays = []
    for name, kind in columns:
        column = table.column(name)
        if name in STRINGS:
            if not pa.types.is_dictionary(column.type):
                column = pc.dictionary_encode(column.cast(pa.string()))
        elif column.type != ARROW_TYPES[kind]:
            column = column.cast(ARROW_TYPES[kind])
        arrays.append(column)
    table = pa.table(arrays, names=names).unify_dictionaries().combine_chunks()
    bad = pc.or_(pc.is_null(table.column("kind")), pc.is_null(table.column("v")))
    rows = np.arange(offset, offset + table.num_rows, dtype=np.int64) + (file_index << 40)
    return table.append_column("bad", bad).append_column("ord", pa.array(rows))


class _Strings:
    """A string column as codes (-1 for null) and its dictionary."""

    def __init__(self, column: Any) -> None:
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
        if not pa.types.is_dictionary(column.type):
            column = pc.dictionary_encode(column)
        self.words: list[str | None] = column.dictionary.to_pylist()
        self.codes = column.indices.fill_null(-1).to_numpy(zero_copy_only=False)

    def has(self, *words: str) -> np.ndarray:
        """Which rows hold one of ``words``."""
        hit = np.array([w in words for w in self.words] + [False])
        rows: np.ndarray = hit[self.codes]
        return rows

    def decode(self, codes: np.ndarray) -> pa.Array:
        words = np.array([*self.words, None], dtype=object)
        return pa.array(words[codes], pa.string())


def _numbers(column: Any, dtype: Any) -> tuple[np.ndarray, np.ndarray]:
    """A numeric column as values (nulls as 0) and validity."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    if column.null_count == 0:
        values = column.to_numpy(zero_copy_only=False).astype(dtype, copy=False)
        return values, np.ones(len(values), dtype=bool)
    valid = column.is_valid().to_numpy(zero_copy_only=False)
    values = column.fill_null(0).to_numpy(zero_copy_only=False).astype(dtype, copy=False)
    return values, valid


# -- the census ---------------------------------------------------------------------------


def census(table: pa.Table) -> pa.Table:
    """The census of one table of trace rows (with ``bad``): counts, first and last time,
    bytes and sizes per pump, kind and the fields that matter to that kind (the stream
    for messages, the link, peer, port, reason and outcome for a link's life), and for
    clock rows the pump's clock offset at its last one.  Bad rows are one group.  One
    function although long: the hot path of every trace row, one pass of array
    operations over columns it decodes once."""
    kind = _Strings(table.column("kind"))
    bad = table.column("bad").to_numpy(zero_copy_only=False)
    good = ~bad
    msg, life, refuse = (kind.has(*MESSAGE_KINDS) & good, kind.has(*LIFE_KINDS) & good,
                         kind.has(Kind.REFUSE) & good)
    strings = {name: _Strings(table.column(name)) for name in
               ("run", "pump", "broker", "link", "dir", "peer", "reason", "outcome")}
    where = {"run": good, "pump": good, "broker": msg | life | refuse, "link": msg | life,
             "dir": msg, "peer": kind.has(Kind.ACCEPT, Kind.CONNECT, Kind.REFUSE) & good,
             "reason": life | refuse, "outcome": (kind.has(Kind.DISCONNECT) & good) | refuse}
    codes = {name: np.where(where[name], strings[name].codes, -1) for name in where}
    kind_codes = np.where(good, kind.codes, -1)
    v, v_ok = _numbers(table.column("v"), np.int32)
    port, port_ok = _numbers(table.column("port"), np.int64)
    time, time_ok = _numbers(table.column("time"), np.float64)
    connect = kind.has(Kind.CONNECT) & good
    keyed = pa.table({
        "bad": pa.array(bad), "v": pa.array(v, mask=~(v_ok & good)),
        "run": codes["run"], "pump": codes["pump"], "kind": kind_codes,
        "broker": codes["broker"], "link": codes["link"], "dir": codes["dir"],
        "peer": codes["peer"],
        "port": pa.array(port, mask=~(port_ok & kind.has(Kind.ACCEPT, Kind.CONNECT) & good)),
        "connect_time": pa.array(time, mask=~(time_ok & connect)),
        "reason": codes["reason"], "outcome": codes["outcome"],
        "time": table.column("time"), "size": table.column("size"),
        "seq": table.column("seq")})
    grouped = keyed.group_by(list(CENSUS_KEYS), use_threads=False).aggregate([
        ("time", "count", pc.CountOptions(mode="all")), ("time", "min"), ("time", "max"),
        ("size", "sum"), ("size", "min"), ("size", "max"), ("seq", "min"), ("seq", "max")])
    # each clock group's offset at its last row (the latest time, then the largest offset)
    clocks: dict[tuple[int, int, int], tuple[float, float]] = {}
    clock_rows = np.nonzero(kind.has(Kind.CLOCK) & good & time_ok)[0]
    if len(clock_rows):
        mono, mono_ok = _numbers(table.column("monotonic"), np.float64)
        for i in clock_rows:
            if not mono_ok[i]:
                continue
            key = (int(v[i]), int(codes["run"][i]), int(codes["pump"][i]))
            seen = (float(time[i]), float(mono[i] - time[i]))
            if key not in clocks or seen > clocks[key]:
                clocks[key] = seen
    out_v = grouped.column("v").to_pylist()
    out_run = grouped.column("run").to_numpy()
    out_pump = grouped.column("pump").to_numpy()
    out_kind = grouped.column("kind").to_numpy()
    clock_word = kind.words.index(Kind.CLOCK) if Kind.CLOCK in kind.words else -2
    at = [clocks.get((out_v[i], int(out_run[i]), int(out_pump[i])), (None, None))
          if out_kind[i] == clock_word else (None, None) for i in range(grouped.num_rows)]
    columns = {
        "bad": grouped.column("bad"), "v": grouped.column("v"),
        **{name: strings[name].decode(grouped.column(name).to_numpy())
           for name in ("run", "pump")},
        "kind": kind.decode(out_kind),
        **{name: strings[name].decode(grouped.column(name).to_numpy())
           for name in ("broker", "link", "dir", "peer")},
        "port": grouped.column("port"), "connect_time": grouped.column("connect_time"),
        **{name: strings[name].decode(grouped.column(name).to_numpy())
           for name in ("reason", "outcome")},
        "n": grouped.column("time_count"), "t0": grouped.column("time_min"),
        "t1": grouped.column("time_max"), "bytes": grouped.column("size_sum"),
        "min_size": grouped.column("size_min"), "max_size": grouped.column("size_max"),
        "clock_at": pa.array([a for a, _ in at], pa.float64()),
        "clock": pa.array([c for _, c in at], pa.float64()),
        "min_seq": grouped.column("seq_min"), "max_seq": grouped.column("seq_max")}
    return pa.table([columns[f.name].cast(f.type) for f in CENSUS_SCHEMA],
                    schema=CENSUS_SCHEMA)


def merge_census(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The partial censuses of every table added up: one row per group."""
    merged: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in rows:
        key = tuple(r[k] for k in CENSUS_KEYS)
        m = merged.get(key)
        if m is None:
            merged[key] = dict(r)
            continue
        m["n"] += r["n"]
        m["t0"] = smaller(m["t0"], r["t0"])
        m["t1"] = larger(m["t1"], r["t1"])
        m["bytes"] = r["bytes"] if m["bytes"] is None else \
            m["bytes"] + (r["bytes"] or 0)
        m["min_size"] = smaller(m["min_size"], r["min_size"])
        m["max_size"] = larger(m["max_size"], r["max_size"])
        m["min_seq"] = smaller(m["min_seq"], r["min_seq"])
        m["max_seq"] = larger(m["max_seq"], r["max_seq"])
        if r["clock_at"] is not None and (m["clock_at"] is None or (
                r["clock_at"], r["clock"]) > (m["clock_at"], m["clock"])):
            m["clock_at"], m["clock"] = r["clock_at"], r["clock"]
    return list(merged.values())


def smaller(a: Any, b: Any) -> Any:
    """The smaller of two values, a None being no value."""
    return b if a is None else a if b is None else min(a, b)


def larger(a: Any, b: Any) -> Any:
    """The larger of two values, a None being no value."""
    return b if a is None else a if b is None else max(a, b)


# -- the listings -------------------------------------------------------------------------

#: A row of the violations listing: the message's stream and seq (for a delivery out of
#: order, the late one), what it broke and how.
VIOLATION_ROWS = pa.schema([("run", pa.string()), ("link", pa.string()), ("dir", pa.string()),
                            ("seq", pa.int64()), ("violation", pa.string()),
                            ("detail", pa.string())])
#: A row of the undelivered listing: the message, its sender, and why it was not
#: delivered (its link's end; ``service``: on a link of the name service).
UNDELIVERED_ROWS = pa.schema([
    ("run", pa.string()), ("link", pa.string()), ("dir", pa.string()), ("seq", pa.int64()),
    ("sender", pa.string()), ("sent_at", pa.float64()), ("size", pa.int64()),
    ("cause", pa.string()), ("end_reason", pa.string()), ("service", pa.bool_())])


def violations(listed: pa.Table, streams: Mapping[int, tuple[Any, ...]]) -> pa.Table:
    """Each broken invariant of the listed rows of :func:`fold` (:data:`FOLDED`, part
    :data:`LISTED`), as a :data:`VIOLATION_ROWS` row; ``streams`` names each sid's
    stream (run, link, dir).  Which invariants a message broke is the fold's flags."""
    out = []
    flags = [listed.column(name).to_pylist() for name in VIOLATIONS]
    for i, (sid, r) in enumerate(zip(listed.column("sid").to_pylist(),
                                     listed.column("row").to_pylist(), strict=True)):
        stream = streams[sid]
        for name, flag in zip(VIOLATIONS, flags, strict=True):
            if flag[i]:
                seq, detail = _broken(name, r)
                out.append((*stream, seq, name, detail))
    return pa.Table.from_pylist([dict(zip(VIOLATION_ROWS.names, row, strict=True))
                                 for row in out], schema=VIOLATION_ROWS)


def _broken(name: str, r: Mapping[str, Any]) -> tuple[int | None, str]:
    """The seq a violation is listed under, and its detail."""
    if name == Violation.DUPLICATE_SEND:
        return r["seq"], f"sent {r['sends']} times"
    if name == Violation.DUPLICATE_DELIVERY:
        return r["seq"], f"delivered {r['deliveries']} times"
    if name == Violation.NEVER_SENT:
        return r["seq"], f"delivered {r['deliveries']} times, never sent"
    if name == Violation.OUT_OF_ORDER:
        return r["late"], f"delivered after seq {_text(r['seq'])}"
    delivered = r["delivered_size"] if r["delivered_size"] != r["size"] \
        else r["delivered_size_max"]
    return r["seq"], f"sent {_text(r['size'])} bytes, delivered {_text(delivered)}"


def _text(value: Any) -> str:
    return "?" if value is None else str(value)


def undelivered(listed: pa.Table, streams: Mapping[int, tuple[Any, ...]],
                ends: Mapping[int, tuple[Any, ...]]) -> pa.Table:
    """The listed rows of :func:`fold` that were sent and never delivered, as
    :data:`UNDELIVERED_ROWS` rows; ``ends`` gives each sid's sender, cause, link end
    and whether it is the name service's (a stream it lacks: no sender, "run ended")."""
    out = []
    for sid, r, missing in zip(listed.column("sid").to_pylist(),
                               listed.column("row").to_pylist(),
                               listed.column("undelivered").to_pylist(), strict=True):
        if missing:
            sender, cause, end, service = ends.get(sid, (None, Cause.RUN_ENDED, None, False))
            out.append(dict(zip(UNDELIVERED_ROWS.names, (
                *streams[sid], r["seq"], sender, r["sent_at"], r["size"], cause, end,
                service), strict=True)))
    return pa.Table.from_pylist(out, schema=UNDELIVERED_ROWS)


def in_order(rows: Iterable[Mapping[str, Any]], columns: Sequence[str]) -> list[Any]:
    """``rows`` sorted by ``columns`` in turn, a null before any value (as Spark's
    ``orderBy`` sorts; strings in code point order, which is UTF-8's byte order)."""
    return sorted(rows, key=lambda r: tuple((r[c] is not None, r[c] if r[c] is not None
                                             else 0) for c in columns))


# -- the shuffle's map side ---------------------------------------------------------------


class Pieces:
    """Each stream cut into pieces of at most about :data:`PIECE_ROWS` rows by ranges of
    seq of equal width (a null seq in the stream's first piece); pieces are numbered in
    stream order, each stream's in seq order."""

    def __init__(self, rows: Sequence[int], lows: Sequence[int | None],
                 highs: Sequence[int | None], most: int = PIECE_ROWS) -> None:
        count, low, width = [], [], []
        for n, lo, hi in zip(rows, lows, highs, strict=True):
            span = 1 if lo is None or hi is None else hi - lo + 1
            c = max(1, min(math.ceil(n / max(most, 1)), span))
            count.append(c)
            low.append(0 if lo is None else lo)
            width.append(math.ceil(span / c))
        self.count = np.array(count, dtype=np.int64)
        self.low = np.array(low, dtype=np.int64)
        self.width = np.array(width, dtype=np.int64)
        self.base = np.concatenate([[0], np.cumsum(self.count)[:-1]]).astype(np.int64)
        #: each piece's stream, and its rows as the census counted them (spread evenly)
        self.sid = np.repeat(np.arange(len(count)), self.count)
        self.rows = np.concatenate([[n / c] * c for n, c in zip(rows, count, strict=True)]
                                   ) if count else np.zeros(0)

    def __len__(self) -> int:
        return int(self.count.sum())

    def of(self, sid: np.ndarray, seq: np.ndarray, seq_ok: np.ndarray) -> np.ndarray:
        """The piece of each row."""
        at = (seq - self.low[sid]) // self.width[sid]
        at = np.where(seq_ok, np.clip(at, 0, self.count[sid] - 1), 0)
        piece: np.ndarray = self.base[sid] + at
        return piece


def route(table: pa.Table, sids: Mapping[tuple[Any, ...], int],
          offsets: Mapping[tuple[Any, ...], float], pieces: Pieces, partition: np.ndarray,
          keys: Sequence[int]) -> list[tuple[int, int, bytes]]:
    """The message rows of ``table`` as (key, piece, block): one Arrow IPC block (LZ4) per
    piece of a stream (:class:`Pieces`), sorted by seq, ``key`` being the shuffle key that
    sends it to the piece's reduce partition (``partition``, by piece).

    ``sids`` numbers every stream (run, link, dir) of the census; ``offsets`` shifts each
    (run, pump)'s times onto the machine's monotonic clock."""
    kind = _Strings(table.column("kind"))
    good = ~table.column("bad").to_numpy(zero_copy_only=False)
    rows = np.nonzero(good & kind.has(*MESSAGE_KINDS))[0]
    if not len(rows):
        return []
    run, link, dir_, pump = (_Strings(table.column(n)) for n in ("run", "link", "dir", "pump"))
    sid = _lookup(rows, (run, link, dir_), lambda words: sids[words]).astype(np.int64)
    at, at_ok = _numbers(table.column("time"), np.float64)
    at = at[rows]
    if offsets:
        at = at + _lookup(rows, (run, pump), lambda words: offsets.get(words, 0.0))
    send = kind.has(Kind.SEND)[rows]
    seq, seq_ok = _numbers(table.column("seq"), np.int64)
    seq, seq_ok = seq[rows], seq_ok[rows]

    def column(name: str) -> pa.Array:
        values, ok = _numbers(table.column(name), np.int64)
        return pa.array(values[rows], mask=~ok[rows])

    routed = pa.table([pa.array(sid.astype(np.int32)), pa.array(seq, mask=~seq_ok),
                       pa.array(send), pa.array(at, mask=~at_ok[rows]), column("size"),
                       column("step"), pa.array(table.column("ord").to_numpy()[rows])],
                      schema=ROUTED)
    piece = pieces.of(sid, seq, seq_ok)
    order = np.lexsort((np.where(seq_ok, seq, -1), piece))
    bounds = np.flatnonzero(np.diff(piece[order])) + 1
    blocks = []
    options = pa.ipc.IpcWriteOptions(compression="lz4")  # a third of the bytes to shuffle
    for run_ in np.split(order, bounds):
        p = int(piece[run_[0]])
        sink = io.BytesIO()
        with pa.ipc.new_stream(sink, ROUTED, options=options) as writer:
            writer.write_table(routed.take(run_))
        blocks.append((keys[int(partition[p])], p, sink.getvalue()))
    return blocks


def _lookup(rows: np.ndarray, columns: Sequence[_Strings], value: Any) -> np.ndarray:
    """``value(words)`` for each row's words in ``columns``, computed once per distinct
    combination."""
    combined = np.zeros(len(rows), dtype=np.int64)
    for c in columns:
        combined = combined * (len(c.words) + 1) + (c.codes[rows].astype(np.int64) + 1)
    distinct, inverse = np.unique(combined, return_inverse=True)
    found = []
    for code in distinct.tolist():
        words = []
        for c in reversed(columns):
            code, i = divmod(code, len(c.words) + 1)
            words.append(None if i == 0 else c.words[i - 1])
        found.append(value(tuple(reversed(words))))
    return np.asarray(found)[inverse]


# -- the shuffle's reduce side ------------------------------------------------------------


def fold(blocks: Iterable[tuple[int, bytes]], *, start: float, width: float,
         per_second: bool, fine_per_decade: int, buckets_per_decade: int,
         held_bytes: int = HELD_BYTES) -> pa.Table:
    """Every figure of the message rows in ``blocks`` ((piece, block) pairs, each piece
    whole), folded a piece at a time: each (stream, seq) folded, FIFO checked in seq
    order within the piece, then counted in its groups, and the piece's first and last
    delivery (:data:`FOLDED`).  The blocks wait in memory up to ``held_bytes``, then in
    a temporary file (:class:`_Held`)."""
    out = []
    with _Held(held_bytes) as held:
        for piece, block in blocks:
            held.add(piece, block)
        for piece in held.pieces():
            tables = [pa.ipc.open_stream(b).read_all() for b in held.pop(piece)]
            s = _per_seq(pa.concat_tables(tables).combine_chunks())
            out.append(_parts(s, start=start, width=width, per_second=per_second,
                              fine_per_decade=fine_per_decade,
                              buckets_per_decade=buckets_per_decade))
            out.append(_ends(s, piece))
    return pa.concat_tables(out) if out else FOLDED.empty_table()


class _Held:
    """A reduce task's blocks, by piece, until the last has come and each piece is
    folded: in memory up to ``most`` bytes, then all of them in a temporary file (in
    Spark's first local directory, ``SPARK_LOCAL_DIRS``, where Spark sets it), so that
    a task holds at most that much, plus the piece it folds, however large its
    partition."""

    def __init__(self, most: int) -> None:
        self.most, self.bytes = most, 0
        #: each piece's blocks: bytes, or once in the file, (offset, length)
        self.blocks: dict[int, list[Any]] = {}
        self.file: Any = None  # once blocks go to a file

    def __enter__(self) -> _Held:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.file is not None:
            self.file.close()  # created unlinked: closing it frees its disk

    def add(self, piece: int, block: bytes) -> None:
        if self.file is None and self.bytes + len(block) > self.most:
            local = os.environ.get("SPARK_LOCAL_DIRS", "").split(",")[0] or None
            self.file = tempfile.TemporaryFile(dir=local)  # noqa: SIM115 - closed on exit
            for held in self.blocks.values():
                held[:] = [self._write(b) for b in held]
        self.blocks.setdefault(piece, []).append(
            block if self.file is None else self._write(block))
        self.bytes += len(block)

    def _write(self, block: bytes) -> tuple[int, int]:
        at = self.file.tell()
        self.file.write(block)
        return at, len(block)

    def pieces(self) -> list[int]:
        if self.file is not None:
            self.file.flush()
        return sorted(self.blocks)

    def pop(self, piece: int) -> list[bytes]:
        held = self.blocks.pop(piece)
        if self.file is None:
            return held
        blocks = [os.pread(self.file.fileno(), n, at) for at, n in held]
        if any(len(b) != n for b, (_, n) in zip(blocks, held, strict=True)):
            raise OSError(f"a held block of piece {piece} came back short from "
                          f"{self.file.name}")
        return blocks


def _ends(s: dict[str, Any], piece: int) -> pa.Table:
    """The piece's first and last delivered seq (in seq order), with their place."""
    placed = np.flatnonzero(s["placed"])
    if not len(placed):
        return FOLDED.empty_table()
    ends = np.array([placed[0], placed[-1]])
    columns: dict[str, Any] = {
        "sid": pa.array(s["sid"][ends]), "part": pa.array([FIRST, LAST], pa.int32()),
        "k1": pa.array([piece, piece], pa.int64()),
        "k2": pa.array(s["seq"][ends], mask=~s["seq_ok"][ends]),
        "step": pa.array(s["step"][ends]), "ord": pa.array(s["ord"][ends])}
    return _folded(columns, 2)


def _folded(columns: Mapping[str, Any], n: int) -> pa.Table:
    """A table of :data:`FOLDED`, the columns not given null."""
    return pa.table([columns[f.name].cast(f.type) if f.name in columns
                     else pa.nulls(n, f.type) for f in FOLDED], schema=FOLDED)


def across_pieces(ends: Iterable[Mapping[str, Any]]) -> list[tuple[int, int, int | None]]:
    """FIFO across the pieces of each stream, from their :func:`_ends` rows: each
    piece's first delivery against the last delivery of the pieces before it.  Returns
    (sid, late seq, seq) for each pair out of pump order (step, then place), as the
    fold names a violation inside a piece."""
    first: dict[tuple[int, int], Mapping[str, Any]] = {}
    last: dict[tuple[int, int], Mapping[str, Any]] = {}
    for r in ends:
        (first if r["part"] == FIRST else last)[(r["sid"], r["k1"])] = r
    found = []
    before: dict[int, Mapping[str, Any]] = {}
    for sid, piece in sorted(set(first) | set(last)):
        f, b = first.get((sid, piece)), before.get(sid)
        if f is not None and b is not None and b["k2"] is not None and (
                (b["step"], b["ord"]) > (f["step"], f["ord"])):
            found.append((sid, b["k2"], f["k2"]))
        if (sid, piece) in last:
            before[sid] = last[(sid, piece)]
    return found


_BIG = np.iinfo(np.int64).max


def _per_seq(rows: pa.Table) -> dict[str, Any]:
    """One row per (sid, seq), in (sid, seq) order, nulls first (numpy arrays, with
    ``*_ok`` validity where a value may be null).

    FIFO holds on a stream when its deliveries, taken in seq order, come in pump order
    (step, then place in the file): each delivered seq is compared with the delivered
    seq before it, and a pair out of pump order is one violation, named by the lower seq
    (``late``: delivered after the higher one).  A seq delivered more than once (itself
    a violation) is placed at the least step and the least place of its deliveries.  One
    function although long: a hot path of the fold, whose arrays its steps share."""
    sid = rows.column("sid").to_numpy().astype(np.int64)
    seq, seq_ok = _numbers(rows.column("seq"), np.int64)
    send = rows.column("send").to_numpy(zero_copy_only=False)
    at, at_ok = _numbers(rows.column("at"), np.float64)
    size, size_ok = _numbers(rows.column("size"), np.int64)
    step, step_ok = _numbers(rows.column("step"), np.int64)
    ord_ = rows.column("ord").to_numpy()
    order = _seq_order(sid, seq, seq_ok)
    sid, seq, seq_ok, send = sid[order], seq[order], seq_ok[order], send[order]
    at, at_ok, size, size_ok = at[order], at_ok[order], size[order], size_ok[order]
    step, step_ok, ord_ = step[order], step_ok[order], ord_[order]
    new = np.ones(len(sid), dtype=bool)
    new[1:] = (sid[1:] != sid[:-1]) | (seq_ok[1:] != seq_ok[:-1]) | (seq[1:] != seq[:-1])
    starts = np.nonzero(new)[0]
    deliver = ~send

    def least(values: np.ndarray, where: np.ndarray, big: Any) -> tuple[np.ndarray,
                                                                        np.ndarray]:
        got = np.add.reduceat(where.astype(np.int64), starts) > 0
        return np.minimum.reduceat(np.where(where, values, big), starts), got

    def most(values: np.ndarray, where: np.ndarray, small: Any) -> tuple[np.ndarray,
                                                                        np.ndarray]:
        got = np.add.reduceat(where.astype(np.int64), starts) > 0
        return np.maximum.reduceat(np.where(where, values, small), starts), got

    out: dict[str, Any] = {"sid": sid[starts], "seq": seq[starts], "seq_ok": seq_ok[starts]}
    out["sends"] = np.add.reduceat(send.astype(np.int64), starts)
    out["deliveries"] = np.add.reduceat(deliver.astype(np.int64), starts)
    out["sent_at"], out["sent_at_ok"] = least(at, send & at_ok, np.inf)
    out["delivered_at"], out["delivered_at_ok"] = least(at, deliver & at_ok, np.inf)
    out["size"], out["size_ok"] = least(size, send & size_ok, _BIG)
    out["size_max"], out["size_max_ok"] = most(size, send & size_ok, -_BIG - 1)
    out["delivered_size"], out["delivered_size_ok"] = least(size, deliver & size_ok, _BIG)
    out["delivered_size_max"], out["delivered_size_max_ok"] = most(
        size, deliver & size_ok, -_BIG - 1)
    step_min, placed = least(step, deliver & step_ok, _BIG)
    ord_min, _ = least(ord_, deliver, _BIG)
    # FIFO: each delivered seq against the delivered seq before it in its stream
    n = len(starts)
    index = np.arange(n)
    last = np.maximum.accumulate(np.where(placed, index, -1))
    before = np.empty(n, dtype=np.int64)
    before[0] = -1
    before[1:] = last[:-1]
    same = before >= 0
    same[same] = out["sid"][before[same]] == out["sid"][same]
    b = np.where(same, before, 0)
    late = same & placed & ((step_min[b] > step_min)
                            | ((step_min[b] == step_min) & (ord_min[b] > ord_min)))
    out["late"], out["late_ok"] = out["seq"][b], late & out["seq_ok"][b]
    out["placed"], out["step"], out["ord"] = placed, step_min, ord_min
    out["latency_ok"] = out["sent_at_ok"] & out["delivered_at_ok"]
    out["latency"] = np.where(out["latency_ok"], out["delivered_at"] - out["sent_at"], 0.0)
    return out


def _seq_order(sid: np.ndarray, seq: np.ndarray, seq_ok: np.ndarray) -> np.ndarray:
    """The rows in (sid, seq) order, a null seq first.  Each block comes sorted from
    :func:`route`, so the rows are a few sorted runs: one stable sort of a packed key
    (timsort merges runs) where the numbers fit 63 bits, else a sort on three keys."""
    if len(seq) and sid.max() < 1 << 20 and seq.min() >= 0 and seq.max() < 1 << 42:
        key = (sid << 43) | (seq_ok.astype(np.int64) << 42) | seq
        order: np.ndarray = np.argsort(key, kind="stable")
        return order
    order = np.lexsort((seq, seq_ok, sid))
    return order


def _parts(s: dict[str, Any], *, start: float, width: float, per_second: bool,
           fine_per_decade: int, buckets_per_decade: int) -> pa.Table:
    """Every figure of one piece's (sid, seq) rows, as the folded table's parts.  One
    function although long: a hot path of the fold (every message row goes through it),
    a run of array operations over one piece whose intermediate arrays the groupings
    share; split, they would be passed around or computed again."""
    journey = s["latency_ok"]
    n = len(journey)
    sends, deliveries = s["sends"], s["deliveries"]
    undelivered = (sends > 0) & (deliveries == 0)
    mismatch = (sends > 0) & (deliveries > 0) & s["size_ok"] & (
        (s["size_max_ok"] & (s["size"] != s["size_max"]))
        | (s["delivered_size_ok"] & (s["delivered_size"] != s["size"]))
        | (s["delivered_size_max_ok"] & (s["delivered_size_max"] != s["size"])))
    flags = [sends > 1, deliveries > 1, (deliveries > 0) & (sends == 0), s["late_ok"],
             mismatch]
    listed = undelivered.copy()
    for flag in flags:
        listed |= flag

    def nullable(values: np.ndarray, ok: np.ndarray) -> pa.Array:
        return pa.array(values, mask=~ok)

    latency = nullable(s["latency"], journey)
    since = np.where(journey, s["delivered_at"] - start, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_latency = np.log10(np.maximum(s["latency"], LEAST_LATENCY_S))
    size_bucket = _size_buckets(s["size"])
    values = {
        "latency": latency,
        "size": nullable(s["size"], s["size_ok"]),
        "delivered_bytes": nullable(s["delivered_size"], journey & s["delivered_size_ok"]),
        "delivered_at": nullable(s["delivered_at"], journey),
        "undelivered": pa.array(undelivered.astype(np.int64)),
        **{name: pa.array(flag.astype(np.int64)) for name, flag in zip(VIOLATIONS, flags,
                                                                       strict=True)}}
    aggregates = [("latency", "count"), ("size", "count"), ("size", "sum"),
                  ("delivered_bytes", "sum"), ("latency", "max"), ("delivered_at", "min"),
                  ("delivered_at", "max"), ("undelivered", "sum"),
                  *[(name, "sum") for name in VIOLATIONS]]
    names = ["journeys", "messages", "bytes", "delivered_bytes", "max", "first", "last",
             "undelivered", *VIOLATIONS]
    sid = pa.array(s["sid"])
    out = []

    def grouped(part: int, k1: pa.Array | None, k2: pa.Array | None, *,
                stream: bool = True, keyed_only: bool = False) -> None:
        """One part: the rows grouped by (sid, k1, k2); ``keyed_only``: the rows whose k1
        is null (not journeys) are grouped too, cheaper than a filter, then dropped."""
        keys = {"sid": sid if stream else pa.nulls(n, pa.int64()),
                "k1": k1 if k1 is not None else pa.nulls(n, pa.int64()),
                "k2": k2 if k2 is not None else pa.nulls(n, pa.int64())}
        if not n:
            return
        g = pa.table({**keys, **values}).group_by(["sid", "k1", "k2"], use_threads=False
                                                  ).aggregate(aggregates)
        if keyed_only:
            g = g.filter(pc.is_valid(g.column("k1")))
        columns = {"sid": g.column("sid"), "part": pa.array(np.full(g.num_rows, part,
                                                                    dtype=np.int32)),
                   "k1": g.column("k1"), "k2": g.column("k2"),
                   "row": pa.nulls(g.num_rows, LISTED_ROW)}
        for name, (column, how) in zip(names, aggregates, strict=True):
            columns[name] = g.column(f"{column}_{how}")
        out.append(_folded(columns, g.num_rows))

    grouped(BIN, nullable(np.floor(since / width).astype(np.int64), journey), None)
    if per_second:
        grouped(SECOND, nullable(np.floor(since).astype(np.int64), journey), None,
                keyed_only=True)
    grouped(LATENCY, nullable(np.floor(log_latency * fine_per_decade).astype(np.int64),
                              journey), None, keyed_only=True)
    grouped(HISTOGRAM, nullable(np.floor(log_latency * buckets_per_decade)
                                .astype(np.int64), journey),
            nullable(size_bucket, s["size_ok"]), stream=False)
    chosen = np.nonzero(listed)[0]
    if len(chosen):
        def pick(name: str, ok: str | None = None) -> pa.Array:
            values = s[name][chosen]
            return pa.array(values) if ok is None else pa.array(values, mask=~s[ok][chosen])

        row = pa.StructArray.from_arrays(
            [pick("seq", "seq_ok"), pick("sends"), pick("deliveries"),
             pick("late", "late_ok"), pick("size", "size_ok"),
             pick("size_max", "size_max_ok"), pick("delivered_size", "delivered_size_ok"),
             pick("delivered_size_max", "delivered_size_max_ok"),
             pick("sent_at", "sent_at_ok")], fields=list(LISTED_ROW))
        j = journey[chosen]
        columns = {
            "sid": pa.array(s["sid"][chosen]),
            "part": pa.array(np.full(len(chosen), LISTED, dtype=np.int32)),
            "k1": pa.nulls(len(chosen), pa.int64()), "k2": pa.nulls(len(chosen), pa.int64()),
            "row": row, "journeys": pa.array(j.astype(np.int64)),
            "messages": pa.array(s["size_ok"][chosen].astype(np.int64)),
            "bytes": values["size"].take(chosen),
            "delivered_bytes": values["delivered_bytes"].take(chosen),
            "max": latency.take(chosen), "first": values["delivered_at"].take(chosen),
            "last": values["delivered_at"].take(chosen),
            "undelivered": values["undelivered"].take(chosen),
            **{name: values[name].take(chosen) for name in VIOLATIONS}}
        out.append(_folded(columns, len(chosen)))
    return pa.concat_tables(out) if out else FOLDED.empty_table()


def _size_buckets(size: np.ndarray) -> np.ndarray:
    """0 for sizes of 0 or less, else the least power of two at or above the size (exact
    for sizes below 2**53: the bit length of size - 1, from its binary exponent)."""
    _, bits = np.frexp(np.maximum(size - 1, 0).astype(np.float64))
    return np.where(size <= 0, 0, np.left_shift(np.int64(1), bits.astype(np.int64)))


# -- the shuffle key ----------------------------------------------------------------------


def _murmur3_int(value: int, seed: int = 42) -> int:
    """Spark's ``hash`` of an int (Murmur3 x86_32 of 4 bytes, seed 42), signed."""
    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & 0xFFFFFFFF

    k = (value & 0xFFFFFFFF) * 0xCC9E2D51 & 0xFFFFFFFF
    k = rotl(k, 15) * 0x1B873593 & 0xFFFFFFFF
    h = seed ^ k
    h = (rotl(h, 13) * 5 + 0xE6546B64) & 0xFFFFFFFF
    h ^= 4
    h ^= h >> 16
    h = h * 0x85EBCA6B & 0xFFFFFFFF
    h ^= h >> 13
    h = h * 0xC2B2AE35 & 0xFFFFFFFF
    h ^= h >> 16
    return h - (1 << 32) if h >= 1 << 31 else h


def partition_keys(partitions: int) -> list[int]:
    """For each reduce partition p, the least int key that Spark's hash partitioning
    into ``partitions`` sends to p (pmod of its Murmur3 hash)."""
    keys: dict[int, int] = {}
    key = 0
    while len(keys) < partitions:
        keys.setdefault(_murmur3_int(key) % partitions, key)
        key += 1
    return [keys[p] for p in range(partitions)]


def assign(loads: Sequence[int], partitions: int) -> np.ndarray:
    """Each stream's reduce partition: the largest streams first, each to the partition
    with the least rows so far (ties to the lowest)."""
    heap = [0] * partitions
    to = np.zeros(max(len(loads), 1), dtype=np.int64)
    for i in sorted(range(len(loads)), key=lambda i: (-loads[i], i)):
        p = min(range(partitions), key=lambda p: (heap[p], p))
        heap[p] += loads[i]
        to[i] = p
    return to


def quantile_of(buckets: list[tuple[int, int, float]], qs: Sequence[float]) -> list[float]:
    """Percentiles from (bucket, count, largest value) rows: for each q, the largest value
    of the bucket where rank ceil(q n) falls (ranks from 1)."""
    ordered = sorted(buckets)
    n = sum(c for _, c, _ in ordered)
    found = []
    for q in qs:
        rank = max(math.ceil(n * q), 1)
        below = 0
        for _, count, largest in ordered:
            below += count
            if below >= rank:
                found.append(largest)
                break
    return found
