"""A universe of real processes on 127.0.0.1: a manager, broker processes, and this test.

One broker process is killed with SIGKILL mid-stream: its peer hears the
close promptly, the manager drops it, and the surviving link loses nothing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio

from brokermgr import BrokerManager, NameClient
from rdv import Address
from tests.ports import free_port
from tests.rdvpump.procs import reap

pytestmark = pytest.mark.slow

RDVPUMP = [sys.executable, "-m", "rdvpump"]
TOKEN = "tok"


@asynccontextmanager
async def spawn(*args: str) -> AsyncIterator[tuple[trio.Process, Address]]:
    """Start ``rdvpump ARGS`` and wait (bounded) for its ``ready ... HOST:PORT`` line."""
    proc = await trio.lowlevel.open_process(
        [*RDVPUMP, *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        env={**os.environ, "RDVPUMP_TOKEN": TOKEN})
    try:
        assert proc.stdout is not None
        line = b""
        with trio.fail_after(30):
            while not line.endswith(b"\n"):
                chunk = await proc.stdout.receive_some(1)
                if not chunk:
                    raise RuntimeError(f"{args[:2]} exited before it was ready")
                line += chunk
        words = line.decode().split()
        assert words[0] == "ready", line
        yield proc, Address.parse(words[-1])
    finally:
        await reap(proc)


async def test_killed_broker_process_is_dropped_and_survivors_lose_nothing() -> None:
    async with spawn("manager", "serve", "--universe", "t", "--listen", "127.0.0.1:0",
                     "--scan", "0.5", "--expiry", "60") as (_, manager_addr):
        manager = f"{manager_addr[0]}:{manager_addr[1]}"
        common = ["--universe", "t", "--manager", manager, "--heartbeat", "1"]
        async with spawn("broker", "run", "--id", "survivor", *common) as (_, _a), \
                spawn("broker", "run", "--id", "victim", *common) as (victim, _b):
            u = BrokerManager("t", token=TOKEN, ring_capacity=4096)
            async with trio.open_nursery() as nursery:
                await nursery.start(u.pump.serve)
                await nursery.start(u.serve_network)
                names = NameClient(u, [manager_addr], heartbeat=1)
                names.start()
                me = u.add_broker("tester")
                with trio.fail_after(30):
                    while True:
                        listed = {b["id"] for b in (await names.list() or [])}
                        if {"survivor", "victim"} <= listed:
                            break
                        await trio.sleep(0.05)
                good = await me.connect_queue("survivor", 80)
                doomed = await me.connect_queue("victim", 80)
                sent = [b"%06d" % i * 50 for i in range(2000)]
                got: list[bytes] = []
                doomed_end: list[BaseException] = []

                async def stream_to_victim() -> None:
                    try:
                        for m in sent:
                            await doomed.send(m)
                            await doomed.receive()
                    except (trio.BrokenResourceError, trio.EndOfChannel,
                            trio.ClosedResourceError) as exc:
                        doomed_end.append(exc)

                async def stream_to_survivor() -> None:
                    for i, m in enumerate(sent):
                        await good.send(m)
                        got.append(await good.receive())
                        if i == 500:
                            victim.send_signal(signal.SIGKILL)

                with trio.fail_after(60):
                    async with trio.open_nursery() as inner:
                        inner.start_soon(stream_to_victim)
                        inner.start_soon(stream_to_survivor)
                assert got == sent  # the surviving link lost nothing
                assert len(doomed_end) == 1  # the victim's peer heard the close
                assert doomed.close_reason is not None
                assert "peer disconnected" in doomed.close_reason or \
                    "connection" in doomed.close_reason
                with trio.fail_after(10):  # dropped on the connection loss, not the expiry
                    while "victim" in {b["id"] for b in (await names.list() or [])}:
                        await trio.sleep(0.05)
                assert "survivor" in {b["id"] for b in (await names.list() or [])}
                names.close()
                nursery.cancel_scope.cancel()


def test_manager_cli_errors_are_one_line() -> None:
    proc = subprocess.run([*RDVPUMP, "manager", "serve", "--listen", "nowhere"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.strip() == "error: address 'nowhere' must be HOST:PORT"
    proc = subprocess.run([*RDVPUMP, "status", "--manager", "127.0.0.1:1"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.strip().startswith("error: manager 127.0.0.1:1: unreachable")
    assert len(proc.stderr.strip().splitlines()) == 1


async def test_status_wait_dials_a_manager_that_is_starting_and_waits_for_brokers() -> None:
    manager = f"127.0.0.1:{free_port()}"
    env = {**os.environ, "RDVPUMP_TOKEN": TOKEN}
    status = [*RDVPUMP, "status", "--universe", "w", "--manager", manager]
    async with trio.open_nursery() as nursery:
        # started before the manager: it dials again until the manager and the broker are up
        waiting = await nursery.start(lambda task_status: trio.run_process(
            [*status, "--wait", "orders", "--timeout", "60"], capture_stdout=True,
            capture_stderr=True, env=env, check=False, task_status=task_status))
        async with spawn("manager", "serve", "--universe", "w", "--listen", manager), \
                spawn("broker", "run", "--id", "orders", "--universe", "w",
                      "--manager", manager):
            with trio.fail_after(60):
                await waiting.wait()
            assert waiting.returncode == 0
            missing = await trio.run_process([*status, "--wait", "orders", "--wait", "ghost",
                                              "--timeout", "0.5"], capture_stdout=True,
                                             capture_stderr=True, env=env, check=False)
    assert missing.returncode == 1
    assert missing.stderr.decode().strip() == (
        f"error: manager {manager}: ghost not registered within 0.5 s")


async def test_status_closes_its_connection_cleanly(tmp_path: object) -> None:
    # The manager's trace tells a client that closed from one that crashed: a status
    # query must read as a close, not as "connection lost".
    import json
    import pathlib

    traces = pathlib.Path(str(tmp_path))
    env = {**os.environ, "RDVPUMP_TOKEN": TOKEN}
    async with spawn("manager", "serve", "--universe", "c", "--listen", "127.0.0.1:0",
                     "--trace", str(traces)) as (manager, address):
        status = await trio.run_process(
            [*RDVPUMP, "status", "--universe", "c", "--manager", f"{address[0]}:{address[1]}"],
            capture_stdout=True, capture_stderr=True, env=env, check=False)
        assert status.returncode == 0, status.stderr
        manager.send_signal(signal.SIGINT)  # the manager ends its trace as it exits
        with trio.fail_after(30):
            assert await manager.wait() == 0
    rows = [json.loads(line) for file in traces.iterdir()
            for line in file.read_text().splitlines()]
    closes = [r for r in rows if r["kind"] == "close" and str(r.get("peer")).startswith("@names")]
    assert [r["reason"] for r in closes] == ["peer disconnected (closed)"]


async def test_a_manager_stopped_by_ctrl_c_closes_its_brokers_links_cleanly(
        tmp_path: object) -> None:
    # The brokers' traces tell a manager that stopped from one that crashed.
    import json
    import pathlib

    traces = pathlib.Path(str(tmp_path))
    env = {**os.environ, "RDVPUMP_TOKEN": TOKEN}
    async with spawn("manager", "serve", "--universe", "s", "--listen",
                     "127.0.0.1:0") as (manager, address):
        where = f"{address[0]}:{address[1]}"
        async with spawn("broker", "run", "--id", "b1", "--universe", "s", "--manager",
                         where, "--trace", str(traces)) as (broker, _):
            listed = await trio.run_process(
                [*RDVPUMP, "status", "--universe", "s", "--manager", where, "--wait", "b1"],
                capture_stdout=True, capture_stderr=True, env=env, check=False)
            assert listed.returncode == 0, listed.stderr
            manager.send_signal(signal.SIGINT)
            with trio.fail_after(30):
                assert await manager.wait() == 0
            broker.send_signal(signal.SIGINT)  # the broker ends its trace as it exits
            with trio.fail_after(30):
                await broker.wait()
    rows = [json.loads(line) for file in traces.iterdir()
            for line in file.read_text().splitlines()]
    closes = [r["reason"] for r in rows if r["kind"] == "close" and r.get("peer") == "@manager"]
    assert closes == ["peer disconnected (name service closed)"]


async def test_a_broker_process_stopped_by_ctrl_c_closes_its_links_cleanly() -> None:
    # A peer of a broker process that stopped hears a close with its reason, not a cut.
    async with spawn("manager", "serve", "--universe", "q", "--listen",
                     "127.0.0.1:0") as (_, manager_addr):
        where = f"{manager_addr[0]}:{manager_addr[1]}"
        async with spawn("broker", "run", "--id", "b2", "--universe", "q", "--manager",
                         where) as (broker, _):
            u = BrokerManager("q", token=TOKEN)
            async with trio.open_nursery() as nursery:
                await nursery.start(u.pump.serve)
                await nursery.start(u.serve_network)
                names = NameClient(u, [manager_addr])
                names.start()
                with trio.fail_after(30):
                    while "b2" not in {b["id"] for b in (await names.list() or [])}:
                        await trio.sleep(0.05)
                    queue = await u.add_broker("tester").connect_queue("b2", 80)
                    await queue.send(b"ping")
                    assert await queue.receive() == b"ping"
                broker.send_signal(signal.SIGINT)
                with trio.fail_after(30):
                    with pytest.raises(trio.EndOfChannel):  # clean: not BrokenResourceError
                        await queue.receive()
                    assert await broker.wait() == 0
                assert queue.close_reason == "peer disconnected (broker process stopped)"
                names.close()
                nursery.cancel_scope.cancel()


def test_a_port_in_use_is_one_clear_line() -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run([*RDVPUMP, "manager", "serve", "--listen", f"127.0.0.1:{port}"],
                              capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.strip() == (
        f"error: cannot listen on 127.0.0.1:{port}: address already in use")


async def test_manager_and_brokers_over_tls(tmp_path: object) -> None:
    import pathlib

    import trustme

    d = pathlib.Path(str(tmp_path))
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.cert_chain_pems[0].write_to_path(str(d / "cert.pem"))
    cert.private_key_pem.write_to_path(str(d / "key.pem"))
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    tls = ["--tls-cert", str(d / "cert.pem"), "--tls-key", str(d / "key.pem"),
           "--tls-ca", str(d / "ca.pem")]
    async with spawn("manager", "serve", "--universe", "s", "--listen", "127.0.0.1:0",
                     *tls) as (_, addr):
        manager = f"{addr[0]}:{addr[1]}"
        async with spawn("broker", "run", "--id", "secure", "--universe", "s",
                         "--manager", manager, *tls):
            status = [*RDVPUMP, "status", "--universe", "s", "--manager", manager]
            env = {**os.environ, "RDVPUMP_TOKEN": TOKEN}
            with trio.fail_after(60):
                ok = await trio.run_process([*status, *tls, "--wait", "secure", "--timeout",
                                             "30"], capture_stdout=True, env=env)
            assert b"secure" in ok.stdout
            plain = await trio.run_process(status, capture_stdout=True, capture_stderr=True,
                                           env=env, check=False)
            assert plain.returncode == 1
            assert plain.stderr.decode().startswith(f"error: manager {manager}: unreachable")


async def test_brokers_register_again_within_250_ms_of_a_restarted_manager() -> None:
    """Ten restarts of a real manager on one port, each after a different downtime (so
    that each falls elsewhere in the broker's back-off): every time the broker registers
    again within 250 ms of the new manager's ready line (by the manager's own account of
    when, its entry's age)."""
    manager = f"127.0.0.1:{free_port()}"
    serve = ("manager", "serve", "--universe", "r", "--listen", manager)
    delays = []
    async with spawn(*serve) as (first, _), spawn("broker", "run", "--id", "orders",
                                                   "--universe", "r", "--manager", manager):
        first.kill()
        await first.wait()
        for restart in range(10):
            await trio.sleep(0.05 + 0.11 * restart)  # the downtime: a different phase each time
            async with spawn(*serve) as (proc, _):
                ready = trio.current_time()
                u = BrokerManager("r", token=TOKEN)
                async with trio.open_nursery() as nursery:
                    await nursery.start(u.pump.serve)
                    await nursery.start(u.serve_network, "127.0.0.1", 0)
                    names = NameClient(u, [Address.parse(manager)], retry=0.02)
                    names.start()
                    with trio.fail_after(10):
                        while True:
                            listed = {b["id"]: b for b in (await names.list() or [])}
                            if "orders" in listed:
                                break
                            await trio.sleep(0.005)
                    # when the manager took the registration: the entry's age, counted back
                    # from its answer (how soon this test's own client looked is not timed)
                    delays.append(trio.current_time() - listed["orders"]["age"] - ready)
                    names.close()
                    nursery.cancel_scope.cancel()
                proc.kill()
                await proc.wait()
    print("re-registered after", [round(d, 3) for d in delays])
    assert max(delays) < 0.25, [round(d, 3) for d in delays]


async def test_status_shows_each_broker_s_replicated_group_role_and_epoch() -> None:
    """Brokers that register a group (here from this process) show it in ``rdvpump
    status``: name/id, role and epoch, and a slave's lag behind its master."""
    from brokermgr import GroupMember, GroupProgress
    from pump import Pump

    places = {"a0": GroupMember("a", 0, "master", epoch=3),
              "a1": GroupMember("a", 1, "slave", epoch=3)}
    env = {**os.environ, "RDVPUMP_TOKEN": TOKEN}
    async with spawn("manager", "serve", "--universe", "g", "--listen", "127.0.0.1:0") as (
            _, manager), trio.open_nursery() as nursery:
        u = BrokerManager("g", token=TOKEN, pump=Pump(name="here"))
        for name in places:
            u.add_broker(name)
        await nursery.start(u.pump.serve)
        await nursery.start(u.serve_network, "127.0.0.1", 0)
        held = {"a0": GroupProgress(100, ("a1",)), "a1": GroupProgress(97)}
        names = NameClient(u, [Address(*manager)], groups=places.get, progress=held.get)
        names.start()
        status = await trio.run_process(
            [*RDVPUMP, "status", "--universe", "g", "--manager", f"{manager[0]}:{manager[1]}",
             "--wait", "a0", "--wait", "a1", "--timeout", "30"],
            capture_stdout=True, capture_stderr=True, env={**env, "COLUMNS": "200"},
            check=False)
        assert status.returncode == 0, status.stderr
        text = status.stdout.decode()
        assert "a/0 master@3" in text and "a/1 slave@3 lag 3, in sync" in text, text
        names.close()
        nursery.cancel_scope.cancel()
