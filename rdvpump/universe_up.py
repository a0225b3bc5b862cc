"""``rdvpump universe up``: a manager process and one process per broker of a universe
file, started, watched (the lines they exchange are :mod:`rdvpump.children`'s) and
stopped; with ``--console``, the universe's console served from this process."""

from __future__ import annotations

import math
import os
import signal
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import trio

from rdv import Address

from .children import Child, ChildState, start_child, stop_all
from .universe_file import UniverseSpec
from .workloads import sink_expectations


async def universe_up(spec: UniverseSpec, path: Path, *, token: str,
                      on_change: Callable[[dict[str, ChildState]], None],
                      timeout: float | None = None, trace_args: Sequence[str] = (),
                      outcome: dict[str, Any] | None = None,
                      console: Address | None = None, admin: bool = False,
                      on_console: Callable[[str, bool], None] = lambda url, done: None
                      ) -> dict[str, ChildState]:
    """Start the manager and the broker processes, run the workloads, stop everything.

    With ``console`` (an address to serve on), every process serves its metrics and
    the universe's console (``rdvpump console``, ``admin`` as its ``--admin``) is served
    there from this process: ``on_console(url, False)`` once it listens.  The universe
    then stays up once its workloads are done, for the page, until SIGINT or SIGTERM
    (``on_console(url, True)`` says so); ``stopped_by`` stays ``done``.

    ``trace_args`` (``--trace DIR --run ID ...``) go to every child: one trace per process.
    The universe stops when every workload is done, when a child reports an error,
    a workload of its breaks off, or it exits while the universe runs, whatever its
    role (its :attr:`ChildState.error`), when the manager exits (how, in
    ``outcome["manager_error"]``), on SIGINT or SIGTERM, or after ``timeout`` seconds
    (None: no limit); ``outcome["stopped_by"]`` says which: ``done``, ``error``,
    ``signal`` or ``timeout``, and ``outcome["waiting"]`` what the universe still waited
    for.
    """
    up = _Up(spec, path, token=token, on_change=on_change,
             outcome={} if outcome is None else outcome)
    # Each child's stderr is read until the child is gone, stops included: a reader
    # cancelled with the universe would close its pipe under a child still saying
    # something on its way out (a broken pipe, and an exit status of its own).
    async with trio.open_nursery() as readers:
        try:
            # Signals are ours from the start: Ctrl-C while children start still
            # stops them all.
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(up.interrupted, signals, nursery.cancel_scope)
                    metrics = [] if console is None else ["--metrics", "127.0.0.1:0"]
                    where = await up.start_manager(nursery, readers, [*metrics, *trace_args])
                    url = "" if console is None else await up.serve_console(
                        nursery, console, admin, on_console)
                    await up.start_brokers(nursery, readers, where,
                                           [*metrics, *trace_args])
                    await up.run(timeout)
                    if console is not None and up.outcome["stopped_by"] == "done":
                        on_console(url, True)
                        while not up.failed():
                            await trio.sleep(0.05)  # the page stays until a signal
                    nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await stop_all(up.children)
            readers.cancel_scope.cancel()  # a pipe something else of a child's still holds
            for proc, b in zip(up.children[1:], spec.brokers, strict=False):
                up.states[b].exit_code = proc.returncode
            on_change(up.states)
    return up.states


class _Up:
    """A universe being brought up: its children, their states, what it waits for."""

    def __init__(self, spec: UniverseSpec, path: Path, *, token: str,
                 on_change: Callable[[dict[str, ChildState]], None],
                 outcome: dict[str, Any]) -> None:
        self.spec = spec
        self.path = path
        self.on_change = on_change
        self.outcome = outcome
        self.env = {**os.environ, "RDVPUMP_TOKEN": token or spec.token}
        self.children: list[trio.Process] = []
        self.states = {b: ChildState(b) for b in spec.brokers}
        self.expected = sink_expectations(spec)
        self.manager: Child | None = None

    async def interrupted(self, signals: AsyncIterator[int],
                          scope: trio.CancelScope) -> None:
        async for _ in signals:
            if self.outcome.get("stopped_by") != "done":
                self.outcome["stopped_by"] = "signal"
            scope.cancel()
            return

    async def start_manager(self, nursery: trio.Nursery, readers: trio.Nursery,
                            args: list[str]) -> str:
        """The manager's process, watched: its address (``HOST:PORT``)."""
        manager = self.manager = await start_child(
            ["manager", "serve", "--universe", self.spec.name, "--listen", "127.0.0.1:0",
             "--scan", "1", "--expiry", "10", *args], self.env, self.children, readers)

        async def watch() -> None:
            await manager.discard()  # it says nothing more; read, not to block it
            # its stdout closed: the manager is ending, and with it the name service
            # every broker registers with: the universe stops
            self.outcome["manager_error"] = await manager.why("while the universe ran")

        nursery.start_soon(watch)
        return f"{manager.address[0]}:{manager.address[1]}"

    async def serve_console(self, nursery: trio.Nursery, console: Address, admin: bool,
                            on_console: Callable[[str, bool], None]) -> str:
        """The universe's console, served from this process: its URL."""
        from .console import UniverseConsole, serve_console

        assert self.manager is not None
        watched = UniverseConsole(self.spec.name, self.manager.address,
                                  token=self.env["RDVPUMP_TOKEN"], admin=admin)
        await nursery.start(watched.run)
        url = "http://{}/".format(await nursery.start(
            serve_console, watched, console.host, console.port))
        on_console(url, False)
        return url

    async def start_brokers(self, nursery: trio.Nursery, readers: trio.Nursery, where: str,
                            args: list[str]) -> None:
        for b in self.spec.brokers:
            child = await start_child(
                ["broker", "run", "--id", b, "--universe", self.spec.name, "--manager",
                 where, "--heartbeat", "2", "--plan", str(self.path), *args], self.env,
                self.children, readers)
            nursery.start_soon(self.follow, child, self.states[b])

    async def run(self, timeout: float | None) -> None:
        """Until every workload is done, a child fails, or ``timeout``."""
        outcome = self.outcome
        outcome["stopped_by"] = "timeout"
        with trio.move_on_after(math.inf if timeout is None else timeout):
            while left := self.waiting():
                outcome["waiting"] = left
                if self.failed():
                    outcome["stopped_by"] = "error"
                    break
                await trio.sleep(0.05)
            else:
                outcome["stopped_by"] = "done"

    async def follow(self, child: Child, state: ChildState) -> None:
        async for line in child.lines:
            state.take(line)
            self.on_change(self.states)
        # its stdout closed: the process is ending.  Every child runs until this process
        # stops it (a broker that serves, or whose workloads are done, goes on serving):
        # one that exits first stops the universe, with its own last word if it had one.
        why = await child.why("before its workloads were done" if state.reports is None
                              else "while the universe ran")
        if state.error is None:
            state.error = why
            self.on_change(self.states)

    def waiting(self) -> list[str]:
        """What the universe waits for: drivers whose workloads are not done, sinks that
        have not had every message."""
        states = self.states
        for b in self.expected:  # a sink compares every message: a mismatch stops it
            errors = states[b].stats.get("errors") or []
            if errors and states[b].error is None:
                states[b].error = f"sink check failed: {errors[0]}"
        left = [f"{b}'s workloads" for b in dict.fromkeys(w.source for w in self.spec.workloads)
                if states[b].reports is None]
        left += [f"{b}'s sink ({states[b].stats.get('messages', 0):,} of {n:,} messages)"
                 for b, n in self.expected.items() if states[b].stats.get("messages", 0) < n]
        return left

    def failed(self) -> bool:
        return "manager_error" in self.outcome or any(st.error for st in self.states.values())

