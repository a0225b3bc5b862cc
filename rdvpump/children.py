"""The protocol between ``universe up`` and its child processes, both ends.

A child (``rdvpump manager serve``, ``rdvpump broker run``) prints, on stdout, one
line per event, flushed as it is written:

- ``ready WHAT HOST:PORT`` once it can be used (every child; the CLI's users and the
  tests wait for it too);
- with a plan (``broker run --plan FILE``), for each broker of the process:
  ``stats {json}`` every :data:`REPORT_EVERY` seconds (its :class:`Stats`), ``error
  {"message": ...}`` when a workload fails, ``done {"reports": [...]}`` when its
  workloads are over.

The parent holds each child's stdin open and sets :data:`WATCH_PARENT` in its
environment: a child ends as on SIGTERM when that pipe closes, so a parent killed
with SIGKILL leaves none behind.  The parent stops its children with SIGINT (a clean
shutdown: brokers unregister) and SIGKILL after a grace period.
"""

from __future__ import annotations

import gc
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import trio

from rdv import Address

from ._errors import RunError

#: How a parent starts a child: the public ``rdvpump`` command of this interpreter.
RDVPUMP = [sys.executable, "-m", "rdvpump"]
#: Seconds between a playing broker's ``stats`` lines.
REPORT_EVERY = 0.25
#: Set by a parent that holds its children's stdin open (see the module's text).
WATCH_PARENT = "RDVPUMP_EXIT_WITH_PARENT"
#: Seconds a child has to print its ``ready`` line.
READY_WITHIN = 30.0

READY, STATS, ERROR, DONE = "ready", "stats", "error", "done"


# -- the child's end -------------------------------------------------------------------

def ready_line(what: str) -> Callable[[Address], None]:
    """What a child calls once it listens at an address: prints ``ready WHAT HOST:PORT``."""
    def ready(address: Address) -> None:
        # What the process made to start (modules, the CLI, its brokers) lives as long as
        # it does: frozen, the collector's full passes stop walking it again and again
        # (a busy MQ server spent a noticeable share of its time in them).
        gc.freeze()
        print(f"{READY} {what} {address[0]}:{address[1]}", flush=True)

    return ready


def report(kind: str, payload: Mapping[str, object]) -> None:
    """One ``stats``, ``error`` or ``done`` line of a broker playing a plan."""
    print(kind, json.dumps(payload), flush=True)


@contextmanager
def stop_signals() -> Iterator[Callable[[], Awaitable[None]]]:
    """SIGINT and SIGTERM caught from here on; yields ``until_signalled``, which returns
    on the first of them (one that came while the process was starting included: a
    parent may stop a child as soon as it reads its ``ready`` line) or, in a child of
    ``universe up``, when the parent's end of our stdin closes (the parent is gone,
    however it ended)."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async def until_signalled() -> None:
            async with trio.open_nursery() as nursery:
                if os.environ.get(WATCH_PARENT) == "1":
                    nursery.start_soon(_parent_gone, nursery.cancel_scope)
                async for _ in signals:
                    break
                nursery.cancel_scope.cancel()

        yield until_signalled


async def _parent_gone(scope: trio.CancelScope) -> None:
    stdin = trio.lowlevel.FdStream(os.dup(0))
    async with stdin:
        while await stdin.receive_some(4096):
            pass  # the parent writes nothing; EOF is the message
    scope.cancel()


# -- the parent's end ------------------------------------------------------------------

@dataclass
class ChildState:
    """What the parent knows of one broker's child, from its lines."""

    broker: str
    stats: dict[str, Any] = field(default_factory=dict)
    reports: list[dict[str, Any]] | None = None
    exit_code: int | None = None
    error: str | None = None  # why this child stops the universe: it ended, or a workload broke off
    rate: tuple[float, float] = (0.0, 0.0)  # messages/s, bytes/s
    _last: tuple[float, int, int] | None = None

    def take(self, line: str) -> None:
        """One line of the child after its ``ready``."""
        kind, _, payload = line.partition(" ")
        if kind == STATS:
            self.update(json.loads(payload))
        elif kind == DONE:
            self.reports = json.loads(payload)["reports"]
            # a workload that broke off (a link lost or refused) stops the universe with
            # its reason: its sinks would wait for ever for what it never sent
            failed = [r for r in self.reports if r.get("error")]
            if failed and self.error is None:
                self.error = f"workload {failed[0]['workload']} failed: {failed[0]['error']}"
        elif kind == ERROR:
            self.error = json.loads(payload)["message"]

    def update(self, stats: dict[str, Any]) -> None:
        now = time.monotonic()
        if self._last is not None and now > self._last[0]:
            dt = now - self._last[0]
            self.rate = ((stats["messages"] - self._last[1]) / dt,
                         (stats["bytes"] - self._last[2]) / dt)
        self._last = (now, stats["messages"], stats["bytes"])
        self.stats = stats


def exit_status(code: int) -> str:
    """How a child process ended, for a person: ``exited with status 3``, ``killed by
    SIGKILL``."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


#: Bytes of a child's stderr kept: enough for its last lines (its error line is its last).
STDERR_KEPT = 4096


class StderrTail:
    """The end of a child's stderr, read to its end by :meth:`keep` so the child never
    blocks on a full pipe; only the last :data:`STDERR_KEPT` bytes are held."""

    def __init__(self) -> None:
        self.data = b""
        self.ended = trio.Event()

    async def keep(self, stream: trio.abc.ReceiveStream) -> None:
        try:
            async with stream:
                while chunk := await stream.receive_some(65536):
                    self.data = (self.data + chunk)[-STDERR_KEPT:]
        finally:
            self.ended.set()

    def last_line(self) -> str:
        """The last line that says something, without colour codes ("" if none)."""
        for line in reversed(self.data.decode(errors="replace").splitlines()):
            if text := _ESCAPES.sub("", line).strip():
                return text[:300]
        return ""

    async def why(self, code: int, when: str) -> str:
        """How the child ended and ``when``, for a person (``exited with status 1 before
        it was ready: error: ...``): its last line on stderr follows when it exited with
        an error (the CLI's one-line error is its last line).  Waits at most a second for
        the pipe's end (a grandchild may hold it open)."""
        said = f"{exit_status(code)} {when}"
        if code <= 0:  # a clean exit, or a signal: what it printed says nothing of why
            return said
        with trio.move_on_after(1.0):
            await self.ended.wait()
        line = self.last_line()
        return f"{said}: {line}" if line else said


_ESCAPES = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


@dataclass
class Child:
    """A started child: its process, the address of its ``ready`` line, its next lines,
    the end of its stderr."""

    process: trio.Process
    address: Address
    lines: AsyncIterator[str]
    stderr: StderrTail

    async def discard(self) -> None:
        """Read and drop the child's lines (a full pipe would block it)."""
        async for _ in self.lines:
            pass

    async def why(self, when: str) -> str:
        """Once it ended: how and ``when``, with its last line on stderr
        (:meth:`StderrTail.why`)."""
        return await self.stderr.why(await self.process.wait(), when)


async def start_child(args: list[str], env: Mapping[str, str],
                      started: list[trio.Process], nursery: trio.Nursery | None) -> Child:
    """``rdvpump ARGS`` with the parent's end of the protocol: stdin held open, stdout
    read by line, stderr read to its end in ``nursery`` (its last lines kept, to say why
    it ended; None: dropped); appended to ``started`` at once (for :func:`stop_all`),
    returned once its ``ready`` line is read."""
    env = {**env, WATCH_PARENT: "1"}
    proc = await trio.lowlevel.open_process(
        [*RDVPUMP, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL if nursery is None else subprocess.PIPE, env=env)
    started.append(proc)
    assert proc.stdout is not None
    tail = StderrTail()
    if nursery is None:
        tail.ended.set()
    else:
        assert proc.stderr is not None
        nursery.start_soon(tail.keep, proc.stderr)
    lines = _Lines(proc.stdout)
    with trio.fail_after(READY_WITHIN):
        first = await anext(lines, "")
        if not first:  # its stdout ended before the line: the process is ending
            why = await tail.why(await proc.wait(), "before it was ready")
            raise RunError(f"{' '.join(args[:2])} {why}")
    if not first.startswith(READY + " "):
        raise RunError(f"{args[0]} did not start: {first!r}")
    return Child(proc, Address.parse(first.split()[-1]), lines, tail)


class _Lines:
    """The lines of a child's stdout (a class, not an async generator: one left
    unfinished when its child is stopped needs no finalizing)."""

    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self.stream, self.buf = stream, b""

    def __aiter__(self) -> _Lines:
        return self

    async def __anext__(self) -> str:
        while b"\n" not in self.buf:
            data = await self.stream.receive_some(65536)
            if not data:
                raise StopAsyncIteration
            self.buf += data
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode()


async def stop_all(children: list[trio.Process], grace: float = 10.0) -> None:
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
