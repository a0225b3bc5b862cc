"""Trackers and servers as real processes on 127.0.0.1, watched by `rdvpump routes --json`.

One server is killed with SIGKILL (its link drops: gone at once), another is
stopped with SIGSTOP (hung but connected: gone after the expiry).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from typing import Any

import pytest
import trio

from tests.rdvpump.procs import drain_pty, reap
from tests.rdvpump.test_processes import RDVPUMP, TOKEN, spawn

pytestmark = pytest.mark.slow

EXPIRY = 2.0
SCAN = 0.25


class Lines:
    """JSON lines from a child's stdout, read with a deadline."""

    def __init__(self, proc: trio.Process) -> None:
        assert proc.stdout is not None
        self.stream = proc.stdout
        self.buffer = b""
        self.first: dict[str, Any] | None = None  # the first line the watcher printed

    async def next(self) -> dict[str, Any]:
        while b"\n" not in self.buffer:
            chunk = await self.stream.receive_some(65536)
            if not chunk:
                raise RuntimeError("rdvpump routes exited")
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        snap: dict[str, Any] = json.loads(line)
        if self.first is None:
            self.first = snap
        return snap

    async def until(self, condition: Any, timeout: float) -> dict[str, Any]:
        with trio.fail_after(timeout):
            while True:
                snap = await self.next()
                if condition(snap):
                    return snap


def names(snap: dict[str, Any]) -> set[str]:
    return {s["address"] for s in snap["servers"]}


async def test_killed_and_hung_servers_leave_the_clients_route_tables() -> None:
    async with spawn("manager", "serve", "--universe", "z", "--listen", "127.0.0.1:0",
                     "--scan", "0.5") as (_, manager_addr):
        common = ["--universe", "z", "--manager", f"{manager_addr[0]}:{manager_addr[1]}",
                  "--heartbeat", "1", "--report-interval", "0.5",
                  "--track-expiry", str(EXPIRY), "--track-scan", str(SCAN)]
        server = [*common, "--role", "server", "--tracker", "t1:15555", "--tracker",
                  "t2:15555", "--topic", "orders"]
        async with spawn("broker", "run", "--id", "t1", "--role", "tracker", *common) as (
                _, t1_addr), \
                spawn("broker", "run", "--id", "t2", "--role", "tracker", *common) as (
                _, t2_addr), \
                spawn("broker", "run", "--id", "s1", *server) as (s1, _a), \
                spawn("broker", "run", "--id", "s2", *server) as (s2, _b), \
                spawn("broker", "run", "--id", "s3", *server) as (_, _c):
            watcher = await trio.lowlevel.open_process(
                [*RDVPUMP, "routes", "--universe", "z", "--json",
                 "--tracker", f"{t1_addr[0]}:{t1_addr[1]}",
                 "--tracker", f"t2@{t2_addr[0]}:{t2_addr[1]}"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                env={**os.environ, "RDVPUMP_TOKEN": TOKEN})
            try:
                lines = Lines(watcher)
                everyone = {"s1:15555", "s2:15555", "s3:15555"}
                # both trackers list all three servers
                snap = await lines.until(
                    lambda s: names(s) == everyone and all(v["votes"] == 2
                                                           for v in s["servers"]), 30)
                assert snap["topics"] == {"orders": sorted(everyone)}
                # named by the addresses they give themselves, whatever they were dialled as
                assert sorted(snap["trackers"]) == ["t1:15555", "t2:15555"]
                assert lines.first is not None and lines.first["trackers"]  # no empty line

                s1.send_signal(signal.SIGKILL)
                killed = time.monotonic()
                await lines.until(lambda s: "s1:15555" not in names(s), 10)
                assert time.monotonic() - killed < EXPIRY  # the dropped link, not the expiry

                s2.send_signal(signal.SIGSTOP)  # hung: its TCP links stay open
                hung = time.monotonic()
                snap = await lines.until(lambda s: "s2:15555" not in names(s), 15)
                waited = time.monotonic() - hung
                assert EXPIRY - 0.6 < waited < EXPIRY + 3, waited  # expiry + scan + slack
                assert names(snap) == {"s3:15555"}
            finally:
                s2.send_signal(signal.SIGKILL)
                await reap(watcher)


async def test_live_routes_at_a_terminal_ends_with_interrupted_below_the_table(
        tmp_path: Any) -> None:
    """``rdvpump routes`` live at a terminal (a pty), then Ctrl-C: the table stays as
    last drawn, and "interrupted" is the last line, below it, not drawn over."""
    import pty

    async with spawn("broker", "run", "--id", "t1", "--role", "both", "--universe", "z",
                     "--manager", "127.0.0.1:1", "--topic", "orders") as (_, t1_addr):
        terminal, tty = pty.openpty()
        watcher = await trio.lowlevel.open_process(
            [*RDVPUMP, "routes", "--universe", "z", "--tracker", f"{t1_addr[0]}:{t1_addr[1]}"],
            stdout=tty, stderr=tty, env={**os.environ, "RDVPUMP_TOKEN": TOKEN,
                                         "COLUMNS": "120", "TERM": "xterm"})
        os.close(tty)
        shown = b""
        try:
            with trio.fail_after(30):
                while shown.count(b"orders") < 2:  # drawn, and drawn again over itself
                    await trio.lowlevel.wait_readable(terminal)
                    shown += os.read(terminal, 65536)
            watcher.send_signal(signal.SIGINT)
            with trio.fail_after(30):
                await watcher.wait()
            shown += drain_pty(terminal)
        finally:
            os.close(terminal)
            await reap(watcher)
    assert watcher.returncode == 130
    last_frame = shown.rsplit(b"\x1b[1A", 1)[-1]  # after the last move back up
    assert b"orders" in last_frame and last_frame.rstrip().endswith(b"interrupted"), shown


async def test_routes_once_prints_a_table_and_fails_clearly_without_trackers(
        tmp_path: Any) -> None:
    async with spawn("broker", "run", "--id", "t1", "--role", "both", "--universe", "z",
                     "--manager", "127.0.0.1:1", "--topic", "orders",
                     "--trace", str(tmp_path)) as (t1, t1_addr):
        done = await trio.run_process(
            [*RDVPUMP, "routes", "--universe", "z", "--once",
             "--tracker", f"{t1_addr[0]}:{t1_addr[1]}"], capture_stdout=True,
            capture_stderr=True, env={**os.environ, "RDVPUMP_TOKEN": TOKEN, "COLUMNS": "200"})
        out = done.stdout.decode()
        assert "t1:15555" in out and "orders" in out, out
        t1.send_signal(signal.SIGINT)  # the broker ends its trace as it exits
        with trio.fail_after(30):
            await t1.wait()
    # the tracker's trace tells the routes client's close from a crash
    rows = [json.loads(line) for file in tmp_path.iterdir()
            for line in file.read_text().splitlines()]
    closes = [r["reason"] for r in rows
              if r["kind"] == "close" and str(r.get("peer")).startswith("@routes")]
    assert closes == ["peer disconnected (closed)"]
    with trio.socket.socket() as sock:  # a free port nobody listens on
        await sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    failed = await trio.run_process(
        [*RDVPUMP, "routes", "--universe", "z", "--once", "--timeout", "1",
         "--tracker", f"127.0.0.1:{port}"], capture_stdout=True, capture_stderr=True,
        check=False, env={**os.environ, "RDVPUMP_TOKEN": TOKEN})
    assert failed.returncode == 1
    err = failed.stderr.decode()
    assert "no tracker answered" in err and len(err.strip().splitlines()) == 1, err


async def test_routes_ends_at_once_on_a_final_refusal() -> None:
    async with spawn("broker", "run", "--id", "t1", "--role", "tracker", "--universe", "z",
                     "--manager", "127.0.0.1:1") as (_, t1_addr):
        for extra in ([], ["--once"]):  # live and once: no waiting out the timeout
            began = time.monotonic()
            done = await trio.run_process(
                [*RDVPUMP, "routes", "--universe", "z", *extra, "--tracker",
                 f"{t1_addr[0]}:{t1_addr[1]}"], capture_stdout=True, capture_stderr=True,
                check=False, env={**os.environ, "RDVPUMP_TOKEN": "wrong", "COLUMNS": "200"})
            assert time.monotonic() - began < 8  # the timeout is 10 s
            assert done.returncode == 1
            err = " ".join(done.stderr.decode().split())
            assert err.startswith("error: ") and "refused: unauthorized" in err, err
