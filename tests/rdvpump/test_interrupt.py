"""Ctrl-C (SIGINT) ends interactive commands with one line, "interrupted", and exit 130."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from .procs import DEADLINE, finish, read_until

ROOT = pathlib.Path(__file__).resolve().parents[2]

def start(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "rdvpump", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, "COLUMNS": "120"})


def interrupt_and_check(proc: subprocess.Popen[bytes], seen: bytes = b"") -> None:
    proc.send_signal(signal.SIGINT)
    out, errs = finish(proc, timeout=30)
    errs = seen + errs
    assert proc.returncode == 130, (proc.returncode, errs.decode()[-2000:])
    assert errs.decode().strip().splitlines()[-1] == "interrupted"
    assert b"Traceback" not in errs and b"Traceback" not in out


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


@pytest.mark.spark
def test_ctrl_c_ends_trace_analyze_in_one_line(tmp_path: pathlib.Path) -> None:
    traces = tmp_path / "traces"
    run = subprocess.run([sys.executable, "-m", "rdvpump", "universe", "run",
                          str(ROOT / "examples/echo.toml"), "--trace", str(traces)],
                         capture_output=True, timeout=120)
    assert run.returncode == 0, run.stderr
    proc = start("trace", "analyze", str(traces), "--verbose")
    seen = read_until(proc, proc.stderr, b"census of the events")  # Spark is up and working
    interrupt_and_check(proc, seen)
