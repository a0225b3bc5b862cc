"""The event pump's core: one FIFO of named tasks run one at a time, timers, and a clock.

No trio here: the core runs a simulation on a virtual clock
(``run_until_idle``); :mod:`._trio` adds the driver that serves the same pump
inside trio, where I/O tasks post work and wake it.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import random
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from ._errors import ConfigError, NeverIdleError
from ._log import CollapsingLog
from ._recorder import LinkTrace, TraceRecorder
from .schema import Kind

log = logging.getLogger("rdvpump.pump")

#: Tasks run between two trio checkpoints while serving, so I/O tasks get a turn.
DEFAULT_SERVE_BATCH = 64


#: The trace ids of a task without an owner.
_NO_OWNER: tuple[None, None, None, None] = (None, None, None, None)

class Owner(Protocol):
    """Something a task belongs to (a link, a broker).

    When a task raises, the pump calls ``task_failed(exc)`` on its owner, which must
    close itself with the reason; ``trace_ids()`` names it in trace events as
    ``(broker, peer, port, link)``.
    """

    def task_failed(self, exc: BaseException) -> None: ...

    def trace_ids(self) -> tuple[str | None, str | None, int | None, str | None]: ...


class Timer:
    """A pending ``call_later``; ``cancel()`` stops it from running."""

    __slots__ = ("when", "kind", "fn", "args", "owner", "cancelled", "periodic")

    def __init__(self, when: float, kind: str, fn: Callable[..., object], args: tuple[Any, ...],
                 owner: Owner | None, periodic: bool = False) -> None:
        self.when = when
        self.periodic = periodic  # re-armed by its own task: it never lets the pump go idle
        self.kind = kind
        self.fn = fn
        self.args = args
        self.owner = owner
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class Repeating:
    """A ``call_every``: its timer is renewed after each run until :meth:`cancel`."""

    __slots__ = ("cancelled", "timer")

    def __init__(self) -> None:
        self.cancelled = False
        self.timer: Timer | None = None

    def cancel(self) -> None:
        self.cancelled = True
        if self.timer is not None:
            self.timer.cancel()


class PumpCore:
    """A single-threaded event pump, on a virtual clock (the trio driver is :class:`Pump`).

    Tasks are plain callables posted with a kind (``"accept"``, ``"write"``,
    ...).  They run in FIFO order, one at a time and never re-entrantly.  An
    exception escaping a task is logged, traced as a ``"fail"`` event and fails
    the task's owner; the pump carries on.

    ``seed`` seeds :attr:`random`, the one source of randomness programs on this
    pump should use, so the same program and seed give the same trace.
    """

    def __init__(self, *, seed: int = 0, trace: TraceRecorder | None = None,
                 name: str = "pump") -> None:
        self.name = name
        self.seed = seed
        self.random = random.Random(seed)
        self.trace: TraceRecorder | None = trace
        #: Told of every semantic event (kind, fields) as well, traced or not, when set: a
        #: process's metrics count refusals and closes there (events of links, never of
        #: messages, so the messages' path pays nothing for it).
        self.tally: Callable[[str, dict[str, Any]], None] | None = None
        if trace is not None:
            trace.attach(name)
        self._ready: deque[tuple[str, Callable[..., object], tuple[Any, ...], Owner | None]] = (
            deque()
        )
        self._timers: list[tuple[float, int, Timer]] = []
        self._timer_seq = itertools.count()
        self._time = 0.0
        self._clock: Callable[[], float] | None = None
        #: The number of the task running now (or of the last one run).
        self.step_number = 0
        self._running = False
        self._in_task = False
        self._serving = False
        #: Set by a driver while it waits for work: ``post`` and ``call_at`` wake it.
        self._wake: Any = None
        self.failures = 0
        self._collapsing: dict[str, CollapsingLog] = {}
        self._holding = False  # between hold() and run_held(): posts do not wake the driver

    def warn_collapsed(self, logger: logging.Logger, key: object, line: str) -> None:
        """``logger.warning(line)``, collapsed per ``key`` on this pump's clock: the
        first of a kind is logged, the ones that follow within :data:`LOG_WINDOW` are
        counted in one line when the window ends (see :class:`CollapsingLog`)."""
        target = self._collapsing.get(logger.name)
        if target is None:
            target = self._collapsing[logger.name] = CollapsingLog(logger, self)
        target.warn(key, line)

    @property
    def driven(self) -> bool:
        """Whether something runs the pump now: ``serve`` inside trio, or a ``run_*`` call
        on the virtual clock.  Awaiting an outcome from a pump nobody drives waits for
        ever."""
        return self._serving or self._running

    # -- time --------------------------------------------------------------------------

    def now(self) -> float:
        """Pump time in seconds: virtual when simulating, trio's clock when serving."""
        clock = self._clock
        return self._time if clock is None else clock()

    # -- posting -----------------------------------------------------------------------

    def post(self, kind: str, fn: Callable[..., object], *args: Any,
             owner: Owner | None = None) -> None:
        """Queue ``fn(*args)`` to run as a task of the given kind."""
        self._ready.append((kind, fn, args, owner))
        wake = self._wake
        if wake is not None and not self._holding:
            wake.set()

    def call_later(self, delay: float, fn: Callable[..., object], *args: Any,
                   owner: Owner | None = None, kind: str = "timer",
                   periodic: bool = False) -> Timer:
        """Run ``fn(*args)`` as a task ``delay`` seconds from now.

        ``periodic`` marks a timer that its own task arms again (a report, a scan, a
        heartbeat): :meth:`run_until_idle` stops with :class:`NeverIdleError` when
        nothing else is left.
        """
        if not delay >= 0:
            raise ConfigError(f"delay must be a non-negative number, got {delay!r}")
        return self.call_at(self.now() + delay, fn, *args, owner=owner, kind=kind,
                            periodic=periodic)

    def call_every(self, interval: float, fn: Callable[..., object], *args: Any,
                   owner: Owner | None = None, kind: str = "timer") -> Repeating:
        """Run ``fn(*args)`` every ``interval`` seconds, the first time ``interval`` from
        now, until the handle is cancelled: periodic work (a report, a scan, a heartbeat).
        Each run arms the next when it is done, whether or not ``fn`` raised (the error is
        the pump's to log, and the work goes on).  Such timers never let
        :meth:`run_until_idle` end (:class:`NeverIdleError` when nothing else is left)."""
        if not interval > 0:
            raise ConfigError(f"interval must be a positive number, got {interval!r}")
        handle = Repeating()

        def run() -> None:
            try:
                fn(*args)
            finally:
                if not handle.cancelled:
                    handle.timer = self.call_later(interval, run, owner=owner, kind=kind,
                                                   periodic=True)

        # traces and NeverIdleError name the work, not this wrapper
        run.__qualname__ = getattr(fn, "__qualname__", kind)
        handle.timer = self.call_later(interval, run, owner=owner, kind=kind, periodic=True)
        return handle

    def call_at(self, when: float, fn: Callable[..., object], *args: Any,
                owner: Owner | None = None, kind: str = "timer",
                periodic: bool = False) -> Timer:
        """Run ``fn(*args)`` as a task at pump time ``when``."""
        timer = Timer(when, kind, fn, args, owner, periodic)
        heapq.heappush(self._timers, (when, next(self._timer_seq), timer))
        wake = self._wake
        if wake is not None:
            wake.set()
        return timer

    # -- tracing -----------------------------------------------------------------------

    def emit(self, kind: str, **fields: Any) -> None:
        """Record a semantic event in the trace, if tracing (see :mod:`pump.schema`)."""
        trace = self.trace
        if trace is not None:
            trace.event(self.step_number, self.now(), kind, **fields)
        tally = self.tally
        if tally is not None:
            tally(kind, fields)

    def link_trace(self, broker: str, peer: str, port: int, link: str, tx_dir: str,
                   rx_dir: str) -> LinkTrace | None:
        """What records one end of a link (a channel's observer); None when not tracing."""
        if self.trace is None:
            return None
        return LinkTrace(self, self.trace, broker, peer, port, link, tx_dir, rx_dir)

    def has_ready(self) -> bool:
        """Whether a task is ready to run now."""
        return bool(self._ready)

    def close_trace(self) -> None:
        """Write out and close the trace, if any (the file is complete after this)."""
        if self.trace is not None:
            self.trace.close()

    # -- running -----------------------------------------------------------------------

    def pending(self) -> int:
        """Tasks ready to run plus live timers."""
        return len(self._ready) + sum(1 for _, _, t in self._timers if not t.cancelled)

    def _release_due(self, now: float) -> None:
        timers = self._timers
        ready = self._ready
        while timers and timers[0][0] <= now:
            timer = heapq.heappop(timers)[2]
            if not timer.cancelled:
                ready.append((timer.kind, timer.fn, timer.args, timer.owner))
                if self.trace is not None:
                    self._trace_task(Kind.TIMER, timer.kind, timer.owner, now)

    def _next_deadline(self) -> float:
        timers = self._timers
        while timers and timers[0][2].cancelled:
            heapq.heappop(timers)
        return timers[0][0] if timers else math.inf

    def _run_one(self) -> None:
        kind, fn, args, owner = self._ready.popleft()
        self.step_number += 1
        if self.trace is not None:
            self._trace_task(Kind.TASK, kind, owner, self.now())
        self._in_task = True
        try:
            fn(*args)
        except Exception as exc:  # noqa: BLE001 - a task must never kill the pump
            self._task_failed(kind, owner, exc)
        finally:
            self._in_task = False

    def _trace_task(self, event: str, kind: str, owner: Owner | None, now: float) -> None:
        trace = self.trace
        assert trace is not None
        trace.task(self.step_number, now, event, kind,
                   owner.trace_ids() if owner is not None else _NO_OWNER)

    def _task_failed(self, kind: str, owner: Owner | None, exc: Exception) -> None:
        self.failures += 1
        log.error("pump %s: %s task failed: %r", self.name, kind, exc, exc_info=exc)
        if self.trace is not None:
            broker, peer, port, link = (owner.trace_ids() if owner is not None
                                        else (None, None, None, None))
            self.trace.event(self.step_number, self.now(), Kind.FAIL, broker=broker, peer=peer,
                             port=port, link=link, outcome=kind, reason=repr(exc))
        if owner is not None:
            try:
                owner.task_failed(exc)
            except Exception as exc2:  # noqa: BLE001
                log.error("pump %s: failing the owner of a %s task raised %r", self.name, kind,
                          exc2, exc_info=exc2)

    def run_ready(self, limit: int = DEFAULT_SERVE_BATCH) -> int:
        """Run up to ``limit`` ready tasks now; return how many ran.

        For I/O tasks of a served pump: the trio task that made work ready runs
        it at once instead of waking the pump's own task (one task switch less
        per hop).  Order is unchanged: it is the same FIFO.  Does nothing when
        called from inside a task or while a simulation runs.
        """
        if self._running or self._in_task:
            return 0
        ready = self._ready
        ran = 0
        while ready and ran < limit:
            self._run_one()
            ran += 1
        return ran

    def hold(self) -> None:
        """From a trio task of a served pump, before it posts work it will run itself: the
        posts do not wake the pump's own task.  Always follow with :meth:`run_held`."""
        self._holding = True

    def run_held(self, limit: int = DEFAULT_SERVE_BATCH) -> None:
        """End :meth:`hold`: run what is ready now (as :meth:`run_ready`) and wake the
        pump's own task only if work is left, so that a hop costs no task switch."""
        try:
            self.run_ready(limit)  # what these tasks post runs here too, unless past limit
        finally:
            self._holding = False
        if self._ready:
            wake = self._wake
            if wake is not None:
                wake.set()

    def _enter(self) -> None:
        if self._running:
            raise RuntimeError("the pump is already running (tasks must not run the pump)")
        if self._serving:
            raise RuntimeError("the pump is being served; post tasks instead")
        self._running = True

    def step(self) -> bool:
        """Run one task; when none is ready, jump the virtual clock to the next timer.

        Return False when there was nothing to do at all.
        """
        self._enter()
        try:
            if not self._ready:
                deadline = self._next_deadline()
                if deadline == math.inf:
                    return False
                self._time = max(self._time, deadline)
                self._release_due(self._time)
                if not self._ready:
                    return True
            self._run_one()
            return True
        finally:
            self._running = False

    def run_until_idle(self, *, max_steps: int | None = None) -> int:
        """Run tasks and timers on the virtual clock until none is left; return steps run.

        Periodic timers (tracking reports, name-service scans and heartbeats) never let
        a pump go idle: when nothing but them is left, this raises
        :class:`NeverIdleError` instead of running them forever.  Drive such a pump with
        :meth:`run_for` or :meth:`run_until`, or bound the run with ``max_steps``.
        """
        return self.run_until(math.inf, max_steps=max_steps)

    def run_until(self, deadline: float, *, max_steps: int | None = None) -> int:
        """Run on the virtual clock up to pump time ``deadline``; return steps run."""
        self._enter()
        ready = self._ready
        run_one = self._run_one
        start = self.step_number
        limit = math.inf if max_steps is None else start + max_steps
        try:
            while self.step_number < limit:
                if ready:
                    run_one()
                    continue
                when = self._next_deadline()
                if when != math.inf and deadline == math.inf and max_steps is None \
                        and self._timers[0][2].periodic and self._only_periodic():
                    raise NeverIdleError(
                        f"run_until_idle: only periodic timers are left at pump time "
                        f"{self._time:g} ({self._periodic_kinds()}): the pump never goes "
                        f"idle; run it for a time instead (run_for(seconds), run_until(t))")
                if when == math.inf or when > deadline:
                    if deadline != math.inf:
                        self._time = max(self._time, deadline)
                    break
                self._time = max(self._time, when)
                self._release_due(self._time)
            return self.step_number - start
        finally:
            self._running = False

    def _only_periodic(self) -> bool:
        return all(t.periodic or t.cancelled for _, _, t in self._timers)

    def _periodic_kinds(self) -> str:
        names = sorted({getattr(t.fn, "__qualname__", t.kind) for _, _, t in self._timers
                        if not t.cancelled})
        return ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")

    def run_for(self, seconds: float, *, max_steps: int | None = None) -> int:
        """Run on the virtual clock for ``seconds`` of pump time."""
        return self.run_until(self._time + seconds, max_steps=max_steps)
