"""broker run says what fails: a final refusal by the manager ends it with one line naming
the broker and the manager; an unreachable manager is a warning while it dials again."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from tests.ports import free_port

from .procs import finish, read_until

pytestmark = pytest.mark.slow  # real processes


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
            out, errs = finish(broker, timeout=30)
            assert broker.returncode == 1, errs
            assert out == b"", out  # no ready line: the broker never was
            assert errs.decode().strip() == (
                f"error: broker orders: manager 127.0.0.1:{port} refused it: unauthorized "
                "(the token or the universe name is not the manager's)")
            # a tool's command says what unauthorized means too
            shown = subprocess.run(
                [sys.executable, "-m", "rdvpump", "status", "--universe", universe,
                 "--manager", f"127.0.0.1:{port}"], capture_output=True, text=True,
                timeout=60, env={**os.environ, "RDVPUMP_TOKEN": token})
            assert shown.returncode == 1 and shown.stderr == (
                f"error: manager 127.0.0.1:{port}: unauthorized (the token or the universe "
                "name is not the manager's: --token or $RDVPUMP_TOKEN, and --universe)\n")
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


def status(port: int) -> str:
    proc = subprocess.run([sys.executable, "-m", "rdvpump", "status", "--universe", "shop",
                           "--manager", f"127.0.0.1:{port}"], capture_output=True, text=True,
                          timeout=30, env={**os.environ, "RDVPUMP_TOKEN": "secret",
                                           "COLUMNS": "200"})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def wait_listed(port: int, broker_address: str) -> None:
    """Until the manager lists a broker at that address (polled, bounded)."""
    deadline = time.monotonic() + 30
    while broker_address not in status(port):
        assert time.monotonic() < deadline, status(port)
        time.sleep(0.1)  # registration is asynchronous: polled through the CLI, bounded


def test_a_second_live_registration_of_an_id_is_refused_and_a_restart_is_not() -> None:
    port = free_port()
    manager = rdvpump("manager", "serve", "--universe", "shop", "--listen",
                      f"127.0.0.1:{port}", token="secret")
    brokers = []
    try:
        read_until(manager, manager.stdout, b"ready manager")

        def orders() -> tuple[subprocess.Popen[bytes], str]:
            proc = rdvpump("broker", "run", "--universe", "shop", "--id", "orders",
                           "--manager", f"127.0.0.1:{port}", "--heartbeat", "0.5",
                           token="secret")
            brokers.append(proc)
            line = read_until(proc, proc.stdout, b"\n").decode()
            return proc, line.split()[-1]

        first, first_address = orders()
        wait_listed(port, first_address)
        second = rdvpump("broker", "run", "--universe", "shop", "--id", "orders",
                         "--manager", f"127.0.0.1:{port}", token="secret")
        brokers.append(second)
        out, errs = finish(second, timeout=30)
        assert second.returncode == 1
        assert out == b"", out  # no ready line: the refused broker never was
        assert errs.decode().strip() == (
            f"error: broker orders: manager 127.0.0.1:{port} refused it: duplicate id: "
            f"orders (held by {first_address})")
        assert first_address in status(port)  # the first keeps its registration
        first.kill()  # a crash: its connection closes with it, and so does the registration
        first.wait()
        third, third_address = orders()
        wait_listed(port, third_address)  # a restart registers at once
        third.send_signal(signal.SIGINT)
        finish(third, timeout=30)
        assert third.returncode == 0
    finally:
        for proc in brokers:
            if proc.poll() is None:
                proc.kill()
            finish(proc, timeout=30)
        manager.send_signal(signal.SIGINT)
        finish(manager, timeout=30)


def test_a_tracker_not_found_is_a_warning_naming_it() -> None:
    broker = rdvpump("broker", "run", "--universe", "shop", "--id", "s1", "--role", "server",
                     "--tracker", "t9:15555", "--manager", f"127.0.0.1:{free_port()}",
                     token="secret")
    read_until(broker, broker.stderr,
               b"warning: broker s1: tracker t9:15555: unknown broker; dialling again")
    broker.send_signal(signal.SIGINT)
    finish(broker, timeout=30)
    assert broker.returncode == 0


async def test_a_tracker_that_refuses_for_good_ends_broker_run_naming_the_tracker() -> None:
    """A tracker process of another token, found through the manager: s1's link to it is
    refused as unauthorized, so s1 ends with one line that names the tracker."""
    import trio

    from brokermgr import BrokerManager, NameClient
    from rdv import Address

    port = free_port()
    manager = rdvpump("manager", "serve", "--universe", "shop", "--listen",
                      f"127.0.0.1:{port}", token="secret")
    tracker = rdvpump("broker", "run", "--universe", "shop", "--id", "t1", "--role", "tracker",
                      "--listen", "127.0.0.1:0", "--manager", f"127.0.0.1:{free_port()}",
                      token="another")
    try:
        read_until(manager, manager.stdout, b"ready manager")
        ready = read_until(tracker, tracker.stdout, b"\n").decode().split()
        assert ready[0] == "ready", ready
        # the directory says t1 lives in the tracker's process, whose token differs
        test = BrokerManager("shop", token="secret")
        async with trio.open_nursery() as nursery:
            await nursery.start(test.pump.serve)
            await nursery.start(test.serve_network, "127.0.0.1", 0)
            names = NameClient(test, [Address.parse(f"127.0.0.1:{port}")], retry=0.1)
            link = names.links[0]
            names.start()
            with trio.fail_after(30):
                while link.queue is None:
                    await link.attempted()
                reply = await link.call({"cmd": "register", "brokers": [
                    {"id": "t1", "address": list(Address.parse(ready[-1]))}]}, timeout=10)
            assert reply["cmd"] == "registered", reply
            server = rdvpump("broker", "run", "--universe", "shop", "--id", "s1", "--role",
                             "server", "--tracker", "t1:15555", "--manager",
                             f"127.0.0.1:{port}", token="secret")
            _, errs = await trio.to_thread.run_sync(lambda: finish(server, timeout=30))
            names.close()
            nursery.cancel_scope.cancel()
        assert server.returncode == 1, errs
        assert errs.decode().strip().splitlines()[-1] == (
            "error: broker s1: tracker t1:15555 refused it: unauthorized (the token or the "
            "universe name is not the tracker's)")
    finally:
        for proc in (tracker, manager):
            proc.send_signal(signal.SIGINT)
            finish(proc, timeout=30)


@pytest.mark.parametrize("store", [None, "--mq-dir", "--state-dir"])
def test_tracking_without_a_store_says_so_once_and_with_one_not_at_all(
        store: str | None, tmp_path: pathlib.Path) -> None:
    """The note that versions follow the wall clock is for a process that keeps nothing;
    an MQ server's directory keeps them, as a state directory does."""
    port = free_port()  # no manager: the broker dials and goes on
    args = ["broker", "run", "--universe", "shop", "--id", "s1", "--manager",
            f"127.0.0.1:{port}", "--role", "server"]
    if store is not None:
        args += [store, str(tmp_path)]
    broker = rdvpump(*args, token="secret")
    seen = read_until(broker, broker.stderr, b"unreachable").decode()
    broker.send_signal(signal.SIGINT)
    _, errs = finish(broker, timeout=30)
    said = (seen + errs.decode()).count("note: tracking without --state-dir")
    assert said == (1 if store is None else 0), seen + errs.decode()


def test_a_group_member_holding_a_topic_stops_cleanly_on_sigterm_and_ctrl_c(
        tmp_path: pathlib.Path) -> None:
    """SIGTERM (``kill``) or SIGINT (Ctrl-C) of a replicated group's members, each
    holding a topic with messages: each unregisters and exits 0, saying nothing after
    its ready line, as a server outside a group does."""
    port = free_port()
    manager = rdvpump("manager", "serve", "--universe", "shop", "--listen",
                      f"127.0.0.1:{port}", token="secret")
    members: dict[str, subprocess.Popen[bytes]] = {}
    try:
        read_until(manager, manager.stdout, b"ready manager")
        addresses = {}
        for member_id in (0, 1):
            name = f"r{member_id}"
            members[name] = proc = rdvpump(
                "broker", "run", "--universe", "shop", "--id", name, "--manager",
                f"127.0.0.1:{port}", "--listen", "127.0.0.1:0", "--role", "server",
                "--mq-dir", str(tmp_path), "--group", "g", "--group-id", str(member_id),
                "--heartbeat", "0.5", token="secret")
            line = read_until(proc, proc.stdout, b"\n").decode()
            addresses[name] = line.split()[-1]
        mq = [sys.executable, "-m", "rdvpump", "mq"]
        env = {**os.environ, "RDVPUMP_TOKEN": "secret"}
        for args, stdin in ((["declare", "orders"], b""),
                            (["publish", "orders"], b"".join(b"%d\n" % i for i in range(100)))):
            done = subprocess.run([*mq, *args, "--server", f"r0@{addresses['r0']}",
                                   "--universe", "shop", "--timeout", "30"], input=stdin,
                                  capture_output=True, env=env, timeout=60)
            assert done.returncode == 0, done.stderr
        deadline = time.monotonic() + 30
        while True:  # the slave's copy: both members hold the topic
            topics = subprocess.run([*mq, "topics", "--json", "--server",
                                     f"r1@{addresses['r1']}", "--universe", "shop"],
                                    capture_output=True, env=env, timeout=60)
            held = json.loads(topics.stdout or b"{}").get("orders", {}).get("next")
            if topics.returncode == 0 and held == 100:
                break
            assert time.monotonic() < deadline, topics
            time.sleep(0.1)  # replication is asynchronous: polled through the CLI, bounded
        for (name, proc), sig in zip(members.items(), (signal.SIGINT, signal.SIGTERM),
                                     strict=True):
            proc.send_signal(sig)
            out, errs = finish(proc, timeout=30)
            assert proc.returncode == 0, (name, errs.decode()[-2000:])
            assert out == b"" and b"Traceback" not in errs and b"Error" not in errs, (
                name, errs.decode()[-2000:])
    finally:
        for proc in members.values():
            if proc.poll() is None:
                proc.kill()
            finish(proc, timeout=30)
        manager.send_signal(signal.SIGINT)
        finish(manager, timeout=30)


def test_a_former_master_rejoins_as_a_slave_without_a_refusal_logged(
        tmp_path: pathlib.Path) -> None:
    """A master SIGKILLed, its slave promoted, and the master restarted on its directory:
    it comes back a slave of the new master, and neither it nor the manager calls that
    normal rejoin a refused registration; the restarted member says it in one line."""
    port = free_port()
    manager = rdvpump("manager", "serve", "--universe", "shop", "--listen",
                      f"127.0.0.1:{port}", token="secret")
    procs: list[subprocess.Popen[bytes]] = []

    def member(member_id: int) -> tuple[subprocess.Popen[bytes], str]:
        proc = rdvpump("broker", "run", "--universe", "shop", "--id", f"r{member_id}",
                       "--manager", f"127.0.0.1:{port}", "--listen", "127.0.0.1:0",
                       "--role", "server", "--mq-dir", str(tmp_path), "--group", "g",
                       "--group-id", str(member_id), "--heartbeat", "0.5", token="secret")
        procs.append(proc)
        return proc, read_until(proc, proc.stdout, b"\n").decode().split()[-1]

    try:
        read_until(manager, manager.stdout, b"ready manager")
        (first, address), (second, _) = member(0), member(1)
        for args, stdin in ((["declare", "orders"], b""), (["publish", "orders"], b"1\n2\n")):
            done = subprocess.run(
                [sys.executable, "-m", "rdvpump", "mq", *args, "--server", f"r0@{address}",
                 "--universe", "shop", "--timeout", "30"], input=stdin, capture_output=True,
                env={**os.environ, "RDVPUMP_TOKEN": "secret"}, timeout=60)
            assert done.returncode == 0, done.stderr
        wait_shown(port, "g/1 slave@1 lag 0, in sync")  # the one a failover may promote
        first.kill()
        first.wait()
        read_until(second, second.stderr, b"master of group g at epoch 2")
        again, _ = member(0)
        wait_shown(port, "g/0 slave@2")
        read_until(again, again.stderr, b"no longer master of group g")
        for proc in (again, second, manager):
            proc.send_signal(signal.SIGINT)
            _, errs = finish(proc, timeout=30)
            assert proc.returncode == 0, errs.decode()[-2000:]
            assert b"refused" not in errs, errs.decode()[-2000:]
    finally:
        for proc in [*procs, manager]:
            if proc.poll() is None:
                proc.kill()
            finish(proc, timeout=30)


def wait_shown(port: int, text: str) -> None:
    """Until ``rdvpump status`` shows ``text`` (polled, bounded)."""
    deadline = time.monotonic() + 30
    while text not in status(port):
        assert time.monotonic() < deadline, status(port)
        time.sleep(0.1)  # registration is asynchronous: polled through the CLI, bounded


async def as_client(where: str, work: Callable[[Any], Awaitable[None]]) -> None:
    """``work`` done by a client of server ``s1`` of universe ``shop`` (token ``secret``),
    which listens at ``where``: a universe of the client's own in this process."""
    import trio

    from brokermgr import BrokerManager
    from mq import MqClient
    from rdv import Address

    client_side = BrokerManager("shop", token="secret")
    client_side.directory["s1"] = Address.parse(where)
    async with trio.open_nursery() as nursery:
        await nursery.start(client_side.pump.serve)
        await nursery.start(client_side.serve_network, "127.0.0.1", 0)
        client = MqClient(client_side.add_broker("c"), "s1:15555", timeout=10)
        with trio.fail_after(60):
            await client.connected()
            await work(client)
        client.close()
        nursery.cancel_scope.cancel()


async def test_a_server_raises_its_open_files_limit_for_its_topics(
        tmp_path: pathlib.Path) -> None:
    """A server keeps a file open for the last segment of each topic: started with a
    soft limit of 64 open files (Linux's usual 1,024 would be some thousand topics), it
    raises it to its hard limit and opens 100 topics."""
    import resource

    from mq import MqClient

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 256:
        pytest.skip(f"a hard limit of {hard} open files: no room to raise it")
    port = free_port()  # no manager: the client is told where the server listens
    server = subprocess.Popen(
        [sys.executable, "-m", "rdvpump", "broker", "run", "--universe", "shop", "--id",
         "s1", "--manager", f"127.0.0.1:{port}", "--listen", "127.0.0.1:0", "--role",
         "server", "--mq-dir", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "RDVPUMP_TOKEN": "secret"},
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard)))

    async def hundred_topics(client: MqClient) -> None:
        for i in range(100):
            await client.declare(f"t{i}")
            await client.publish(f"t{i}", b"stored")

    try:
        await as_client(read_until(server, server.stdout, b"\n").decode().split()[-1],
                        hundred_topics)
    finally:
        server.send_signal(signal.SIGINT)
        _, errs = finish(server, timeout=30)
    assert server.returncode == 0, errs.decode()[-2000:]
    assert len(list(tmp_path.glob("s1/t*/segments/*.seg"))) == 100


async def test_a_topic_of_many_segments_needs_no_more_open_files(
        tmp_path: pathlib.Path) -> None:
    """A sealed segment's file is closed, and opened again when it is read: a server held
    to 64 open files stores a topic in some 200 segments, starts again on them, and a
    consumer reads every message from the first segment on."""
    import resource

    from mq import MqClient

    def start() -> tuple[subprocess.Popen[bytes], str]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rdvpump", "broker", "run", "--universe", "shop", "--id",
             "s1", "--manager", f"127.0.0.1:{free_port()}", "--listen", "127.0.0.1:0",
             "--role", "server", "--mq-dir", str(tmp_path), "--segment-mb", "0.01"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env={**os.environ, "RDVPUMP_TOKEN": "secret"},
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64)))
        return proc, read_until(proc, proc.stdout, b"\n").decode().split()[-1]

    async def produce(client: MqClient) -> None:
        await client.declare("t")
        for i in range(200):  # a segment of 10 messages each
            await client.publish_many("t", [b"%04d" % (i * 10 + j) + b"x" * 996
                                            for j in range(10)])

    got: list[bytes] = []

    async def consume(client: MqClient) -> None:
        subscription = await client.subscribe("t")
        while len(got) < 2_000:
            batch = await subscription.receive_batch()
            got.extend(bytes(body[:4]) for body in batch.bodies)
            await batch.ack()

    for work in (produce, consume):
        server, where = start()
        try:
            await as_client(where, work)
        finally:
            server.send_signal(signal.SIGINT)
            _, errs = finish(server, timeout=30)
        assert server.returncode == 0, errs.decode()[-2000:]
    assert len(list(tmp_path.glob("s1/t/segments/*.seg"))) > 150
    assert got == [b"%04d" % i for i in range(2_000)]
