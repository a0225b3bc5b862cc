"""A command pointed at the wrong kind of process says so at once, in one line that names
the address the user gave: a broker process's address given for a manager's, for an MQ
server's or for a tracker's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from .procs import finish, read_until

pytestmark = pytest.mark.slow  # real processes

TOKEN = "secret"
ENV = {**os.environ, "RDVPUMP_TOKEN": TOKEN, "COLUMNS": "200"}
#: Far longer than any answer below takes: each must come well before it.
TIMEOUT = 20.0


def rdvpump(*args: str, timeout: float = 60.0) -> tuple[subprocess.CompletedProcess[str],
                                                        float]:
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "rdvpump", *args], capture_output=True,
                          text=True, timeout=timeout, env=ENV)
    return proc, time.monotonic() - start


def one_error(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 1, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: ") and "Traceback" not in proc.stderr
    return line


def test_a_broker_process_given_for_a_manager_a_server_or_a_tracker_is_named_so() -> None:
    broker = subprocess.Popen(
        [sys.executable, "-m", "rdvpump", "broker", "run", "--universe", "shop", "--id", "b1",
         "--manager", "127.0.0.1:1", "--listen", "127.0.0.1:0", "--echo", "80"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV)
    try:
        where = read_until(broker, broker.stdout, b"\n").decode().split()[-1]
        status, took = rdvpump("status", "--manager", where, "--universe", "shop",
                               "--timeout", str(TIMEOUT))
        assert one_error(status) == (f"error: no manager {where}: the process there "
                                     "answers, but runs no manager (is it a broker "
                                     "process's address?)")
        topics, took = rdvpump("mq", "topics", "--server", f"b1@{where}", "--universe", "shop",
                               "--timeout", str(TIMEOUT))
        assert one_error(topics) == (f"error: b1@{where}: no MQ server there: broker b1 "
                                     "answers, but nothing is bound on its port 15555 (is it "
                                     "a broker run --role server?)")
        assert took < TIMEOUT / 2
        routes, took = rdvpump("routes", "--tracker", where, "--universe", "shop", "--once",
                               "--timeout", str(TIMEOUT))
        assert one_error(routes) == (f"error: no tracker at {where}: the process there "
                                     "answers, but runs no tracker (is it a broker run "
                                     "--role tracker?)")
        routes, took = rdvpump("routes", "--tracker", f"b1@{where}", "--universe", "shop",
                               "--once", "--timeout", str(TIMEOUT))
        assert one_error(routes) == (f"error: no tracker at b1@{where}: the broker answers, "
                                     "but nothing is bound on its port 15555 (is it a broker "
                                     "run --role tracker?)")
        assert took < TIMEOUT / 2
    finally:
        broker.send_signal(signal.SIGINT)
        finish(broker, timeout=30)
    assert broker.returncode == 0


def test_routes_started_with_sigint_ignored_still_stops_on_it() -> None:
    """A script's background job (``rdvpump routes ... &``) starts with SIGINT ignored:
    the command still ends on it, in one line, exit 130."""
    routes = subprocess.Popen(
        [sys.executable, "-m", "rdvpump", "routes", "--tracker", "127.0.0.1:1", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))  # noqa: PLW1509
    try:
        # it dials the tracker that is not there: the dial's warning says it is running
        read_until(routes, routes.stderr, b"unreachable")
        routes.send_signal(signal.SIGINT)
        _, errs = finish(routes, timeout=30)
    finally:
        routes.kill()
        finish(routes, timeout=30)
    assert routes.returncode == 130, errs
    assert errs.decode().strip().splitlines()[-1] == "interrupted"
