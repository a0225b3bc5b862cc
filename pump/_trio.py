"""The trio driver of the pump: ``await pump.serve()`` runs the same pump inside trio.

Pump time follows trio's clock, so under ``trio.testing.MockClock`` a served
pump stays deterministic.  I/O tasks post work into the pump and wake it; the
trio task that made work ready may run it at once (:meth:`PumpCore.run_ready`).
"""

from __future__ import annotations

import sys
import time

import trio

from ._core import DEFAULT_SERVE_BATCH, PumpCore
from .schema import Kind

# A Ctrl-C is not raised in the middle of the pump tasks that a trio task runs itself
# (held hops, the I/O tasks' deliveries): trio defers it to the next checkpoint.
trio.lowlevel.enable_ki_protection(PumpCore.run_held)
trio.lowlevel.enable_ki_protection(PumpCore.run_ready)


def _mock_clock() -> bool:
    """Whether trio runs on ``trio.testing.MockClock`` (not imported here: trio.testing
    imports pytest, which a process that is not a test should not pay for at start)."""
    testing = sys.modules.get("trio.testing")
    return testing is not None and isinstance(trio.lowlevel.current_clock(),
                                              testing.MockClock)


class Pump(PumpCore):
    """The event pump with its trio driver: everything :class:`PumpCore` does, plus
    :meth:`serve`."""

    async def serve(self, *, batch: int = DEFAULT_SERVE_BATCH,
                    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the pump inside trio until cancelled.

        Pump time continues from where it stands and follows trio's clock, so
        under ``trio.testing.MockClock`` a served pump stays deterministic.
        """
        self._enter()
        self._running = False
        self._serving = True
        offset = trio.current_time() - self._time
        self._clock = lambda: trio.current_time() - offset
        if self.trace is not None and not _mock_clock():
            # Pump time <-> the machine's monotonic clock, shared by all its processes:
            # the replay aligns pumps of different processes with it.
            self.emit(Kind.CLOCK, monotonic=time.monotonic())
        ready = self._ready
        run_one = self._run_one
        try:
            task_status.started()
            while True:
                self._release_due(self.now())
                for _ in range(batch):
                    if not ready:
                        break
                    run_one()
                if ready:
                    await trio.lowlevel.checkpoint()
                    continue
                wake = self._wake = trio.Event()
                deadline = self._next_deadline()
                try:
                    with trio.move_on_at(deadline + offset):
                        await wake.wait()
                finally:
                    self._wake = None
        finally:
            self._time = self.now()
            self._clock = None
            self._serving = False
