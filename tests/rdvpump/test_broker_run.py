"""broker run says what fails: a final refusal by the manager ends it with one line naming
the broker and the manager; an unreachable manager is a warning while it dials again."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

from .procs import finish, read_until


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rdvpump(*args: str, token: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "rdvpump", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, "RDVPUMP_TOKEN": token})


def test_a_wrong_token_or_universe_ends_broker_run_naming_both_sides() -> None:
    port = free_port()
    manager = rdvpump("manager", "serve", "--universe", "shop", "--listen",
                      f"127.0.0.1:{port}", token="secret")
    try:
        read_until(manager, manager.stdout, b"ready manager")
        for universe, token in (("shop", "wrong"), ("other", "secret")):
            broker = rdvpump("broker", "run", "--universe", universe, "--id", "orders",
                             "--manager", f"127.0.0.1:{port}", "--echo", "80", token=token)
            _, errs = finish(broker, timeout=30)
            assert broker.returncode == 1, errs
            assert errs.decode().strip() == (
                f"error: broker orders: manager 127.0.0.1:{port} refused it: unauthorized "
                "(the token or the universe name is not the manager's)")
    finally:
        manager.send_signal(signal.SIGINT)
        _, log = finish(manager, timeout=30)
    assert manager.returncode == 0
    assert b"unauthorized connect from '@names." in log and b".orders'" in log


def test_an_unreachable_manager_is_a_warning_and_broker_run_goes_on() -> None:
    port = free_port()  # nothing listens there
    broker = rdvpump("broker", "run", "--universe", "shop", "--id", "orders", "--manager",
                     f"127.0.0.1:{port}", "--echo", "80", token="secret")
    seen = read_until(broker, broker.stderr,
                      f"warning: broker orders: manager 127.0.0.1:{port}: unreachable".encode())
    broker.send_signal(signal.SIGINT)
    _, errs = finish(broker, timeout=30)
    assert broker.returncode == 0  # a service stopped by SIGINT: a clean exit
    assert (seen + errs).count(b"warning:") == 1  # said once: the reason did not change
