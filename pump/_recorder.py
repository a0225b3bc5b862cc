"""The trace recorder: a pump's events kept compactly, handed to a writer in chunks.

Most events go through :meth:`TraceRecorder.event`; the hot paths (each
message sent or delivered) append to a :class:`MessageLog` that a link's
:class:`LinkTrace` keeps.  The fields that repeat, like broker and link, are
interned once as a *context*.  The rows follow :mod:`pump.schema`; the
writers (JSON Lines, Parquet) are in :mod:`._writers`.
"""

from __future__ import annotations

import queue
import threading
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import count, repeat
from typing import Any, Protocol

from ._errors import TraceWriteError
from .schema import Context, Kind, Outcome, TraceEvent


class Clock(Protocol):
    """What a :class:`LinkTrace` reads of its pump: the step it is in and the time."""

    step_number: int

    def now(self) -> float: ...

#: Rows kept before they go to the writer.
DEFAULT_CHUNK_ROWS = 1 << 16

Row = tuple[int, float, int, int | None, int | None]  # step, time, context, seq, size


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
    :class:`MessageLog` from :meth:`message_log` (a link's :class:`LinkTrace`).
    Everything goes to the writer once about ``chunk_rows`` rows are buffered
    (checked between pump steps) and at :meth:`close`.  Rows in a file are grouped, not sorted:
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
                outcome: str | None = None, reason: str | None = None,
                monotonic: float | None = None) -> int:
        """The id of a context (interned; ids number from 0 in first-use order)."""
        key = (kind, broker, peer, port, link, dir, outcome, reason, monotonic)
        cid = self._context_ids.get(key)
        if cid is None:
            cid = self._context_ids[key] = len(self.contexts)
            self.contexts.append(key)
        return cid

    def event(self, step: int, time: float, kind: str, *, seq: int | None = None,
              size: int | None = None, **context: Any) -> None:
        self.rows.append((step, time, self.context(kind, **context), seq, size))

    def task(self, step: int, time: float, event: str, task_kind: str,
             ids: tuple[str | None, str | None, int | None, str | None]) -> None:
        """A task run or a timer fired (``event``: ``task`` or ``timer``), the task's kind
        as the outcome, ``ids`` its owner's (broker, peer, port, link); every 256th step
        the chunk may go to the writer (bounded memory, little cost)."""
        broker, peer, port, link = ids
        self.rows.append((step, time, self.context(event, broker, peer, port, link, None,
                                                   task_kind), None, None))
        if not step & 255:
            self.maybe_flush()

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
            raise TraceWriteError(f"writing the trace failed: {self._error!r}") from self._error

    def submit(self, args: tuple[Any, ...]) -> None:
        self._raise()
        self._queue.put(args)

    def finish(self) -> None:
        self._queue.put(None)
        self._thread.join()
        self._raise()


class LinkTrace:
    """Records what happens on one end of a link (a ``channels.LinkObserver``).

    Made by :meth:`PumpCore.link_trace` for every channel of a traced pump:
    the messages it sends and delivers go to two :class:`MessageLog` s, the
    rest to the recorder's rows, at the pump's step and time.
    """

    __slots__ = ("_pump", "_recorder", "_ids", "_tx_dir", "_rx_dir", "_sends", "_delivers")

    def __init__(self, pump: Clock, recorder: TraceRecorder, broker: str, peer: str,
                 port: int, link: str, tx_dir: str, rx_dir: str) -> None:
        self._pump = pump
        self._recorder = recorder
        self._ids: dict[str, Any] = {"broker": broker, "peer": peer, "port": port, "link": link}
        self._tx_dir = tx_dir
        self._rx_dir = rx_dir
        self._sends = recorder.message_log(Kind.SEND, broker, peer, port, link, tx_dir)
        self._delivers = recorder.message_log(Kind.DELIVER, broker, peer, port, link, rx_dir)

    def sent(self, size: int) -> None:
        pump = self._pump
        log = self._sends
        step = pump.step_number
        if step != log.last_step:
            log.mark(step, pump.now())
        log.sizes.append(size)

    def delivered(self, sizes: Sequence[int]) -> None:
        pump = self._pump
        self._delivers.add_batch(pump.step_number, pump.now(), sizes)

    def _event(self, kind: str, **fields: Any) -> None:
        pump = self._pump
        self._recorder.event(pump.step_number, pump.now(), kind, **self._ids, **fields)

    def moved(self, kind: str, size: int, partial: bool) -> None:
        direction = self._tx_dir if kind == Kind.WRITE else self._rx_dir
        self._event(kind, dir=direction, size=size,
                    outcome=Outcome.PARTIAL if partial else None)

    def protocol_error(self, reason: str) -> None:
        self._event(Kind.PROTOCOL_ERROR, dir=self._rx_dir, reason=reason)

    def disconnected(self, reason: str, cause: str) -> None:
        self._event(Kind.DISCONNECT, outcome=cause, reason=reason)

    def closed(self, reason: str) -> None:
        self._event(Kind.CLOSE, reason=reason)
        self._sends.done = self._delivers.done = True


def _expand(contexts: Sequence[Context], rows: list[Row],
            blocks: list[Block]) -> list[tuple[int, float, int, int | None, int | None]]:
    out = list(rows)
    for b in blocks:
        out.extend(zip(b.steps, b.times, repeat(b.cid), count(b.first_seq), b.sizes,
                       strict=False))
    return out


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
