"""``rdvpump universe up``: a manager and one process per broker on 127.0.0.1, watched live.

Children print ``ready``, then ``stats {json}`` lines, then ``done {json}``;
the parent draws them as a rich table and, when every workload is done or on
Ctrl-C, stops every child and reaps it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from ._broker import BrokerManager
from ._names import NameClient
from ._process import parse_address
from ._universe import Stats, UniverseSpec, drive, serve_role, sink_expectations

CLI = [sys.executable, "-c", "from brokermgr.cli import main; main()"]
REPORT_EVERY = 0.25


@dataclass
class ChildState:
    broker: str
    stats: dict[str, Any] = field(default_factory=dict)
    reports: list[dict[str, Any]] | None = None
    exit_code: int | None = None
    rate: tuple[float, float] = (0.0, 0.0)  # messages/s, bytes/s
    _last: tuple[float, int, int] | None = None

    def update(self, stats: dict[str, Any]) -> None:
        now = time.monotonic()
        if self._last is not None and now > self._last[0]:
            dt = now - self._last[0]
            self.rate = ((stats["messages"] - self._last[1]) / dt,
                         (stats["bytes"] - self._last[2]) / dt)
        self._last = (now, stats["messages"], stats["bytes"])
        self.stats = stats


async def play_plan(spec: UniverseSpec, broker_id: str, manager: BrokerManager,
                    names: NameClient, nursery: trio.Nursery,
                    emit: Callable[[str, dict[str, Any]], None]) -> None:
    """The child side: serve this broker's roles, drive its workloads, report."""
    broker = manager.broker(broker_id)
    stats = Stats()
    serves, drives = spec.roles(broker_id)
    for kind, port in serves:
        await nursery.start(serve_role, broker, kind, port, stats)

    async def report() -> None:
        while True:
            emit("stats", stats.to_dict())
            await trio.sleep(REPORT_EVERY)

    nursery.start_soon(report)
    reports = []
    for w in drives:
        for t in w.targets:  # wait until the targets registered with a manager
            with trio.fail_after(30):
                while await names.resolve(t, True) is None:
                    await trio.sleep(0.05)
        reports.append((await drive(broker, w, stats)).to_dict())
    emit("done", {"reports": reports})


async def universe_up(spec: UniverseSpec, path: Path, *, token: str,
                      on_change: Callable[[dict[str, ChildState]], None],
                      timeout: float = 600.0, trace_args: Sequence[str] = ()
                      ) -> dict[str, ChildState]:
    """Start the manager and the broker processes, run the workloads, stop everything.

    ``trace_args`` (``--trace DIR --run ID ...``) go to every child: one trace per process.
    """
    env = {**os.environ, "RDVPUMP_TOKEN": token or spec.token}
    children: list[trio.Process] = []
    states = {b: ChildState(b) for b in spec.brokers}
    expected = sink_expectations(spec)

    async def spawn(args: list[str], on_line: Callable[[str], None]) -> tuple[str, int]:
        proc = await trio.lowlevel.open_process([*CLI, *args], stdout=subprocess.PIPE,
                                                stderr=subprocess.DEVNULL, env=env)
        children.append(proc)
        assert proc.stdout is not None
        lines = _lines(proc.stdout)
        with trio.fail_after(30):
            first = await lines.__anext__()
        if not first.startswith("ready "):
            raise RuntimeError(f"{args[0]} did not start: {first!r}")

        async def follow() -> None:
            async for line in lines:
                on_line(line)

        nursery.start_soon(follow)
        return parse_address(first.split()[-1])

    def child_line(broker: str) -> Callable[[str], None]:
        def on_line(line: str) -> None:
            kind, _, payload = line.partition(" ")
            if kind == "stats":
                states[broker].update(json.loads(payload))
            elif kind == "done":
                states[broker].reports = json.loads(payload)["reports"]
            on_change(states)

        return on_line

    def finished() -> bool:
        drivers_done = all(states[w.source].reports is not None for w in spec.workloads)
        sinks_full = all(states[b].stats.get("messages", 0) >= n for b, n in expected.items())
        return drivers_done and sinks_full

    try:
        # Signals are ours from the start: Ctrl-C while children start still stops them all.
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:

                async def interrupted() -> None:
                    async for _ in signals:
                        nursery.cancel_scope.cancel()
                        return

                nursery.start_soon(interrupted)
                manager_addr = await spawn(["manager", "serve", "--universe", spec.name,
                                            "--listen", "127.0.0.1:0", "--scan", "1",
                                            "--expiry", "10", *trace_args], lambda line: None)
                where = f"{manager_addr[0]}:{manager_addr[1]}"
                for b in spec.brokers:
                    await spawn(["broker", "run", "--id", b, "--universe", spec.name,
                                 "--manager", where, "--heartbeat", "2", "--plan", str(path),
                                 *trace_args],
                                child_line(b))
                with trio.move_on_after(timeout):
                    while not finished():
                        await trio.sleep(0.05)
                nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            await _stop_all(children)
        for proc, b in zip(children[1:], spec.brokers, strict=False):
            states[b].exit_code = proc.returncode
        on_change(states)
    return states


async def _lines(stream: trio.abc.ReceiveStream) -> Any:
    buf = b""
    while True:
        data = await stream.receive_some(65536)
        if not data:
            return
        buf += data
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            yield line.decode()


async def _stop_all(children: list[trio.Process], grace: float = 10.0) -> None:
    """SIGINT every child (a clean shutdown), then SIGKILL what is left; reap them all."""
    for proc in children:
        if proc.returncode is None:
            proc.send_signal(signal.SIGINT)
    with trio.move_on_after(grace):
        for proc in children:
            await proc.wait()
    for proc in children:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
