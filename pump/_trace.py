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
raised), ``clock`` (a served pump started: ``reason`` is ``time.monotonic()``
at that pump time, so pumps of different processes can be aligned), and the
name service's ``expire`` and ``drop``.

The recorder keeps rows compactly (the fields that repeat, like broker and
link, are interned once as a *context*) and hands them to a writer in chunks:
:class:`JsonlWriter`, :class:`ParquetWriter`, or :class:`MemoryWriter`.
"""

from __future__ import annotations

import json
import os
import queue
import threading
from array import array
from collections.abc import Sequence
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


class MessageLog:
    """The messages of one link and direction, one event kind (send or deliver).

    Kept as columns, appended to on the hot path; the sequence numbers are
    implicit (consecutive from :attr:`next_seq`).  Step and time are kept as
    runs: a message logged in the same pump step as the one before it adds
    only its size (the time of a run is the pump time when the step first
    logged to it).  :meth:`cut` expands the runs and clears the log in place,
    so bound ``append`` methods stay valid.
    """

    __slots__ = ("cid", "next_seq", "sizes", "run_steps", "run_times", "run_starts",
                 "last_step", "done")

    def __init__(self, cid: int) -> None:
        self.cid = cid
        self.next_seq = 1
        self.sizes = array("q")
        self.run_steps = array("q")
        self.run_times = array("d")
        self.run_starts = array("q")  # index in ``sizes`` where each run begins
        self.last_step = -1
        self.done = False  # the link is gone: drop the log once it is written

    def mark(self, step: int, time: float) -> None:
        """Start a run: the messages logged from now on belong to ``step`` at ``time``."""
        self.run_steps.append(step)
        self.run_times.append(time)
        self.run_starts.append(len(self.sizes))
        self.last_step = step

    def add(self, step: int, time: float, size: int) -> None:
        if step != self.last_step:
            self.mark(step, time)
        self.sizes.append(size)

    def add_batch(self, step: int, time: float, sizes: Sequence[int]) -> None:
        if step != self.last_step:
            self.mark(step, time)
        self.sizes.extend(sizes)

    def cut(self) -> tuple[array[int], array[float], array[int], array[int]]:
        """Runs (steps, times, counts) and sizes of every message logged so far; the log
        is emptied (the current run stays open, so the same step can go on logging)."""
        n = len(self.sizes)
        starts = self.run_starts
        counts = array("q", starts[1:])
        counts.append(n)
        for i in range(len(counts)):
            counts[i] -= starts[i]
        steps, times, sizes = self.run_steps[:], self.run_times[:], self.sizes[:]
        del self.sizes[:]
        if len(steps):
            del self.run_steps[:], self.run_times[:], self.run_starts[:]
            self.run_steps.append(steps[-1])
            self.run_times.append(times[-1])
            self.run_starts.append(0)
        return steps, times, counts, sizes


@dataclass(frozen=True, slots=True)
class Block:
    """Rows of one :class:`MessageLog` handed to a writer: seq runs from ``first_seq``.

    Step and time come as runs (``run_counts[i]`` messages at ``run_steps[i]``,
    ``run_times[i]``); :attr:`steps` and :attr:`times` expand them, on the
    writer's thread.
    """

    cid: int
    first_seq: int
    run_steps: array[int]
    run_times: array[float]
    run_counts: array[int]
    sizes: array[int]

    @property
    def steps(self) -> array[int]:
        out = array("q")
        for step, k in zip(self.run_steps, self.run_counts, strict=True):
            out.extend(array("q", (step,)) * k)  # array * k and extend: both in C
        return out

    @property
    def times(self) -> array[float]:
        out = array("d")
        for time, k in zip(self.run_times, self.run_counts, strict=True):
            out.extend(array("d", (time,)) * k)
        return out


class TraceWriter(Protocol):
    """Where a recorder's rows go, one chunk at a time."""

    def write(self, run: str, pump: str, contexts: Sequence[Context], rows: list[Row],
              blocks: list[Block]) -> None: ...

    def close(self) -> None: ...


class TraceRecorder:
    """Records one pump's events and passes them, buffered, to a writer.

    Give it to ``Pump(trace=...)``.  Most events go through :meth:`event`;
    the hot paths (each message sent or delivered) append to a
    :class:`MessageLog` from :meth:`message_log`.  Everything goes to the
    writer once about ``chunk_rows`` rows are buffered (checked between pump
    steps) and at :meth:`close`.  Rows in a file are grouped, not sorted:
    order them by ``step`` (and ``time``) when reading.
    """

    def __init__(self, writer: TraceWriter, *, run: str = "run", pump: str | None = None,
                 chunk_rows: int = DEFAULT_CHUNK_ROWS, background: bool = False) -> None:
        self.writer = writer
        # With ``background`` a thread writes the chunks (encoding and compressing
        # Parquet release the GIL); at most two chunks wait, so memory stays bounded.
        self._thread: _WriterThread | None = _WriterThread(writer) if background else None
        self.run = run
        self.pump = pump
        self.chunk_rows = chunk_rows
        self.contexts: list[Context] = []
        self._context_ids: dict[Context, int] = {}
        self.rows: list[Row] = []
        self.logs: list[MessageLog] = []
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

    def message_log(self, kind: str, broker: str, peer: str, port: int, link: str,
                    dir: str) -> MessageLog:
        log = MessageLog(self.context(kind, broker, peer, port, link, dir))
        self.logs.append(log)
        return log

    def buffered(self) -> int:
        return len(self.rows) + sum(len(log.sizes) for log in self.logs)

    def maybe_flush(self) -> None:
        if self.buffered() >= self.chunk_rows:
            self.flush()

    def flush(self) -> None:
        blocks = []
        for log in self.logs:
            n = len(log.sizes)
            if n:
                blocks.append(Block(log.cid, log.next_seq, *log.cut()))
                log.next_seq += n
        self.logs = [log for log in self.logs if not log.done]
        if self.rows or blocks:
            rows, self.rows = self.rows, []
            args = (self.run, self.pump or "pump", tuple(self.contexts), rows, blocks)
            if self._thread is not None:
                self._thread.submit(args)
            else:
                self.writer.write(*args)
            self.rows_written += len(rows) + sum(len(b.sizes) for b in blocks)

    def close(self) -> None:
        """Write what is buffered and close the writer (idempotent)."""
        if not self.closed:
            self.closed = True
            try:
                self.flush()
            finally:
                if self._thread is not None:
                    self._thread.finish()
                else:
                    self.writer.close()


class _WriterThread:
    """Runs a writer's ``write`` calls in order on one thread; errors surface on the caller."""

    def __init__(self, writer: TraceWriter) -> None:
        self._writer = writer
        self._queue: queue.Queue[tuple[Any, ...] | None] = queue.Queue(maxsize=2)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="rdvpump-trace", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (args := self._queue.get()) is not None:
            if self._error is None:
                try:
                    self._writer.write(*args)
                except BaseException as exc:  # noqa: BLE001 - reported to the pump's thread
                    self._error = exc
        try:
            self._writer.close()
        except BaseException as exc:  # noqa: BLE001
            self._error = self._error or exc

    def _raise(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"writing the trace failed: {self._error!r}") from self._error

    def submit(self, args: tuple[Any, ...]) -> None:
        self._raise()
        self._queue.put(args)

    def finish(self) -> None:
        self._queue.put(None)
        self._thread.join()
        self._raise()


def _expand(contexts: Sequence[Context], rows: list[Row],
            blocks: list[Block]) -> list[tuple[int, float, int, int | None, int | None]]:
    out = list(rows)
    for b in blocks:
        out.extend(zip(b.steps, b.times, repeat(b.cid), count(b.first_seq), b.sizes,
                       strict=False))
    return out


# -- writers ----------------------------------------------------------------------------


class MemoryWriter:
    """Keeps rows as :class:`TraceEvent` objects, ordered by step."""

    def __init__(self) -> None:
        self.events: list[TraceEvent] = []

    def write(self, run: str, pump: str, contexts: Sequence[Context], rows: list[Row],
              blocks: list[Block]) -> None:
        expanded = sorted(_expand(contexts, rows, blocks), key=lambda r: r[0])
        self.events.extend(
            TraceEvent(step, time, *contexts[cid][:6], seq, size,
                       *contexts[cid][6:], run=run, pump=pump)
            for step, time, cid, seq, size in expanded)

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


def _json_context(context: Context) -> str:
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

    def write(self, run: str, pump: str, contexts: Sequence[Context], rows: list[Row],
              blocks: list[Block]) -> None:
        if not self._prefix:
            self._prefix = (f'{{"v":{SCHEMA_VERSION},"run":{json.dumps(run)},'
                            f'"pump":{json.dumps(pump)},"step":')
        fragments = self._fragments
        for context in contexts[len(fragments):]:
            fragments.append("," + _json_context(context))
        prefix = self._prefix
        lines: list[str] = []
        add = lines.append
        for step, time, cid, seq, size in rows:
            tail = "" if seq is None else f',"seq":{seq}'
            if size is not None:
                tail += f',"size":{size}'
            add(f'{prefix}{step},"time":{time!r}{fragments[cid]}{tail}}}\n')
        for b in blocks:
            # One template per block: only step, time, seq and size vary.
            template = (prefix.replace("%", "%%") + '%d,"time":%r'
                        + fragments[b.cid].replace("%", "%%") + ',"seq":%d,"size":%d}\n')
            lines.extend(map(template.__mod__, zip(b.steps, b.times, count(b.first_seq),
                                                   b.sizes, strict=False)))
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
    """Parquet through pyarrow, one row group per chunk.

    String columns are written dictionary-encoded straight from the recorder's
    interned contexts (no string per row is ever built); the file stores no
    Arrow schema, so every reader (pyarrow, Spark) sees plain strings.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise RuntimeError("Parquet traces need pyarrow: pip install 'rdvpump[spark]'"
                               ) from exc
        import pyarrow.compute as pc

        self.path = Path(path)
        self._pa = pa
        self._pc = pc
        self._arange_cache = array("q")
        schema = arrow_schema()
        self._strings = {f.name for f in schema if f.type == pa.string()}
        self._schema = pa.schema(
            [pa.field(f.name, pa.dictionary(pa.int32(), pa.string())) if f.name in
             self._strings else f for f in schema])
        self._writer = pq.ParquetWriter(str(self.path), self._schema, store_schema=False)
        self._writer.add_key_value_metadata(schema.metadata)

    def _arange(self, n: int) -> Any:
        """0 .. n-1 as an int64 Arrow array, sliced from a cache that grows as needed
        (only between writes: no slice of it outlives the ``pc.add`` that uses it)."""
        cache = self._arange_cache
        if len(cache) < n:
            cache.extend(range(len(cache), max(n, 2 * len(cache))))
        return _int64(self._pa, cache)[:n]

    def _dictionary(self, values: Sequence[Any], take: Any) -> Any:
        """A dictionary column: ``values`` per context, picked per row by ``take``."""
        pa = self._pa
        codes: dict[Any, int] = {}
        per_context = [None if v is None else codes.setdefault(v, len(codes)) for v in values]
        indices = pa.array(per_context, pa.int32()).take(take)
        return pa.DictionaryArray.from_arrays(indices, pa.array(list(codes), pa.string()))

    def write(self, run: str, pump: str, contexts: Sequence[Context], rows: list[Row],
              blocks: list[Block]) -> None:
        pa = self._pa
        steps, times, cids, seqs, sizes = array("q"), array("d"), array("i"), [], []
        if rows:
            r_step, r_time, r_cid, r_seq, r_size = zip(*rows, strict=True)
            steps.extend(r_step)
            times.extend(r_time)
            cids.extend(r_cid)
            seqs.append(pa.array(r_seq, pa.int64()))
            sizes.append(pa.array(r_size, pa.int64()))
        pc = self._pc
        for b in blocks:  # columns already: copied in C, no Python object per row
            k = len(b.sizes)
            steps.extend(b.steps)
            times.extend(b.times)
            cids.extend(array("i", (b.cid,)) * k)
            seqs.append(pc.add(self._arange(k), pa.scalar(b.first_seq, pa.int64())))
            sizes.append(_int64(pa, b.sizes))
        n = len(steps)
        take = _int32(pa, cids)
        zeros = _int32(pa, array("i", bytes(4 * n)))
        columns: dict[str, Any] = {
            "v": pa.repeat(pa.scalar(SCHEMA_VERSION, pa.int32()), n),
            "run": pa.DictionaryArray.from_arrays(zeros, pa.array([run], pa.string())),
            "pump": pa.DictionaryArray.from_arrays(zeros, pa.array([pump], pa.string())),
            "step": _int64(pa, steps),
            "time": pa.Array.from_buffers(pa.float64(), n, [None, pa.py_buffer(times)]),
            "seq": pa.concat_arrays(seqs),
            "size": pa.concat_arrays(sizes),
        }
        ctx_cols = list(zip(*contexts, strict=True))
        for name, values in zip(CONTEXT_FIELDS, ctx_cols, strict=True):
            if name in self._strings:
                columns[name] = self._dictionary(values, take)
            else:
                columns[name] = pa.array(values, self._schema.field(name).type).take(take)
        self._writer.write_table(pa.table([columns[f] for f in self._schema.names],
                                          schema=self._schema))

    def close(self) -> None:
        self._writer.close()


def _int64(pa: Any, values: array[int]) -> Any:
    return pa.Array.from_buffers(pa.int64(), len(values), [None, pa.py_buffer(values)])


def _int32(pa: Any, values: array[int]) -> Any:
    return pa.Array.from_buffers(pa.int32(), len(values), [None, pa.py_buffer(values)])


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
    return TraceRecorder(writer, run=run, pump=pump, chunk_rows=chunk_rows, background=True)


#: What ``Pump(trace=...)`` accepts.
TraceSink = TraceRecorder

__all__ = [
    "CONTEXT_FIELDS", "DEFAULT_CHUNK_ROWS", "FIELDS", "FORMATS", "SCHEMA_VERSION",
    "Block", "JsonlWriter", "ListSink", "MemoryWriter", "MessageLog", "ParquetWriter",
    "TraceEvent", "TraceRecorder", "TraceSink", "TraceWriter", "arrow_schema", "open_trace",
]
