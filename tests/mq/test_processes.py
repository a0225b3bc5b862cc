"""The MQ server as a real process on 127.0.0.1: SIGKILL it mid-stream and restart it on
the same directory; SIGKILL a consumer process and its messages reach another consumer."""

from __future__ import annotations

import array
import fcntl
import json
import os
import pathlib
import signal
import subprocess
import termios
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from brokermgr import BrokerManager
from mq import MqClient, ServiceError
from pump import Pump
from rdv import Address
from tests.rdvpump.procs import reap
from tests.rdvpump.test_processes import RDVPUMP, TOKEN, spawn

pytestmark = pytest.mark.slow


def server_args(manager: tuple[str, int], directory: pathlib.Path) -> list[str]:
    return ["broker", "run", "--id", "s1", "--universe", "q", "--manager",
            f"{manager[0]}:{manager[1]}", "--role", "server", "--mq-dir", str(directory),
            "--topic", "orders", "--durability", "sync"]


@asynccontextmanager
async def a_server_and_a_client(tmp_path: pathlib.Path, messages: int
                                ) -> AsyncIterator[tuple[MqClient, str]]:
    """A manager and an MQ server process, and a client here that has published
    ``messages`` to ``orders``: the client, and the server as ``rdvpump mq`` names it."""
    universe = BrokerManager("q", token=TOKEN, pump=Pump(name="test"))
    async with spawn("manager", "serve", "--universe", "q", "--listen", "127.0.0.1:0") as (
            _, manager), spawn(*server_args(manager, tmp_path)) as (
            _, address), trio.open_nursery() as nursery:
        await nursery.start(universe.pump.serve)
        await nursery.start(universe.serve_network, "127.0.0.1", 0)
        universe.directory["s1"] = address
        client = MqClient(universe.add_broker("client"), "s1:15555", timeout=5)
        await client.connected()
        await client.publish_many("orders", [b"%d" % i for i in range(messages)])
        yield client, f"s1@{address[0]}:{address[1]}"
        client.close()
        nursery.cancel_scope.cancel()


async def test_sigkill_of_the_server_loses_nothing_acknowledged(tmp_path: pathlib.Path) -> None:
    universe = BrokerManager("q", token=TOKEN, pump=Pump(name="test"))
    async with spawn("manager", "serve", "--universe", "q", "--listen", "127.0.0.1:0") as (
            _, manager), trio.open_nursery() as nursery:
        await nursery.start(universe.pump.serve)
        await nursery.start(universe.serve_network, "127.0.0.1", 0)
        acked: dict[int, bytes] = {}
        uncertain: set[bytes] = set()
        n = 0
        async with spawn(*server_args(manager, tmp_path)) as (server, address):
            universe.directory["s1"] = address
            producer = MqClient(universe.add_broker("producer"), "s1:15555", timeout=5)
            await producer.connected()
            while len(acked) < 400:
                bodies = [b"m%06d" % (n + i) for i in range(7)]
                n += len(bodies)
                for stored, body in zip(await producer.publish_many("orders", bodies), bodies,
                                        strict=True):
                    acked[stored.offset] = body
            # a second server on its directory is refused before it reads a file: one line
            second = await trio.run_process([*RDVPUMP, *server_args(manager, tmp_path)],
                                            capture_stdout=True, capture_stderr=True,
                                            check=False, env={**os.environ,
                                                              "RDVPUMP_TOKEN": TOKEN})
            assert (second.returncode, second.stdout) == (1, b"")
            assert second.stderr.decode().splitlines() == [
                f"error: {tmp_path / 's1'}: in use by another MQ server (pid {server.pid}); "
                f"one directory serves one server at a time"]
            # mid-stream: publishes in flight when the kill lands
            async with trio.open_nursery() as inner:
                async def publish_on() -> None:
                    nonlocal n
                    while True:
                        body = b"m%06d" % n
                        n += 1
                        try:
                            stored = await producer.publish("orders", body)
                        except ServiceError:
                            uncertain.add(body)  # may or may not be stored
                            return
                        acked[stored.offset] = body

                inner.start_soon(publish_on)
                await trio.sleep(0.2)
                server.send_signal(signal.SIGKILL)
        producer.close()
        # the same directory, a new process (and port): the lock died with the process
        async with spawn(*server_args(manager, tmp_path)) as (_, address):
            universe.directory["s1"] = address
            consumer = MqClient(universe.add_broker("consumer"), "s1:15555", timeout=5)
            await consumer.connected()
            subscription = await consumer.subscribe("orders", window=500)
            got: dict[int, bytes] = {}
            with trio.fail_after(30):
                while len(got) < max(acked) + 1:
                    message = await subscription.receive()
                    got[message.offset] = message.body
                    await message.ack()
            for offset, body in acked.items():
                assert got[offset] == body  # every acknowledged message, at its offset
            extra = {body for offset, body in got.items() if offset not in acked}
            assert extra <= uncertain  # anything else was a publish with no answer
            assert [got[o] for o in sorted(got)] == sorted(got.values())  # in order
            consumer.close()
        nursery.cancel_scope.cancel()


async def stuck_writing(proc: trio.Process) -> None:
    """Until ``proc`` is blocked writing into its full stdout pipe (polled): the kernel
    says so in its wait channel (``pipe_write``); where that is hidden, the pipe's
    content no longer growing for a second says it."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()  # type: ignore[attr-defined]
    last, still = -1, 0
    while True:
        if "pipe" in pathlib.Path(f"/proc/{proc.pid}/wchan").read_text():
            return
        pending = array.array("i", [0])
        fcntl.ioctl(fd, termios.FIONREAD, pending)
        still = still + 1 if pending[0] == last else 0
        if still >= 50:
            return
        last = pending[0]
        await trio.sleep(0.02)


async def test_a_killed_consumer_s_messages_reach_the_other(tmp_path: pathlib.Path) -> None:
    """A consumer process SIGKILLed while it holds messages it has not acknowledged (its
    output unread: it is stuck writing 4 KiB lines into a full pipe, before the ack of
    what it is printing): each message it did not print reaches another consumer, and
    the group owes nothing once that one has acknowledged them."""
    async with a_server_and_a_client(tmp_path, 1) as (client, where):
        await client.publish_many("orders", [b"%04d" % i * 1024 for i in range(1, 200)])
        killed = await trio.lowlevel.open_process(
            [*RDVPUMP, "mq", "consume", "orders", "--server", where, "--universe", "q",
             "--window", "1000", "--idle", "30", "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            env={**os.environ, "RDVPUMP_TOKEN": TOKEN})
        printed: list[int] = []
        try:
            assert killed.stdout is not None
            buffer = b""
            with trio.fail_after(30):
                while len(printed) < 20:  # then no more is read: its pipe fills
                    buffer += await killed.stdout.receive_some(65536)
                    *lines, buffer = buffer.split(b"\n")
                    printed += [json.loads(line)["offset"] for line in lines if line]
            with trio.fail_after(30):
                await stuck_writing(killed)
            killed.send_signal(signal.SIGKILL)
            with trio.fail_after(10):  # everything it printed, so everything it may have acked
                while chunk := await killed.stdout.receive_some(65536):
                    buffer += chunk
            *whole, _cut = buffer.split(b"\n")  # a line cut by the kill was not acked
            printed += [json.loads(line)["offset"] for line in whole if line]
        finally:
            await reap(killed)
        unprinted = set(range(200)) - set(printed)
        assert len(unprinted) > 100  # a 64 KiB pipe holds 16 of its lines
        subscription = await client.subscribe("orders", window=500)
        got: set[int] = set()
        with trio.fail_after(30):
            while not unprinted <= got:
                message = await subscription.receive()
                got.add(message.offset)
                await message.ack()
            while True:  # the group owes nothing: every message acknowledged by one of them
                group = (await client.query("orders"))["orders"]["groups"]["orders"]
                if (group["lag"], group["inFlight"]) == (0, 0):
                    break
                for message in await subscription.receive_many():
                    got.add(message.offset)
                    await message.ack()
        assert got | set(printed) == set(range(200))


async def test_two_servers_a_server_killed_and_restarted_every_acked_message_arrives(
        tmp_path: pathlib.Path) -> None:
    """A producer and a consumer that follow a tracker's routes, two server processes;
    one is SIGKILLed mid-stream and restarted on its directory."""
    from brokermgr.tracking import RouteClient
    from mq import Consumer, History, Producer

    universe = BrokerManager("q", token=TOKEN, pump=Pump(name="test"))
    quick = ["--report-interval", "0.5", "--track-expiry", "3", "--track-scan", "0.5"]

    def server(name: str, manager: tuple[str, int]) -> list[str]:
        return ["broker", "run", "--id", name, "--universe", "q", "--manager",
                f"{manager[0]}:{manager[1]}", "--role", "server", "--tracker", "t1:15555",
                "--mq-dir", str(tmp_path), "--topic", "orders", *quick]

    async with spawn("manager", "serve", "--universe", "q", "--listen", "127.0.0.1:0") as (
            _, manager), \
            spawn("broker", "run", "--id", "t1", "--universe", "q", "--manager",
                  f"{manager[0]}:{manager[1]}", "--role", "tracker", *quick) as (_, t1), \
            spawn(*server("s2", manager)) as (_, s2), trio.open_nursery() as nursery:
        await nursery.start(universe.pump.serve)
        await nursery.start(universe.serve_network, "127.0.0.1", 0)
        universe.directory.update({"t1": t1, "s2": s2})
        routes = RouteClient(universe.add_broker("app"), retry=0.2)
        routes.add_tracker("t1:15555")
        acked: dict[bytes, str] = {}
        history = History()
        async with spawn(*server("s1", manager)) as (s1_proc, s1):
            universe.directory["s1"] = s1
            with trio.fail_after(30):
                while len(routes.routes.servers_of("orders")) < 2:
                    await routes.changed()
            consumer = Consumer(routes, "orders", window=500)
            await nursery.start(consumer.run)
            with trio.fail_after(30):  # both servers have a consumer: round robin uses both
                while not all(t.consumer_count for t in
                              routes.routes.servers_of("orders").values()):
                    await routes.changed()
            producer = Producer(routes, "orders", timeout=2)
            for i in range(300):
                if i == 150:
                    s1_proc.send_signal(signal.SIGKILL)
                body = b"%06d" % i
                stored = await producer.publish(body)
                acked[body] = stored.server
                history.publish("orders", producer.producer, producer.sequence,
                                partition=stored.server, offset=stored.offset)
        # s1 comes back on the same directory (a new port)
        async with spawn(*server("s1", manager)) as (_, s1):
            universe.directory["s1"] = s1
            seen: dict[bytes, list[str]] = {}
            by_server: dict[str, list[tuple[int, int]]] = {}
            with trio.fail_after(60):
                while not set(acked) <= set(seen):
                    message = await consumer.receive()
                    where = message.subscription.client.server.address
                    seen.setdefault(message.body, []).append(where)
                    by_server.setdefault(where, []).append((message.offset, message.sequence))
                    history.consume("orders", message.group, message.producer,
                                    message.sequence, partition=where, offset=message.offset)
                    await message.ack()
                    history.ack("orders", message.group, message.offset, "unknown",
                                partition=where)  # sent; the server confirms none
            # every acknowledged publish arrived; in order per server (offsets and
            # sequence numbers rise together)
            for deliveries in by_server.values():
                first = sorted(dict(deliveries).items())
                assert [q for _, q in first] == sorted(q for _, q in first)
            # a duplicate has a copy from s1: a publish retried after the kill (stored
            # there before it went quiet) or a delivery s1 made again after its restart
            duplicates = {b: w for b, w in seen.items() if len(w) > 1}
            assert all("s1:15555" in w for w in duplicates.values()), duplicates
            assert set(acked.values()) == {"s1:15555", "s2:15555"}
            assert producer.retried >= 1  # the kill made at least one publish go elsewhere
            # the history checker agrees: nothing acknowledged lost, nothing stored twice
            # on one server, each server's offsets in each producer's order
            report = history.check({"orders": ["orders"]})
            assert report.ok, report.findings[:5]
            assert report.counts["acknowledged"] == 300
            print(f"{len(acked)} acknowledged, {len(duplicates)} delivered twice, "
                  f"{producer.retried} publishes retried")
            consumer.close()
            producer.close()
        routes.close()
        nursery.cancel_scope.cancel()


async def test_ctrl_c_on_mq_consume_is_one_line_and_exit_130(tmp_path: pathlib.Path) -> None:
    async with spawn("manager", "serve", "--universe", "q", "--listen", "127.0.0.1:0") as (
            _, manager), spawn(*server_args(manager, tmp_path)) as (_, address):
        where = f"s1@{address[0]}:{address[1]}"
        publish = await trio.run_process(
            [*RDVPUMP, "mq", "publish", "orders", "--server", where, "--universe", "q"],
            stdin=b"one\n", capture_stdout=True, capture_stderr=True,
            env={**os.environ, "RDVPUMP_TOKEN": TOKEN})
        assert publish.returncode == 0
        consumer = await trio.lowlevel.open_process(
            [*RDVPUMP, "mq", "consume", "orders", "--server", where, "--universe", "q",
             "--idle", "60"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env={**os.environ, "RDVPUMP_TOKEN": TOKEN})
        try:
            assert consumer.stdout is not None and consumer.stderr is not None
            with trio.fail_after(30):
                line = b""
                while not line.endswith(b"\n"):  # it consumes: it is up
                    line += await consumer.stdout.receive_some(1)
            assert line == b"one\n"
            consumer.send_signal(signal.SIGINT)
            with trio.fail_after(10):
                await consumer.wait()
                errors = b""
                while chunk := await consumer.stderr.receive_some(65536):
                    errors += chunk
            assert consumer.returncode == 130
            assert errors.decode().strip() == "interrupted"  # one line, no traceback
        finally:
            await reap(consumer)


async def test_ctrl_c_stops_mq_publish_reading_a_terminal(tmp_path: pathlib.Path) -> None:
    """``rdvpump mq publish`` reading lines typed at a terminal (a pty, never closed):
    each line is published as it is typed, and Ctrl-C (SIGINT to its process group)
    ends it at once with one line and exit 130, with no Ctrl-D, publishing nothing
    more."""
    import pty

    async with a_server_and_a_client(tmp_path, 10) as (client, where):
        terminal, typed = pty.openpty()
        publisher = await trio.lowlevel.open_process(
            [*RDVPUMP, "mq", "publish", "orders", "--server", where, "--universe", "q"],
            stdin=typed, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env={**os.environ, "RDVPUMP_TOKEN": TOKEN}, start_new_session=True)
        os.close(typed)
        try:
            async def stored() -> int:
                return int((await client.query("orders"))["orders"]["next"])

            for line, want in ((b"one\n", 11), (b"two\n", 12)):
                os.write(terminal, line)
                with trio.fail_after(30):
                    while await stored() < want:  # published as typed: polled, bounded
                        await trio.sleep(0.02)
            os.killpg(publisher.pid, signal.SIGINT)
            with trio.fail_after(10):
                await publisher.wait()
            assert publisher.stderr is not None
            errors = await publisher.stderr.receive_some(65536)
            assert publisher.returncode == 130, errors
            assert errors.decode().strip() == "interrupted"  # one line, no traceback
            os.write(terminal, b"three\n")  # typed after Ctrl-C: nobody reads it
            assert await stored() == 12
        finally:
            os.close(terminal)
            await reap(publisher)


async def test_mq_consume_with_idle_0_consumes_until_ctrl_c_and_acks_as_it_waits(
        tmp_path: pathlib.Path) -> None:
    """``mq consume --idle 0`` never stops for want of messages: it prints what comes,
    however late, and acknowledges what it printed before it waits again (the group owes
    nothing while it waits); Ctrl-C ends it."""
    async with a_server_and_a_client(tmp_path, 3) as (client, where):
        consumer = await trio.lowlevel.open_process(
            [*RDVPUMP, "mq", "consume", "orders", "--server", where, "--universe", "q",
             "--idle", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env={**os.environ, "RDVPUMP_TOKEN": TOKEN})
        try:
            stdout = consumer.stdout
            assert stdout is not None
            printed = b""

            async def printed_until(lines: int) -> None:
                nonlocal printed
                with trio.fail_after(30):
                    while printed.count(b"\n") < lines:
                        printed += await stdout.receive_some(65536)

            async def owed() -> tuple[int, int]:
                group = (await client.query("orders"))["orders"]["groups"]["orders"]
                return group["lag"], group["inFlight"]

            await printed_until(3)
            with trio.fail_after(30):
                while await owed() != (0, 0):  # acknowledged while it waits: polled
                    await trio.sleep(0.02)
            # not a wait for anything to settle: it outlives the default --idle (2 s)
            await trio.sleep(2.5)
            assert consumer.returncode is None
            await client.publish("orders", b"late")
            await printed_until(4)
            assert printed == b"0\n1\n2\nlate\n"
            consumer.send_signal(signal.SIGINT)
            with trio.fail_after(10):
                await consumer.wait()
            assert consumer.returncode == 130
        finally:
            await reap(consumer)


async def test_a_wrong_token_at_an_mq_command_says_what_unauthorized_means(
        tmp_path: pathlib.Path) -> None:
    async with a_server_and_a_client(tmp_path, 1) as (_, where):
        done = await trio.run_process(
            [*RDVPUMP, "mq", "topics", "--server", where, "--universe", "q"],
            capture_stdout=True, capture_stderr=True, check=False,
            env={**os.environ, "RDVPUMP_TOKEN": "wrong"})
        assert done.returncode == 1
        assert done.stderr.decode() == (
            f"error: {where}: unauthorized (the token or the universe name is not the "
            "server's: --token or $RDVPUMP_TOKEN, and --universe)\n")


async def test_mq_consume_exits_only_once_its_acks_have_left(tmp_path: pathlib.Path) -> None:
    """``rdvpump mq consume --count N`` acknowledges what it printed and ends once those
    acks have left the process: the group owes nothing afterwards, so nothing it printed
    is delivered again."""
    async with a_server_and_a_client(tmp_path, 300) as (client, where):
        done = await trio.run_process(
            [*RDVPUMP, "mq", "consume", "orders", "--server", where,
             "--universe", "q", "--count", "300", "--window", "1000", "--json"],
            capture_stdout=True, capture_stderr=True, check=False,
            env={**os.environ, "RDVPUMP_TOKEN": TOKEN})
        assert done.returncode == 0, done.stderr.decode()
        assert [json.loads(line)["offset"] for line in done.stdout.splitlines()] == list(
            range(300))
        with trio.fail_after(10):
            while True:  # until the server has seen that consumer's link end (after its acks)
                group = (await client.query("orders"))["orders"]["groups"]["orders"]
                if group["consumers"] == 0:
                    break
                await trio.sleep(0.01)
        assert (group["lag"], group["inFlight"]) == (0, 0)


async def test_flipped_bytes_in_sealed_and_active_segments_are_skipped_for_every_window(
        tmp_path: pathlib.Path) -> None:
    """A real server process stores 425 messages in small segments and is killed; one
    byte is flipped in a sealed segment and one in the active one; ``mq verify`` names
    both and exits 1; the restarted server reports them, and groups consuming with
    windows 1, 100, 256 and 10,000 each get every intact message, in order."""
    universe = BrokerManager("q", token=TOKEN, pump=Pump(name="test"))
    args = [*server_args(("127.0.0.1", 0), tmp_path), "--segment-mb", "0.01"]
    async with spawn("manager", "serve", "--universe", "q", "--listen", "127.0.0.1:0") as (
            _, manager), trio.open_nursery() as nursery:
        await nursery.start(universe.pump.serve)
        await nursery.start(universe.serve_network, "127.0.0.1", 0)
        args[args.index("--manager") + 1] = f"{manager[0]}:{manager[1]}"
        async with spawn(*args) as (server, address):
            universe.directory["s1"] = address
            client = MqClient(universe.add_broker("producer"), "s1:15555", timeout=5)
            await client.connected()
            await client.declare("orders")
            for start in range(0, 425, 25):  # 100 to a segment: 4 sealed, 25 in the last
                await client.publish_many("orders", [b"m%03d" % i + b"." * 90
                                                     for i in range(start, start + 25)])
            client.close()
            server.kill()
            await server.wait()
        segments = sorted((tmp_path / "s1" / "orders" / "segments").glob("*.seg"))
        assert len(segments) >= 4
        for path in (segments[1], segments[-1]):  # a sealed segment and the active one
            data = bytearray(path.read_bytes())
            data[len(data) // 2] ^= 0xFF
            path.write_bytes(bytes(data))
        verified = subprocess.run([*RDVPUMP, "mq", "verify", str(tmp_path), "--json"],
                                  capture_output=True, timeout=60)
        assert verified.returncode == 1, verified.stderr
        damaged = [f for f in json.loads(verified.stdout)["findings"] if f["damage"]]
        assert sorted(f["file"] for f in damaged) == [str(segments[1]), str(segments[-1])]
        async with spawn(*args) as (_, address):
            universe.directory["s1"] = address
            client = MqClient(universe.add_broker("consumer"), "s1:15555", timeout=10)
            await client.connected()
            topic = (await client.query("orders"))["orders"]
            hidden = {o for c in topic["corrupt"] for o in range(c["offsets"][0],
                                                                   c["offsets"][1] + 1)}
            assert len(topic["corrupt"]) == 2 and 2 <= len(hidden) <= 4, topic["corrupt"]
            intact = [b"m%03d" % i + b"." * 90 for i in range(425) if i not in hidden]
            for window in (1, 100, 256, 10_000):
                group = f"w{window}"
                await client.declare("orders", group=group, start="beginning")
                sub = await client.subscribe("orders", group=group, window=window)
                got: list[bytes] = []
                with trio.fail_after(30):
                    while len(got) < len(intact):
                        batch = await sub.receive_many()
                        got += [m.body for m in batch]
                        await sub.ack([m.offset for m in batch])
                assert got == intact, (window, len(got))
            groups = (await client.query("orders"))["orders"]["groups"]
            assert all(groups[f"w{w}"]["lag"] == 0 for w in (1, 100, 256, 10_000))
            client.close()
        nursery.cancel_scope.cancel()


def sync_member(universe: str, name: str, member_id: int, manager: tuple[str, int],
                data: pathlib.Path) -> list[str]:
    """``broker run`` arguments of member ``member_id`` of a ``sync`` group ``a``."""
    return ["broker", "run", "--id", name, "--universe", universe, "--manager",
            f"{manager[0]}:{manager[1]}", "--role", "server", "--mq-dir", str(data),
            "--group", "a", "--group-id", str(member_id), "--replication", "sync"]


async def test_a_sync_group_fails_over_and_loses_no_acknowledged_message(
        tmp_path: pathlib.Path) -> None:
    """A group of three server processes, ``--replication sync``: a publish the master
    acknowledged is on a slave too.  SIGKILL the master mid-stream: the name service
    promotes the in-sync slave holding the most records, at the next epoch, and
    publishes go on there; the old master, restarted on its directory, comes back as a
    slave of the new one and in sync (a tail it wrote past the new epoch's start, if
    any, cut); ``rdvpump mq failover`` then moves the master by hand to the
    other slave in sync.  Every acknowledged message is consumed, and no epoch has two
    masters: the history checker reads the whole run."""
    from brokermgr import NameClient
    from mq import History
    from mq._history import Published

    def member(name: str, member_id: int, manager: tuple[str, int]) -> list[str]:
        return [*sync_member("q", name, member_id, manager, tmp_path / "data"),
                "--durability", "sync"]

    universe = BrokerManager("q", token=TOKEN, pump=Pump(name="test"))
    history = History()

    def acknowledged() -> int:
        return sum(isinstance(op, Published) and op.status == "ok" for op in history)

    async def publish_until(client: MqClient, epoch: int, stop: int) -> None:
        """Publish batches of 5, each recorded with its answer, until ``stop`` are
        acknowledged in all, or the server is gone."""
        while acknowledged() < stop:
            first = client.sequence + 1
            try:
                stored = await client.publish_many("orders", [b"m%d" % (first + i)
                                                              for i in range(5)])
            except ServiceError as exc:
                for i in range(5):
                    history.publish("orders", client.producer, first + i, "unknown")
                if exc.status == 0:
                    return  # no answer: the master was killed
                assert exc.status == 503, exc  # not confirmed, or no replica in sync yet
                await trio.sleep(0.05)  # polled, bounded by the test's deadline
                continue
            server = client.server.broker_id
            for i, s in enumerate(stored):
                history.publish("orders", client.producer, first + i, partition="a",
                                offset=s.offset, server=server, epoch=epoch)

    async def drain(client: MqClient) -> None:
        """Consume from ``client``'s server until every acknowledged message came."""
        want = {(op.producer, op.sequence) for op in history
                if isinstance(op, Published) and op.status == "ok"}
        subscription = await client.subscribe("orders", window=500)
        seen: set[tuple[str, int]] = set()
        while not want <= seen:
            messages = await subscription.receive_many()
            for m in messages:
                history.consume("orders", m.group, m.producer, m.sequence, partition="a",
                                offset=m.offset)
                seen.add((m.producer, m.sequence))
            await subscription.ack([m.offset for m in messages])

    async def group_where(check: Any) -> dict[str, Any]:
        while not check(group := await names.group("a")):
            await trio.sleep(0.05)  # the members' next heartbeats: polled, bounded
        return group

    async with spawn("manager", "serve", "--universe", "q", "--listen", "127.0.0.1:0") as (
            _, manager), trio.open_nursery() as nursery:
        await nursery.start(universe.pump.serve)
        await nursery.start(universe.serve_network, "127.0.0.1", 0)
        names = NameClient(universe, [Address(*manager)])
        names.start()
        with trio.fail_after(120):
            async with spawn(*member("s1", 0, manager)) as (s1, _), \
                    spawn(*member("s2", 1, manager)), spawn(*member("s3", 2, manager)):
                producer = MqClient(universe.add_broker("producer"), "s1:15555", timeout=5)
                await producer.declare("orders")
                await publish_until(producer, 1, 200)
                # the name service learns the in-sync set from the master's heartbeats
                await group_where(lambda g: g["insync"] == ["s2", "s3"])
                async with trio.open_nursery() as stream:  # killed mid-stream
                    stream.start_soon(publish_until, producer, 1, 10**9)  # until no answer
                    while acknowledged() < 300:
                        await trio.sleep(0.01)  # polled, bounded by the deadline
                    s1.send_signal(signal.SIGKILL)
                producer.close()
                group = await group_where(lambda g: g["master"] not in (None, "s1"))
                assert group["epoch"] == 2 and group["master"] in ("s2", "s3")
                after = MqClient(universe.add_broker("after"), f"{group['master']}:15555",
                                 timeout=5, producer="after")
                await publish_until(after, 2, acknowledged() + 100)
                # the old master comes back on its directory: a slave of the new one
                async with spawn(*member("s1", 0, manager)):
                    back = await group_where(lambda g: any(
                        m["broker"] == "s1" for m in g["members"]))
                    (s1_now,) = [m for m in back["members"] if m["broker"] == "s1"]
                    assert (s1_now["role"], back["master"]) == ("slave", group["master"])
                    # and copies it, cutting what it wrote past the new epoch's start
                    await group_where(lambda g: "s1" in g["insync"])
                    await publish_until(after, 2, acknowledged() + 50)
                    # by hand: the other slave in sync becomes master at epoch 3
                    other = ({"s2", "s3"} - {group["master"]}).pop()
                    await group_where(lambda g: other in g["insync"])
                    switched = await trio.run_process(
                        [*RDVPUMP, "mq", "failover", "a", "--to", other, "--universe", "q",
                         "--manager", f"{manager[0]}:{manager[1]}"], capture_stdout=True,
                        capture_stderr=True, env={**os.environ, "RDVPUMP_TOKEN": TOKEN},
                        check=False)
                    assert switched.returncode == 0, switched.stderr
                    assert switched.stdout.decode().strip() == (
                        f"group a: {other} is master at epoch 3")
                    after.close()
                    last = MqClient(universe.add_broker("last"), f"{other}:15555",
                                    timeout=5, producer="last")
                    await publish_until(last, 3, acknowledged() + 50)
                    await drain(last)
                    last.close()
        names.close()
        nursery.cancel_scope.cancel()
    report = history.check({"orders": ["orders"]})
    assert report.ok, report.findings[:5]
    assert report.counts["acknowledged"] >= 500


async def test_a_hung_master_is_replaced_once_the_name_service_expires_it(
        tmp_path: pathlib.Path) -> None:
    """SIGSTOP of a sync group's master: its links stay open and it answers nothing.  With
    every setting at its default, the name service drops it five of its 0.1 s beats after
    the last one (its slaves witnessing its silence) and promotes a slave, which takes
    over though its link to the hung master is still open (the master has said nothing
    to it for its silence, 0.4 s): a publish is acknowledged there within seconds, and
    no acknowledged message is lost."""
    from brokermgr import NameClient

    def member(name: str, member_id: int, manager: tuple[str, int]) -> list[str]:
        return sync_member("h", name, member_id, manager, tmp_path / "data")

    universe = BrokerManager("h", token=TOKEN, pump=Pump(name="test"))
    async with spawn("manager", "serve", "--universe", "h", "--listen", "127.0.0.1:0"
                     ) as (_, manager), \
            trio.open_nursery() as nursery:
        await nursery.start(universe.pump.serve)
        await nursery.start(universe.serve_network, "127.0.0.1", 0)
        names = NameClient(universe, [Address(*manager)])
        names.start()
        with trio.fail_after(90):
            async with spawn(*member("s1", 0, manager)) as (s1, _), \
                    spawn(*member("s2", 1, manager)), spawn(*member("s3", 2, manager)):
                client = MqClient(universe.add_broker("producer"), "s1:15555", timeout=5)
                await client.declare("orders")
                acked: list[Any] = []
                while len(acked) < 20:
                    try:
                        acked.append(await client.publish("orders", b"m%d" % len(acked)))
                    except ServiceError as exc:  # no replica in sync yet
                        assert exc.status == 503, exc
                        await trio.sleep(0.05)  # polled, bounded by the deadline
                client.close()
                while (await names.group("a"))["insync"] != ["s2", "s3"]:
                    await trio.sleep(0.05)  # the master's next registration: polled
                s1.send_signal(signal.SIGSTOP)
                stopped = trio.current_time()
                try:
                    while (group := await names.group("a"))["master"] in (None, "s1"):
                        await trio.sleep(0.05)  # the expiry: polled, bounded
                    after = MqClient(universe.add_broker("after"), f"{group['master']}:15555",
                                     timeout=5, producer="after")
                    while True:
                        try:
                            stored = await after.publish("orders", b"after the hang")
                            break
                        except ServiceError as exc:  # taking over, the other copying it
                            assert exc.status in (0, 503), exc
                            await trio.sleep(0.05)  # polled, bounded by the deadline
                    took = trio.current_time() - stopped
                    assert stored.offset == 20 and took < 5, took
                    subscription = await after.subscribe("orders", window=100)
                    got: list[bytes] = []
                    while len(got) < 21:
                        got += [m.body for m in await subscription.receive_many()]
                    assert got == [b"m%d" % i for i in range(20)] + [b"after the hang"]
                    after.close()
                finally:
                    s1.send_signal(signal.SIGCONT)
        names.close()
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("fault", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "hung"])
async def test_routed_clients_follow_a_sync_group_s_failover_by_themselves(
        tmp_path: pathlib.Path, fault: signal.Signals) -> None:
    """A tracker and a ``sync`` group of three server processes; an ``mq.Producer`` and
    an ``mq.Consumer`` follow the tracker's route table, as an application would, and the
    test does nothing for them.  SIGKILL the master mid-stream (or SIGSTOP it: hung, its
    links open, still listed by the tracker beside its successor until its reports
    expire), then restart it on its
    directory: publishes go on at the member promoted (a publish in flight is tried
    again there with its numbers, at once: no publish waits for the producer's default
    timeout of 10 s), the consumer moves to it, and every acknowledged message is
    consumed; the history checker finds nothing."""
    from brokermgr.tracking import RouteClient
    from mq import Consumer, History, Producer

    quick = ["--report-interval", "0.5", "--track-expiry", "3", "--track-scan", "0.5"]

    def member(name: str, member_id: int, manager: tuple[str, int]) -> list[str]:
        return [*sync_member("f", name, member_id, manager, tmp_path / "data"),
                "--durability", "sync", "--tracker", "t1:15555", *quick]

    universe = BrokerManager("f", token=TOKEN, pump=Pump(name="test"))
    history = History()
    acked: set[int] = set()
    seen: set[int] = set()
    async with spawn("manager", "serve", "--universe", "f", "--listen", "127.0.0.1:0") as (
            _, manager), \
            spawn("broker", "run", "--id", "t1", "--universe", "f", "--manager",
                  f"{manager[0]}:{manager[1]}", "--role", "tracker", *quick) as (_, t1), \
            trio.open_nursery() as nursery:
        await nursery.start(universe.pump.serve)
        await nursery.start(universe.serve_network, "127.0.0.1", 0)
        universe.directory["t1"] = Address(*t1)
        with trio.fail_after(120):
            async with spawn(*member("s1", 0, manager)) as (s1, a1), \
                    spawn(*member("s2", 1, manager)) as (_, a2), \
                    spawn(*member("s3", 2, manager)) as (_, a3):
                universe.directory.update({"s1": Address(*a1), "s2": Address(*a2),
                                           "s3": Address(*a3)})
                await declare_at_master(universe, "s1", "orders")
                routes = RouteClient(universe.add_broker("app"), retry=0.2)
                routes.add_tracker("t1:15555")
                while len(routes.routes.servers_of("orders")) < 3:
                    await routes.changed()
                producer = Producer(routes, "orders")  # every setting its default
                longest = 0.0
                consumer = Consumer(routes, "orders", window=200)
                await nursery.start(consumer.run)

                async def consume() -> None:
                    async for message in consumer:
                        where = message.subscription.client.server.address
                        history.consume("orders", message.group, message.producer,
                                        message.sequence, partition="a",
                                        offset=message.offset, consumer=where)
                        seen.add(message.sequence)
                        await message.ack()

                async def publish(count: int) -> None:
                    nonlocal longest
                    for _ in range(count):
                        began = trio.current_time()
                        stored = await producer.publish(b"%06d" % (producer.sequence + 1))
                        longest = max(longest, trio.current_time() - began)
                        acked.add(producer.sequence)
                        history.publish("orders", producer.producer, producer.sequence,
                                        partition="a", offset=stored.offset,
                                        server=stored.server)

                nursery.start_soon(consume)
                await publish(100)
                async with trio.open_nursery() as stream:
                    stream.start_soon(publish, 200)  # the kill lands in this stream
                    while len(acked) < 150:
                        await trio.sleep(0.01)  # polled, bounded by the deadline
                    s1.send_signal(fault)
                assert producer.retried >= 1  # a publish went unanswered and was retried
                s1.send_signal(signal.SIGKILL)  # (a hung one too, now)
                # the publishes at the kill moved with the route table, not the timeout's end
                assert longest < producer.timeout / 2, longest
                async with spawn(*member("s1", 0, manager)) as (_, back):
                    universe.directory["s1"] = Address(*back)
                    await publish(50)  # at the promoted member, s1 back as its slave
                    while not acked <= seen:
                        await trio.sleep(0.05)  # the consumer's deliveries: polled
                    masters = {stored.server for stored in
                               [await producer.publish(b"last")]}
                    assert masters & {"s2:15555", "s3:15555"}
                producer.close()
                consumer.close()
                routes.close()
        nursery.cancel_scope.cancel()
    report = history.check({"orders": ["orders"]}, idempotent=True)
    assert report.ok, [str(f) for f in report.findings[:5]]
    assert report.counts["acknowledged"] == 350


async def test_mq_consume_gives_binary_bodies_exactly(tmp_path: pathlib.Path) -> None:
    """Bodies that are not text come back byte for byte: one file each with ``--out``,
    base64 in ``--json``; text bodies stay text in JSON.  (Its groups declared with
    ``mq declare``, which says a new group is declared and an old one unchanged.)"""
    bodies = [os.urandom(1 << 20), bytes(range(256)) * 3, "naïve\n".encode()]
    async with a_server_and_a_client(tmp_path / "store", 0) as (client, where):
        group = ["--server", where, "--universe", "q", "--count", "3"]
        env = {**os.environ, "RDVPUMP_TOKEN": TOKEN}
        for name, said in (("files", "declared group files of orders"),
                           ("json", "declared group json of orders"),
                           ("json", "orders, group json: declared already, unchanged")):
            declared = await trio.run_process(
                [*RDVPUMP, "mq", "declare", "orders", "--group", name, *group[:4]],
                capture_stdout=True, capture_stderr=True, check=False, env=env)
            assert declared.stdout.decode().strip() == said, declared.stderr.decode()
        await client.publish_many("orders", bodies)
        out = tmp_path / "got"
        files = await trio.run_process(
            [*RDVPUMP, "mq", "consume", "orders", *group, "--group", "files", "--out",
             str(out)], capture_stdout=True, capture_stderr=True, check=False, env=env)
        assert files.returncode == 0, files.stderr.decode()
        written = [pathlib.Path(p) for p in files.stdout.decode().splitlines()]
        assert [p.read_bytes() for p in written] == bodies
        assert sorted(out.iterdir()) == written
        as_json = await trio.run_process(
            [*RDVPUMP, "mq", "consume", "orders", *group, "--group", "json", "--json"],
            capture_stdout=True, capture_stderr=True, check=False, env=env)
        assert as_json.returncode == 0, as_json.stderr.decode()
        rows = [json.loads(line) for line in as_json.stdout.splitlines()]
        import base64
        assert [base64.b64decode(r["body_base64"]) for r in rows[:2]] == bodies[:2]
        assert rows[2]["body"] == "naïve\n" and "body_base64" not in rows[2]
        # the tables keep names and figures whole in an 80-column terminal
        for command in (["topics"], ["groups", "orders"]):
            shown = await trio.run_process(
                [*RDVPUMP, "mq", *command, *group[:4]], capture_stdout=True,
                capture_stderr=True, check=False, env={**env, "COLUMNS": "80"})
            assert shown.returncode == 0, shown.stderr.decode()
            lines = shown.stdout.decode().splitlines()
            assert max(map(len, lines)) <= 80, lines
            cells = [[c.strip() for c in line.split("│")] for line in lines if "│" in line]
            at = 4 if command == ["topics"] else 1  # the group's cell: topic, stored, depth
            assert {"files", "json", "orders"} <= {c[at] for c in cells}, lines


async def test_mq_consume_into_a_reader_that_stops_ends_quietly(tmp_path: pathlib.Path
                                                                 ) -> None:
    """``mq consume | head -1``: the command ends without a word when the pipe closes;
    what it printed is acknowledged, what it could not is delivered again."""
    async with a_server_and_a_client(tmp_path, 10) as (client, where):
        read, write = os.pipe()
        consumer = await trio.lowlevel.open_process(
            [*RDVPUMP, "mq", "consume", "orders", "--server", where, "--universe", "q",
             "--window", "10", "--idle", "30"], stdout=write, stderr=subprocess.PIPE,
            env={**os.environ, "RDVPUMP_TOKEN": TOKEN})
        os.close(write)
        try:
            with trio.fail_after(30):
                first = await trio.to_thread.run_sync(os.read, read, 2)
            assert first == b"0\n"  # it prints: it consumes
            os.close(read)  # the reader goes, as head does after its line
            await client.publish_many("orders", [b"late %d" % i for i in range(100)])
            with trio.fail_after(30):
                await consumer.wait()
            assert consumer.stderr is not None
            errors = b""
            while chunk := await consumer.stderr.receive_some(65536):
                errors += chunk
            assert consumer.returncode == 0 and errors == b"", errors.decode()
        finally:
            await reap(consumer)
        with trio.fail_after(10):
            while True:  # the consumer's link has ended at the server
                group = (await client.query("orders"))["orders"]["groups"]["orders"]
                if group["consumers"] == 0:
                    break
                await trio.sleep(0.01)
        # the message the pipe did not take, and those after it, are the group's still
        # (the line read may have been the only one written before the pipe closed)
        rest = await client.subscribe("orders", window=1000)
        got: list[Any] = []
        with trio.fail_after(30):
            while not got or got[-1].body != b"late 99":
                got += await rest.receive_many(1000)
        assert got[0].offset > 0  # the one it printed was acknowledged
        assert [m.body for m in got if m.body.startswith(b"late ")] == [
            b"late %d" % i for i in range(100)]


async def test_mq_consume_whose_server_dies_says_so_in_one_line_and_fails(
        tmp_path: pathlib.Path) -> None:
    """``mq consume --idle 0`` (no end of its own) from a server that is SIGKILLed: it
    ends at once with one line saying the link was lost and how many messages it had
    consumed and acknowledged, and exits 1, rather than waiting on, or ending as if
    nothing happened."""
    async with spawn("manager", "serve", "--universe", "q", "--listen", "127.0.0.1:0") as (
            _, manager), spawn(*server_args(manager, tmp_path)) as (server, address):
        where = f"s1@{address[0]}:{address[1]}"
        env = {**os.environ, "RDVPUMP_TOKEN": TOKEN}
        published = await trio.run_process(
            [*RDVPUMP, "mq", "publish", "orders", "--server", where, "--universe", "q"],
            stdin=b"a\nb\nc\n", capture_stdout=True, env=env)
        assert published.stdout.startswith(b"published 3"), published
        consumer = await trio.lowlevel.open_process(
            [*RDVPUMP, "mq", "consume", "orders", "--server", where, "--universe", "q",
             "--idle", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        try:
            assert consumer.stdout is not None and consumer.stderr is not None
            shown = b""
            with trio.fail_after(30):
                while shown.count(b"\n") < 3:
                    shown += await consumer.stdout.receive_some(4096)
            assert shown.split() == [b"a", b"b", b"c"]
            server.send_signal(signal.SIGKILL)
            said = b""
            with trio.fail_after(30):
                while chunk := await consumer.stderr.receive_some(4096):
                    said += chunk
                await consumer.wait()
            assert consumer.returncode == 1
            (line,) = said.decode().strip().splitlines()
            assert line.startswith("error: ") and "the link to the server was lost" in line \
                and "after 3 messages consumed and acknowledged" in line, line
        finally:
            await reap(consumer)


async def test_mq_publish_and_consume_follow_a_group_s_master_through_a_failover(
        tmp_path: pathlib.Path) -> None:
    """``mq publish`` and ``mq consume`` given a manager and a group (``--manager``,
    ``--master-of``) find its master; SIGKILL it mid-stream: each says on one line that
    it follows the member promoted, and goes on; every line published is consumed, none
    stored twice, and the publisher's last batch is acknowledged by the new master."""
    def member(name: str, member_id: int, manager: tuple[str, int]) -> list[str]:
        return sync_member("g", name, member_id, manager, tmp_path / "data")

    universe = BrokerManager("g", token=TOKEN, pump=Pump(name="test"))
    env = {**os.environ, "RDVPUMP_TOKEN": TOKEN}
    async with spawn("manager", "serve", "--universe", "g", "--listen", "127.0.0.1:0") as (
            _, manager), trio.open_nursery() as nursery:
        await nursery.start(universe.pump.serve)
        await nursery.start(universe.serve_network, "127.0.0.1", 0)
        where = f"{manager[0]}:{manager[1]}"
        follow = ["orders", "--manager", where, "--master-of", "a", "--universe", "g"]
        with trio.fail_after(120):
            async with spawn(*member("s1", 0, manager)) as (s1, a1), \
                    spawn(*member("s2", 1, manager)) as (_, a2), \
                    spawn(*member("s3", 2, manager)):
                universe.directory["s1"] = Address(*a1)
                await declare_at_master(universe, "s1", "orders")
                # a slave's refusal names its master, and where it is
                at_slave = await trio.run_process(
                    [*RDVPUMP, "mq", "publish", "orders", "--server",
                     f"s2@{a2[0]}:{a2[1]}", "--universe", "g"], stdin=b"x\n",
                    capture_stdout=True, capture_stderr=True, env=env, check=False)
                assert at_slave.returncode == 1
                assert (f"s2:15555 is a slave of group a: publish at its master, s1:15555 "
                        f"(at {a1[0]}:") in at_slave.stderr.decode(), at_slave.stderr
                publisher = await trio.lowlevel.open_process(
                    [*RDVPUMP, "mq", "publish", *follow], stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
                consumer = await trio.lowlevel.open_process(
                    [*RDVPUMP, "mq", "consume", *follow, "--idle", "5"],
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
                try:
                    assert publisher.stdin is not None and consumer.stdout is not None
                    shown = b""
                    for i in range(50):
                        await publisher.stdin.send_all(b"m%d\n" % i)
                    while shown.count(b"\n") < 50:
                        shown += await consumer.stdout.receive_some(65536)
                    s1.send_signal(signal.SIGKILL)
                    for i in range(50, 100):
                        await publisher.stdin.send_all(b"m%d\n" % i)
                        await trio.sleep(0.01)  # a stream across the failover
                    await publisher.stdin.aclose()
                    published = await _all_of(publisher)
                    while chunk := await consumer.stdout.receive_some(65536):
                        shown += chunk
                    consumed = await _all_of(consumer)
                finally:
                    await reap(publisher)
                    await reap(consumer)
        nursery.cancel_scope.cancel()
    out, said = published
    assert publisher.returncode == 0, said
    assert out.startswith(b"published 100 to orders on s"), out
    assert b"s1" not in out.split(b" on ")[1]
    (line,) = said.decode().strip().splitlines()
    assert line.startswith("group a: master s1 lost (") and "; following s" in line, line
    _, said = consumed
    assert consumer.returncode == 0
    assert any(x.startswith("group a: master s1 lost (") for x in said.decode().splitlines())
    got = shown.decode().split()
    assert set(got) == {f"m{i}" for i in range(100)}, sorted(set(got))


async def declare_at_master(universe: BrokerManager, master: str, topic: str) -> None:
    """Declare ``topic`` at the group's master ``master`` once it takes writes (a 503
    before it is confirmed: asked again, bounded by the caller's deadline)."""
    admin = MqClient(universe.add_broker("admin"), f"{master}:15555", timeout=5)
    try:
        while True:
            try:
                await admin.declare(topic)
                return
            except ServiceError as exc:
                assert exc.status == 503, exc
                await trio.sleep(0.05)  # polled, bounded by the deadline
    finally:
        admin.close()


async def _all_of(proc: trio.Process) -> tuple[bytes, bytes]:
    """What ``proc`` writes on stdout and stderr until it ends (bounded), once it ended."""
    out, err = b"", b""
    assert proc.stdout is not None and proc.stderr is not None
    with trio.fail_after(60):
        while chunk := await proc.stdout.receive_some(65536):
            out += chunk
        while chunk := await proc.stderr.receive_some(65536):
            err += chunk
        await proc.wait()
    return out, err


async def test_a_master_killed_right_after_its_promotion_is_followed_by_the_last_in_sync(
        tmp_path: pathlib.Path) -> None:
    """A ``sync`` group of three: SIGKILL the master, and as soon as the member promoted
    has registered as master, SIGKILL that one too, before any member is in sync with
    it: the third member, in sync with the first master, is promoted next (not nobody,
    waiting for the dead member to come back); once the first is back as its slave it
    acknowledges a publish, and every message acknowledged before is there."""
    from brokermgr import NameClient

    universe = BrokerManager("h", token=TOKEN, pump=Pump(name="test"))
    async with spawn("manager", "serve", "--universe", "h", "--listen", "127.0.0.1:0") as (
            _, manager), trio.open_nursery() as nursery:
        await nursery.start(universe.pump.serve)
        await nursery.start(universe.serve_network, "127.0.0.1", 0)
        names = NameClient(universe, [Address(*manager)])
        names.start()
        with trio.fail_after(120):
            procs = {}
            async with spawn(*sync_member("h", "s1", 0, manager, tmp_path)) as (p1, _), \
                    spawn(*sync_member("h", "s2", 1, manager, tmp_path)) as (p2, _), \
                    spawn(*sync_member("h", "s3", 2, manager, tmp_path)) as (p3, _):
                procs = {"s1": p1, "s2": p2, "s3": p3}
                await declare_at_master(universe, "s1", "orders")
                while len((await names.group("a")).get("insync") or []) < 2:
                    await trio.sleep(0.02)  # both slaves in sync: polled, bounded
                client = MqClient(universe.add_broker("c1"), "s1:15555", timeout=5)
                await client.publish_many("orders", [b"m%d" % i for i in range(20)])
                client.close()
                procs["s1"].send_signal(signal.SIGKILL)
                while (promoted := (await names.group("a")).get("master")) in (None, "s1"):
                    await trio.sleep(0.005)  # the first promotion: polled, bounded

                async def registered_as_master() -> bool:
                    return any(b["id"] == promoted and (b.get("group") or {}).get("role")
                               == "master" for b in await names.list() or [])

                while not await registered_as_master():
                    await trio.sleep(0.005)  # its own registration, as master: polled
                procs[promoted].send_signal(signal.SIGKILL)
                last = ({"s2", "s3"} - {promoted}).pop()
                while (await names.group("a")).get("master") != last:
                    await trio.sleep(0.02)  # the second promotion: polled, bounded
                # it needs a member in sync to acknowledge (--min-insync 1): the first
                # master, back on its directory, copies it as its slave
                async with spawn(*sync_member("h", "s1", 0, manager, tmp_path)):
                    after = MqClient(universe.add_broker("c2"), f"{last}:15555", timeout=5)
                    while True:
                        try:
                            await after.publish("orders", b"after")
                            break
                        except ServiceError as exc:
                            assert exc.status in (0, 503), exc
                            await trio.sleep(0.05)  # s1 in sync: polled, bounded
                    subscription = await after.subscribe("orders")
                    got: list[bytes] = []
                    while len(got) < 21:
                        got += [m.body for m in await subscription.receive_many()]
                    assert got == [b"m%d" % i for i in range(20)] + [b"after"]
                    assert (await names.group("a")).get("master") == last
                    after.close()
        names.close()
        nursery.cancel_scope.cancel()
