"""Ctrl-C (SIGINT) ends interactive commands with one line, "interrupted", and exit 130."""

from __future__ import annotations

import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.ports import free_port

from .procs import DEADLINE, finish, processes, read_until

pytestmark = pytest.mark.slow  # real processes

ROOT = pathlib.Path(__file__).resolve().parents[2]

def start(*args: str, group: bool = False, env: dict[str, str] | None = None
          ) -> subprocess.Popen[bytes]:
    """``rdvpump ARGS``; ``group``: in a process group of its own, as a terminal runs a
    command (a Ctrl-C then reaches every process of the group)."""
    return subprocess.Popen([sys.executable, "-m", "rdvpump", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE,
                            env={**os.environ, "COLUMNS": "120", **(env or {})},
                            start_new_session=group)


def interrupt_and_check(proc: subprocess.Popen[bytes], seen: bytes = b"", *,
                        group: bool = False) -> bytes:
    """SIGINT (to the process group of a ``start(..., group=True)``, as Ctrl-C does),
    then: exit 130, "interrupted" last, no traceback; returns stderr."""
    if group:
        os.killpg(proc.pid, signal.SIGINT)
    else:
        proc.send_signal(signal.SIGINT)
    out, errs = finish(proc, timeout=30)
    errs = seen + errs
    assert proc.returncode == 130, (proc.returncode, errs.decode()[-2000:])
    assert errs.decode().strip().splitlines()[-1] == "interrupted"
    assert b"Traceback" not in errs and b"Traceback" not in out
    return errs


def test_ctrl_c_ends_universe_run_in_one_line(tmp_path: pathlib.Path) -> None:
    spec = (ROOT / "examples/echo.toml").read_text().replace("messages = 2000",
                                                             "messages = 100000000")
    (tmp_path / "long.toml").write_text(spec)
    proc = start("universe", "run", str(tmp_path / "long.toml"), "--trace",
                 str(tmp_path / "traces"))
    deadline = time.monotonic() + DEADLINE
    while not list((tmp_path / "traces").glob("*.jsonl")):  # it has started
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)  # a file to appear: polled, bounded
    interrupt_and_check(proc)


def test_ctrl_c_ends_status_waiting_for_a_broker_in_one_line() -> None:
    """``status --wait`` on a manager that never hears of the broker: Ctrl-C while it
    waits (it has dialled the manager: a socket is open) ends it in one line."""
    port = free_port()
    manager = start("manager", "serve", "--universe", "shop", "--listen", f"127.0.0.1:{port}")
    try:
        read_until(manager, manager.stdout, b"ready manager")
        proc = start("status", "--universe", "shop", "--manager", f"127.0.0.1:{port}",
                     "--wait", "ghost", "--timeout", "60")
        deadline = time.monotonic() + DEADLINE
        while not any(os.readlink(fd).startswith("socket:")
                      for fd in pathlib.Path(f"/proc/{proc.pid}/fd").iterdir()
                      if fd.is_symlink()):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)  # its first connection: polled, bounded
        interrupt_and_check(proc)
    finally:
        manager.send_signal(signal.SIGINT)
        finish(manager, timeout=30)


@pytest.mark.spark
def test_ctrl_c_ends_trace_analyze_in_one_line(tmp_path: pathlib.Path) -> None:
    """With a cache of its own, so that its JVM is the first and was started to write
    Spark's class archive on its way out: after Ctrl-C it writes none, and nothing of the
    command is left running."""
    traces, cache = tmp_path / "traces", tmp_path / "cache"
    run = subprocess.run([sys.executable, "-m", "rdvpump", "universe", "run",
                          str(ROOT / "examples/echo.toml"), "--trace", str(traces)],
                         capture_output=True, timeout=120)
    assert run.returncode == 0, run.stderr
    proc = start("trace", "analyze", str(traces), "--verbose", "--engine", "spark",
                 env={"XDG_CACHE_HOME": str(cache)})
    seen = read_until(proc, proc.stderr, b"census of the events")  # Spark is up and working
    interrupt_and_check(proc, seen)
    assert not list(cache.rglob("*.jsa*"))
    assert not [argv for argv in processes().values() if str(cache).encode() in b" ".join(argv)]


def _descendants(pid: int) -> dict[int, list[bytes]]:
    """The processes below ``pid`` (children, theirs, ...), with their argv."""
    parents: dict[int, int] = {}
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - found
        found |= frontier
    running = processes()
    return {p: running[p] for p in found if p in running}


@pytest.mark.spark
def test_ctrl_c_ends_bench_replay_in_one_line_and_leaves_no_jvm(
        tmp_path: pathlib.Path) -> None:
    # Each Spark run of the bench has a process and a JVM of its own; Ctrl-C must stop
    # both before the trace they read is deleted: no traceback, no JVM error, nothing left.
    # Spark's local dir (blockmgr-* in it) is this test's own: other Spark tests may run
    # beside it.
    tmp = tmp_path
    before = set(tmp.glob("blockmgr-*"))
    proc = start("bench", "replay", "--events", "200000", "--master", "local[1]",
                 "--jvm", "quick", "--no-floor", group=True,
                 env={"SPARK_LOCAL_DIRS": str(tmp)})
    deadline = time.monotonic() + DEADLINE
    while True:  # the job is running: its first shuffle has written a file
        ours = set(tmp.glob("blockmgr-*")) - before
        if any(d.glob("*/shuffle_*") for d in ours):
            break
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)  # a file to appear: polled, bounded
    below = _descendants(proc.pid)
    assert any(b"java" in argv[0] for argv in below.values()), below  # the scenario
    errs = interrupt_and_check(proc, group=True)
    # neither Spark's start-up lines nor what it logs when stopped while a later run's
    # JVM starts (the Ctrl-C may land there): those go to the run's own log
    assert b"ERROR" not in errs and b"Setting default log level" not in errs, errs.decode()
    running = processes()
    assert [argv for p, argv in below.items() if running.get(p) == argv] == []
    assert [d for d in ours if d.exists()] == []  # Spark's shutdown removed its files


def test_ctrl_c_ends_mq_failover_while_it_waits_for_the_manager() -> None:
    with socket.socket() as silent:  # takes the connection, never answers the handshake
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        silent.settimeout(DEADLINE)
        port = silent.getsockname()[1]
        proc = start("mq", "failover", "a", "--to", "1", "--manager", f"127.0.0.1:{port}",
                     "--timeout", "60")
        connection, _ = silent.accept()  # it is waiting for the manager's answer now
        with connection:
            interrupt_and_check(proc)


#: Ctrl-C arriving while a weak reference's callback runs (as importlib's module locks
#: have): Python prints an exception raised there as "Exception ignored" and goes on, so
#: a KeyboardInterrupt raised inside it is lost.
CTRL_C_IN_A_CALLBACK = """
import os, signal, time, trio, weakref
from rdvpump.testing import run_simulation

# as a program run from a terminal has it: a suite started as a script's background job
# (``pytest &``) would pass its children SIGINT ignored
signal.signal(signal.SIGINT, signal.default_int_handler)

class Lock:
    pass

def gone(ref):
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.5)  # the signal's handler runs here, in the callback

refs = []

async def main(clock):
    lock = Lock()
    refs.append(weakref.ref(lock, gone))
    del lock  # the callback runs
    for _ in range(10):  # ten seconds on the real clock if Ctrl-C is lost
        await trio.sleep(1)
    return "went on"

for clock in ("virtual", "real"):
    try:
        print(clock, run_simulation(main, clock, clock=clock, seed=1))
    except KeyboardInterrupt:
        print(clock, "interrupted")
"""


def test_ctrl_c_during_a_callback_still_stops_a_simulation() -> None:
    """A simulation takes Ctrl-C at its next checkpoint, wherever the signal came."""
    proc = subprocess.run([sys.executable, "-c", CTRL_C_IN_A_CALLBACK], capture_output=True,
                          text=True, timeout=DEADLINE, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split("\n")[:2] == ["virtual interrupted", "real interrupted"], (
        proc.stdout, proc.stderr[-2000:])
