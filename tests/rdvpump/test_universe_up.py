"""universe up as a user meets it: in a pipe it prints plain lines; a child that dies stops
the universe with its name and status; Ctrl-C says what finished and exits 130; with
``--console`` the universe's console is served beside it and stays up once it is done."""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import subprocess
import sys
import time
import urllib.request
from typing import Any

import pytest

from .procs import DEADLINE, finish, processes, read_until

pytestmark = pytest.mark.slow  # real processes

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _longer(tmp_path: pathlib.Path, example: str, workload: str) -> pathlib.Path:
    """``examples/EXAMPLE.toml`` under a name of this process's own, with ``workload``
    (its ``messages = N`` line, and what follows it) sending 100,000,000 messages."""
    spec = (ROOT / f"examples/{example}.toml").read_text()
    spec = spec.replace(f'name = "{example}"', f'name = "{example}{os.getpid()}"')
    spec = spec.replace(workload, "messages = 100000000" + workload.partition("\n")[1]
                        + workload.partition("\n")[2])
    path = tmp_path / f"{example}.toml"
    path.write_text(spec)
    return path


def long_universe(tmp_path: pathlib.Path) -> pathlib.Path:
    """The echo example with both clients' workloads long: neither is done before a test
    kills or interrupts it (client1's 2,000 messages alone took milliseconds)."""
    path = _longer(tmp_path, "echo", "messages = 2000\nsize = 64")
    spec = path.read_text().replace("messages = 2000\nsize = 1024",
                                    "messages = 100000000\nsize = 1024")
    path.write_text(spec)
    return path


def start_up(path: pathlib.Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "rdvpump", "universe", "up", str(path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "COLUMNS": "160"})


def child_pid(plan: pathlib.Path, broker: str) -> int:
    """The pid of the broker process playing ``broker`` from ``plan``."""
    for pid, argv in processes().items():
        if str(plan).encode() in argv and broker.encode() in argv and b"--id" in argv:
            return pid
    raise AssertionError(f"no process for {broker}")


def finish_text(proc: subprocess.Popen[bytes]) -> tuple[str, str]:
    out, errs = finish(proc)
    return out.decode(), errs.decode()


def test_a_child_that_dies_stops_the_universe_with_its_name(tmp_path: pathlib.Path) -> None:
    plan = long_universe(tmp_path)
    proc = start_up(plan)
    seen = read_until(proc, proc.stdout, b"client1: running")  # plain lines: stdout is a pipe
    os.kill(child_pid(plan, "client1"), signal.SIGKILL)
    out, errs = finish_text(proc)
    assert proc.returncode == 1
    assert errs.strip() == ("error: broker client1: killed by SIGKILL before its "
                            "workloads were done")
    assert "\x1b[" not in seen.decode() + out  # no live-table escapes into the pipe


def long_stream(tmp_path: pathlib.Path) -> pathlib.Path:
    return _longer(tmp_path, "stream", "messages = 20000")


@pytest.mark.parametrize(("universe", "victim", "shown"), [
    (long_stream, "sink", "sink: serving"), (long_universe, "server", "server: serving")])
def test_a_serving_child_that_dies_stops_the_universe_at_once_with_its_name(
        tmp_path: pathlib.Path, universe: Any, victim: str, shown: str) -> None:
    """A sink or a server has no workload of its own: it serves (so it says, not "done")
    until the universe stops, and its death stops the universe as a client's does."""
    plan = universe(tmp_path)
    proc = start_up(plan)
    seen = read_until(proc, proc.stdout, shown.encode())  # serving, never "done"
    assert f"{victim}: done" not in seen.decode()
    killed = time.monotonic()
    os.kill(child_pid(plan, victim), signal.SIGKILL)
    out, errs = finish_text(proc)
    assert time.monotonic() - killed < 10  # at once, not after a limit
    assert proc.returncode == 1
    assert f"broker {victim}: killed by SIGKILL while the universe ran" in errs, errs
    assert len(errs.strip().splitlines()) == 1 and "Traceback" not in errs


def test_the_manager_s_death_stops_the_universe_at_once_saying_so(
        tmp_path: pathlib.Path) -> None:
    """The name service every broker registers with is gone: the universe stops as for a
    broker's death, naming the manager and how it ended."""
    plan = long_universe(tmp_path)
    spec_name = f"echo{os.getpid()}"
    proc = start_up(plan)
    read_until(proc, proc.stdout, b"client1: running")
    (manager,) = [pid for pid, argv in processes().items()
                  if b"manager" in argv and spec_name.encode() in argv and b"serve" in argv]
    killed = time.monotonic()
    os.kill(manager, signal.SIGKILL)
    out, errs = finish_text(proc)
    assert time.monotonic() - killed < 10  # at once, not after a limit
    assert proc.returncode == 1
    assert errs.strip() == "error: manager: killed by SIGKILL while the universe ran"


def test_a_limit_given_says_what_the_universe_still_waited_for(
        tmp_path: pathlib.Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "rdvpump", "universe", "up",
                             str(long_stream(tmp_path)), "--timeout", "3"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, errs = finish_text(proc)
    assert proc.returncode == 1
    assert errs.startswith("error: the universe did not finish within 3 s (--timeout): it "
                           "waited for producer's workloads, sink's sink ("), errs
    assert errs.rstrip().endswith(" of 100,000,000 messages)"), errs


def test_ctrl_c_says_what_finished_and_exits_130(tmp_path: pathlib.Path) -> None:
    proc = start_up(long_universe(tmp_path))
    read_until(proc, proc.stdout, b"client1: running")
    proc.send_signal(signal.SIGINT)
    out, errs = finish_text(proc)
    assert proc.returncode == 130, errs
    assert errs.strip().splitlines()[-1] == "interrupted; finished before it: no workload"
    assert "Traceback" not in errs


def test_console_serves_the_universe_s_page_and_stays_until_ctrl_c(
        tmp_path: pathlib.Path) -> None:
    """``universe up --console``: every process serves its metrics, and the console shows
    them (both brokers, healthy; the MQ workload's group on its server, with its lag) from
    the universe's start; once the workloads are done the universe and the console stay
    up, saying so, until Ctrl-C, and it exits 0 with the results.  ``--admin`` without a
    console, or with one off the loopback, is one line."""
    from .test_console import snapshots, wait_for

    plan = ROOT / "examples" / "mq.toml"
    proc = subprocess.Popen([sys.executable, "-m", "rdvpump", "universe", "up", str(plan),
                             "--console", "127.0.0.1:0"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, "COLUMNS": "160"})
    try:
        said = read_until(proc, proc.stderr, b"until Ctrl-C\n").decode().splitlines()
        url = said[0].split()[-1]
        assert said == [f"console of universe 'mq' on {url}",
                        f"workloads done; the console stays up at {url} until Ctrl-C"]
        with urllib.request.urlopen(url + "events", timeout=30) as stream:
            # (the first snapshot on the stream may be from while the workload ran)
            shown = wait_for(snapshots(stream), lambda s: len(s["brokers"]) == 2 and [
                g["lag"] for g in s["groups"] if g["topic"] == "workload.app"] == [0])
        assert [(b["id"], b["health"], bool(b["metrics"])) for b in shown["brokers"]] == [
            ("app", "ok", True), ("server", "ok", True)]
        assert proc.poll() is None  # done, and still up for the page
        proc.send_signal(signal.SIGINT)
        out, errs = finish_text(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            finish(proc)
    assert proc.returncode == 0, errs
    assert "mq app->server:15555" in out and "ok" in out
    assert "interrupted" not in errs and "Traceback" not in errs

    alone = subprocess.run([sys.executable, "-m", "rdvpump", "universe", "up", str(plan),
                            "--admin"], capture_output=True, text=True, timeout=60)
    assert alone.returncode == 1
    assert alone.stderr.strip() == ("error: --admin is for the console: give --console "
                                    "HOST:PORT too")
    exposed = subprocess.run([sys.executable, "-m", "rdvpump", "universe", "up", str(plan),
                              "--console", "0.0.0.0:0", "--admin"], capture_output=True,
                             text=True, timeout=60)
    assert exposed.returncode == 1
    assert exposed.stderr.strip() == (
        "error: --admin serves only on a loopback address (127.0.0.1): whoever reaches the "
        "page on 0.0.0.0 could change the universe")


def children_of(plan: pathlib.Path, universe: str) -> set[int]:
    """The pids of the processes started for this universe (brokers and its manager)."""
    return {pid for pid, argv in processes().items() if b"rdvpump" in argv and (
        str(plan).encode() in argv or (b"serve" in argv and universe.encode() in argv))}


def _running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (a zombie has; one that is gone
    between two reads of /proc has too)."""
    try:
        state = pathlib.Path(f"/proc/{pid}/stat").read_bytes().split(b") ")[-1][:1]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != b"Z"


def test_children_exit_when_the_parent_is_killed(tmp_path: pathlib.Path) -> None:
    plan = long_universe(tmp_path)
    proc = start_up(plan)
    read_until(proc, proc.stdout, b"client1: running")
    deadline = time.monotonic() + DEADLINE
    while len(kids := children_of(plan, f"echo{os.getpid()}") - {proc.pid}) < 4:
        assert time.monotonic() < deadline, kids  # the manager, server, client1, client2
        time.sleep(0.05)  # processes listed by the OS: polled, bounded
    proc.kill()  # SIGKILL: the parent cannot stop them
    proc.communicate()
    deadline = time.monotonic() + 30
    try:
        while left := {k for k in kids if _running(k)}:
            assert time.monotonic() < deadline, f"still running: {left}"
            time.sleep(0.05)  # processes to exit: polled, bounded
    finally:
        for k in kids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(k, signal.SIGKILL)
