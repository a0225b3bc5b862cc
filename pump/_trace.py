"""Trace events: the schema every pump writes, the recorder, and its writers.

One schema, versioned, defined here and nowhere else.  A trace row is::

    v, run, pump, step, time, kind, broker, peer, port, link, dir, seq, size, outcome, reason

``v`` is :data:`SCHEMA_VERSION`; ``run`` names one run of a universe (all of
its pumps share it), ``pump`` the pump that wrote the row; ``step`` is the
number of the pump task during which it happened (0 before the first), and
``time`` the pump clock in seconds.  The other fields are set when they apply:

- ``broker`` the side the event happened on, ``peer`` the other side, ``port``
  the rendezvous port;
- ``link`` the link id, ``"<accepting broker>/<n>"``: unique in a universe,
  and the same string on both ends of a link, in one process or two;
- ``dir`` the direction of a message or of bytes on a link: ``"ca"`` from the
  connecting side to the accepting side, ``"ac"`` the other way;
- ``seq`` the message sequence number per link and direction (from 1);
- ``size`` a byte count; ``outcome`` and ``reason`` qualify the event.

Kinds: ``bind``, ``listen``, ``unbind``, ``connect``, ``accept``, ``refuse``
(reason), ``write`` and ``read`` (bytes moved through a ring; outcome
``partial`` when not everything fit), ``send`` and ``deliver`` (one per
message), ``protocol_error``, ``disconnect`` (outcome ``error`` or ``clean``),
``close`` (a listener was told), ``timer`` (a timer fired; outcome its kind),
``task`` (a pump step began; outcome the task's kind), ``fail`` (a task
raised), and the name service's ``expire`` and ``drop``.

The recorder keeps rows compactly (the fields that repeat, like broker and
link, are interned once as a *context*) and hands them to a writer in chunks:
:class:`JsonlWriter`, :class:`ParquetWriter`, or :class:`MemoryWriter`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from itertools import count, repeat
from pathlib import Path
from typing import Any, Protocol

#: Bumped whenever a field is added, removed or changes meaning.
SCHEMA_VERSION = 2

#: The columns of a trace row, in order.
FIELDS = ("v", "run", "pump", "step", "time", "kind", "broker", "peer", "port", "link", "dir",
          "seq", "size", "outcome", "reason")

#: The fields interned per context (everything but step, time, seq and size).
CONTEXT_FIELDS = ("kind", "broker", "peer", "port", "link", "dir", "outcome", "reason")

FORMATS = ("jsonl", "parquet")

#: Rows kept before they go to the writer.
DEFAULT_CHUNK_ROWS = 1 << 16

Context = tuple[str, str | None, str | None, int | None, str | None, str | None, str | None,
                str | None]
Row = tuple[int, float, int, int | None, int | None]  # step, time, context, seq, size


@dataclass(frozen=True, slots=True)
class TraceEvent:
    """One trace row, as an object (what :class:`ListSink` gives back)."""

    step: int
    time: float
    kind: str
    broker: str | None = None
    peer: str | None = None
    port: int | None = None
    link: str | None = None
    dir: str | None = None
    seq: int | None = None
    size: int | None = None
    outcome: str | None = None
    reason: str | None = None
    run: str = ""
    pump: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"v": SCHEMA_VERSION, **asdict(self)}


class TraceWriter(Protocol):
    """Where a recorder's rows go, one chunk at a time."""

    def write(self, run: str, pump: str, contexts: Sequence[Context], rows: list[Row]) -> None: ...

    def close(self) -> None: ...


class TraceRecorder:
    """Records one pump's events and passes them, buffered, to a writer.

    Give it to ``Pump(trace=...)``.  The pump and the links call :meth:`event`;
    the hot paths (a message sent or delivered) intern their context once with
    :meth:`context` and append rows straight to :attr:`rows`.  Rows go to the
    writer every ``chunk_rows`` rows (checked between pump steps) and at
    :meth:`close`.
    """

    def __init__(self, writer: TraceWriter, *, run: str = "run", pump: str | None = None,
                 chunk_rows: int = DEFAULT_CHUNK_ROWS) -> None:
        self.writer = writer
        self.run = run
        self.pump = pump
        self.chunk_rows = chunk_rows
        self.contexts: list[Context] = []
        self._context_ids: dict[Context, int] = {}
        self.rows: list[Row] = []
        self.closed = False
        self.rows_written = 0

    def attach(self, pump_name: str) -> None:
        """Called by the pump: the recorder takes the pump's name unless it has one."""
        if self.pump is None:
            self.pump = pump_name

    def context(self, kind: str, broker: str | None = None, peer: str | None = None,
                port: int | None = None, link: str | None = None, dir: str | None = None,
                outcome: str | None = None, reason: str | None = None) -> int:
        """The id of a context (interned; ids number from 0 in first-use order)."""
        key = (kind, broker, peer, port, link, dir, outcome, reason)
        cid = self._context_ids.get(key)
        if cid is None:
            cid = self._context_ids[key] = len(self.contexts)
            self.contexts.append(key)
        return cid

    def event(self, step: int, time: float, kind: str, *, seq: int | None = None,
              size: int | None = None, **context: Any) -> None:
        self.rows.append((step, time, self.context(kind, **context), seq, size))

    def extend(self, step: int, time: float, cid: int, first_seq: int,
               sizes: Iterable[int]) -> None:
        """Rows for a batch of messages of one context, with consecutive sequence numbers."""
        self.rows.extend(zip(repeat(step), repeat(time), repeat(cid), count(first_seq), sizes,
                             strict=False))

    def maybe_flush(self) -> None:
        if len(self.rows) >= self.chunk_rows:
            self.flush()

    def flush(self) -> None:
        if self.rows:
            rows, self.rows = self.rows, []
            self.writer.write(self.run, self.pump or "pump", self.contexts, rows)
            self.rows_written += len(rows)

    def close(self) -> None:
        """Write what is buffered and close the writer (idempotent)."""
        if not self.closed:
            self.flush()
            self.closed = True
            self.writer.close()


# -- writers ----------------------------------------------------------------------------


class MemoryWriter:
    """Keeps rows as :class:`TraceEvent` objects."""

    def __init__(self) -> None:
        self.events: list[TraceEvent] = []

    def write(self, run: str, pump: str, contexts: Sequence[Context], rows: list[Row]) -> None:
        self.events.extend(
            TraceEvent(step, time, *contexts[cid][:6], seq, size,
                       *contexts[cid][6:], run=run, pump=pump)
            for step, time, cid, seq, size in rows)

    def close(self) -> None:
        pass


class ListSink(TraceRecorder):
    """A recorder that keeps every event in memory (tests, small runs)."""

    def __init__(self, *, run: str = "run", pump: str | None = None) -> None:
        self._memory = MemoryWriter()
        super().__init__(self._memory, run=run, pump=pump, chunk_rows=1 << 62)

    @property
    def events(self) -> list[TraceEvent]:
        self.flush()
        return self._memory.events

    def kinds(self) -> list[str]:
        return [e.kind for e in self.events]

    def close(self) -> None:
        self.flush()  # stays usable: tests read .events after the run


def _json_context(run: str, pump: str, context: Context) -> str:
    kind, broker, peer, port, link, dir_, outcome, reason = context
    parts = [f'"kind":{json.dumps(kind)}']
    for name, value in (("broker", broker), ("peer", peer), ("port", port), ("link", link),
                        ("dir", dir_), ("outcome", outcome), ("reason", reason)):
        if value is not None:
            parts.append(f'"{name}":{json.dumps(value)}')
    return ",".join(parts)


class JsonlWriter:
    """JSON Lines, one object per row; absent fields are left out."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._file = open(self.path, "w", encoding="utf-8", newline="\n")  # noqa: SIM115
        self._fragments: list[str] = []
        self._prefix = ""

    def write(self, run: str, pump: str, contexts: Sequence[Context], rows: list[Row]) -> None:
        if not self._prefix:
            self._prefix = (f'{{"v":{SCHEMA_VERSION},"run":{json.dumps(run)},'
                            f'"pump":{json.dumps(pump)},"step":')
        fragments = self._fragments
        for context in contexts[len(fragments):]:
            fragments.append("," + _json_context(run, pump, context))
        prefix = self._prefix
        lines: list[str] = []
        add = lines.append
        for step, time, cid, seq, size in rows:
            if seq is None:
                if size is None:
                    add(f'{prefix}{step},"time":{time!r}{fragments[cid]}}}\n')
                else:
                    add(f'{prefix}{step},"time":{time!r}{fragments[cid]},"size":{size}}}\n')
            else:
                add(f'{prefix}{step},"time":{time!r}{fragments[cid]},"seq":{seq},'
                    f'"size":{size}}}\n')
        self._file.write("".join(lines))

    def close(self) -> None:
        self._file.close()


def arrow_schema() -> Any:
    """The trace schema as a pyarrow schema (needs pyarrow)."""
    import pyarrow as pa

    return pa.schema([
        ("v", pa.int32()), ("run", pa.string()), ("pump", pa.string()), ("step", pa.int64()),
        ("time", pa.float64()), ("kind", pa.string()), ("broker", pa.string()),
        ("peer", pa.string()), ("port", pa.int64()), ("link", pa.string()),
        ("dir", pa.string()), ("seq", pa.int64()), ("size", pa.int64()),
        ("outcome", pa.string()), ("reason", pa.string()),
    ], metadata={b"rdvpump.schema_version": str(SCHEMA_VERSION).encode()})


class ParquetWriter:
    """Parquet through pyarrow, one row group per chunk."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise RuntimeError("Parquet traces need pyarrow: pip install 'rdvpump[spark]'"
                               ) from exc
        self.path = Path(path)
        self._pa = pa
        self._schema = arrow_schema()
        self._writer = pq.ParquetWriter(str(self.path), self._schema)

    def write(self, run: str, pump: str, contexts: Sequence[Context], rows: list[Row]) -> None:
        pa = self._pa
        n = len(rows)
        step, time, cid, seq, size = zip(*rows, strict=True)
        take = pa.array(cid, pa.int32())
        ctx_cols = list(zip(*contexts, strict=True))
        names = self._schema.names
        columns: dict[str, Any] = {
            "v": pa.array(repeat(SCHEMA_VERSION, n), pa.int32(), size=n),
            "run": pa.array(repeat(run, n), pa.string(), size=n),
            "pump": pa.array(repeat(pump, n), pa.string(), size=n),
            "step": pa.array(step, pa.int64()),
            "time": pa.array(time, pa.float64()),
            "seq": pa.array(seq, pa.int64()),
            "size": pa.array(size, pa.int64()),
        }
        for name, values in zip(CONTEXT_FIELDS, ctx_cols, strict=True):
            columns[name] = pa.array(values, self._schema.field(name).type).take(take)
        self._writer.write_table(pa.table([columns[f] for f in names], schema=self._schema))

    def close(self) -> None:
        self._writer.close()


def open_trace(directory: str | os.PathLike[str], *, pump: str, run: str = "run",
               format: str = "jsonl", chunk_rows: int = DEFAULT_CHUNK_ROWS) -> TraceRecorder:
    """A recorder writing ``DIR/<run>.<pump>.<format>``, one file per pump."""
    if format not in FORMATS:
        raise ValueError(f"trace format must be one of {', '.join(FORMATS)}, got {format!r}")
    for label, value in (("run", run), ("pump", pump)):
        if not value or "/" in value or value.startswith("."):
            raise ValueError(f"trace {label} id {value!r} cannot be part of a file name")
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    target = path / f"{run}.{pump}.{format}"
    writer: TraceWriter = JsonlWriter(target) if format == "jsonl" else ParquetWriter(target)
    return TraceRecorder(writer, run=run, pump=pump, chunk_rows=chunk_rows)


#: What ``Pump(trace=...)`` accepts.
TraceSink = TraceRecorder

__all__ = [
    "CONTEXT_FIELDS", "DEFAULT_CHUNK_ROWS", "FIELDS", "FORMATS", "SCHEMA_VERSION",
    "JsonlWriter", "ListSink", "MemoryWriter", "ParquetWriter", "TraceEvent", "TraceRecorder",
    "TraceSink", "TraceWriter", "arrow_schema", "open_trace",
]
