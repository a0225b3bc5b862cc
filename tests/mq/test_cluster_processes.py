"""A cluster of server processes: each links to every other, and says so on stderr; a
server that reads another cluster file, one that lists it, is refused, and both sides
say why."""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from tests.rdvpump.procs import reap
from tests.rdvpump.test_processes import RDVPUMP, TOKEN, spawn

pytestmark = pytest.mark.slow


class Lines:
    """A process's stderr, read line by line as it comes (and its stdout's ready line)."""

    def __init__(self, proc: trio.Process) -> None:
        self.proc = proc
        self.seen: list[str] = []
        self._buffer = b""

    async def address(self) -> str:
        """HOST:PORT from the process's ``ready brokers HOST:PORT`` line."""
        assert self.proc.stdout is not None
        line = b""
        with trio.fail_after(30):
            while not line.endswith(b"\n"):
                chunk = await self.proc.stdout.receive_some(1)
                assert chunk, f"exited before it was ready; stderr: {self.seen}"
                line += chunk
        return line.decode().split()[-1]

    async def drain(self) -> None:
        """Take in what the process wrote so far (what a pipe holds comes at once; a
        moment's wait at most for the rest)."""
        assert self.proc.stderr is not None
        with trio.move_on_after(0.5):
            while chunk := await self.proc.stderr.receive_some(4096):
                self._buffer += chunk
                *lines, self._buffer = self._buffer.split(b"\n")
                self.seen += [line.decode() for line in lines]

    async def until(self, *needles: str, after: int = 0) -> str:
        """The first line (from line ``after`` on) that holds every needle, waiting for
        more (bounded)."""
        assert self.proc.stderr is not None
        with trio.move_on_after(30):
            while True:
                found = next((x for x in self.seen[after:] if all(n in x for n in needles)),
                             None)
                if found is not None:
                    return found
                chunk = await self.proc.stderr.receive_some(4096)
                assert chunk, f"exited; stderr: {self.seen}"
                self._buffer += chunk
                *lines, self._buffer = self._buffer.split(b"\n")
                self.seen += [line.decode() for line in lines]
        raise AssertionError(f"no line with {needles} in 30 s; stderr: {self.seen}")


@asynccontextmanager
async def server(*args: str) -> AsyncIterator[Lines]:
    proc = await trio.lowlevel.open_process(
        [*RDVPUMP, "broker", "run", *args], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, env={**os.environ, "RDVPUMP_TOKEN": TOKEN})
    try:
        yield Lines(proc)
    finally:
        await reap(proc)


def cluster_file(path: pathlib.Path, servers: list[tuple[str, str]]) -> str:
    path.write_text('[cluster]\nname = "shop"\n' + "".join(
        f'[[server]]\nid = "{i}"\naddress = "127.0.0.1:9999"\ntype = "{t}"\n'
        for i, t in servers))
    return str(path)


async def test_servers_of_one_file_link_up_and_another_file_is_refused(
        tmp_path: pathlib.Path) -> None:
    three = [("a", "primary"), ("b", "primary"), ("c", "fanout")]
    shop = cluster_file(tmp_path / "shop.toml", three)
    other = cluster_file(tmp_path / "other.toml", [*three, ("d", "backup")])
    async with spawn("manager", "serve", "--universe", "k", "--listen", "127.0.0.1:0") as (
            _, manager):
        common = ["--universe", "k", "--manager", f"{manager[0]}:{manager[1]}", "--listen",
                  "127.0.0.1:0", "--heartbeat", "0.5"]

        def member(name: str, file: str) -> list[str]:
            (tmp_path / name).mkdir()
            return ["--id", name, "--cluster", file, "--state-dir", str(tmp_path / name),
                    "--role", "server", "--mq-dir", str(tmp_path / name), *common]

        async with server(*member("a", shop)) as a, server(*member("b", shop)) as b, \
                server(*member("c", shop)) as c:
            for lines, me in ((a, "a (primary)"), (b, "b (primary)"), (c, "c (fanout)")):
                await lines.until(f"cluster shop: {me} linked to", "(2 of 2 peers); root a")
            assert not any("warning" in line for line in a.seen)
            # a shared topic declared on c through the CLI reaches every server
            where = {n: await lines.address() for n, lines in (("a", a), ("b", b), ("c", c))}
            declared = await trio.run_process(
                [*RDVPUMP, "mq", "declare", "orders", "--shared", "--server",
                 f"c@{where['c']}", "--universe", "k"], capture_stdout=True,
                env={**os.environ, "RDVPUMP_TOKEN": TOKEN})
            assert declared.stdout.decode().startswith("declared orders, group orders, "
                                                       "shared (cluster state v")
            for name in ("a", "b"):
                with trio.fail_after(30):
                    while True:
                        topics = await trio.run_process(
                            [*RDVPUMP, "mq", "topics", "--server", f"{name}@{where[name]}",
                             "--universe", "k", "--json"], capture_stdout=True,
                            env={**os.environ, "RDVPUMP_TOKEN": TOKEN})
                        if "orders" in json.loads(topics.stdout):
                            break
                        await trio.sleep(0.2)  # polled: the state's way to it, bounded
            # a publish through the fanout server says who stored it: the root, via c; on
            # c, the topic's queue figures are the root's, shown as such, not as zeros
            env = {**os.environ, "RDVPUMP_TOKEN": TOKEN, "COLUMNS": "200"}
            published = await trio.run_process(
                [*RDVPUMP, "mq", "publish", "orders", "--server", f"c@{where['c']}",
                 "--universe", "k"], stdin=b"1\n2\n3\n", capture_stdout=True, env=env)
            assert published.stdout.decode().strip() == (
                "published 3 to orders on a:15555 (the cluster's root) via c:15555, "
                "offsets 0..2")
            on_c = await trio.run_process(
                [*RDVPUMP, "mq", "topics", "--server", f"c@{where['c']}", "--universe", "k"],
                capture_stdout=True, env=env)
            (row,) = [line for line in on_c.stdout.decode().splitlines() if "orders" in line]
            assert [cell.strip() for cell in row.split("│")[2:6]] == ["-", "-", "orders", "-"]
            assert "-: held by the cluster's root" in on_c.stdout.decode()
            # rdvpump status shows each server's cluster, type, root, epoch, state version
            with trio.fail_after(30):
                while True:
                    shown = await trio.run_process(
                        [*RDVPUMP, "status", "--universe", "k", "--manager",
                         f"{manager[0]}:{manager[1]}"], capture_stdout=True,
                        env={**os.environ, "RDVPUMP_TOKEN": TOKEN, "COLUMNS": "200"})
                    text = shown.stdout.decode()
                    if all(re.search(rf"{b} .* shop {t}, root a@\d+, state v\d+", text)
                           for b, t in (("a", "primary"), ("b", "primary"),
                                        ("c", "fanout"))):
                        break
                    await trio.sleep(0.2)  # polled: the next registration, bounded
            async with server(*member("d", other)) as d:
                # d is not a server of a's list: each of a, b, c refuses it, and says so
                why = "'d' is not another server of cluster 'shop' (a, b, c)"
                for peer in ("a", "b", "c"):
                    await d.until(f"d: {peer} refused it: {why}")
                await a.until(f"a: refused d: {why}")
            # without a place to keep its epoch and vote, a server says what that risks
            async with server("--id", "b", "--cluster", shop, *common) as forgetful:
                await forgetful.until(
                    f"warning: {shop}: without --state-dir (or --mq-dir) this server's epoch "
                    f"and vote are not kept across restarts: one that restarts may vote "
                    f"twice in an epoch")


async def test_the_example_cluster_file_runs_as_its_comment_says(
        tmp_path: pathlib.Path) -> None:
    """``examples/clusters/shop.toml``: c1 becomes root; a shared topic declared and published
    on the fanout server c3 is stored by c1 and consumed back through c3."""
    example = str(pathlib.Path(__file__).resolve().parents[2] / "examples/clusters/shop.toml")
    env = {**os.environ, "RDVPUMP_TOKEN": TOKEN}
    async with spawn("manager", "serve", "--universe", "shop", "--listen",
                     "127.0.0.1:0") as (_, manager):
        def member(name: str) -> list[str]:
            return ["--universe", "shop", "--id", name, "--manager",
                    f"{manager[0]}:{manager[1]}", "--listen", "127.0.0.1:0", "--role",
                    "server", "--mq-dir", str(tmp_path), "--cluster", example]

        async with server(*member("c1")) as c1, server(*member("c2")) as c2, \
                server(*member("c3")) as c3:
            for lines, me in ((c1, "c1 (primary)"), (c2, "c2 (primary)"),
                              (c3, "c3 (fanout)")):
                await lines.until(f"cluster shop: {me} linked to", "(2 of 2 peers); root c1")
            at = f"c3@{await c3.address()}"
            mq = [*RDVPUMP, "mq"]
            common = ["--server", at, "--universe", "shop"]
            await trio.run_process([*mq, "declare", "orders", "--shared", *common], env=env)
            published = await trio.run_process([*mq, "publish", "orders", *common],
                                               stdin=b"a\nb\n", capture_stdout=True, env=env)
            assert b"on c1:15555 (the cluster's root) via c3:15555" in published.stdout
            consumed = await trio.run_process(
                [*mq, "consume", "orders", *common, "--count", "2"], capture_stdout=True,
                env=env)
            assert consumed.stdout == b"a\nb\n"


def test_a_broker_not_in_the_cluster_file_is_one_line(tmp_path: pathlib.Path) -> None:
    shop = cluster_file(tmp_path / "shop.toml", [("a", "primary")])
    proc = subprocess.run([*RDVPUMP, "broker", "run", "--id", "x", "--cluster", shop,
                           "--manager", "127.0.0.1:1"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr == (f"error: {shop}: broker 'x' is not a server of cluster 'shop' "
                           f"(a)\n")



async def test_the_root_process_sigkilled_is_replaced_and_comes_back_as_root(
        tmp_path: pathlib.Path) -> None:
    """Three primaries, a backup and two fanout servers, each a process keeping its
    ballot in a directory of its own: a is root; SIGKILL a, and b is root on every
    survivor within 5 s (the links' loss is seen at once); a started again on its
    directory is the most senior again and takes over at a newer epoch."""
    import signal

    servers = [("a", "primary"), ("b", "primary"), ("c", "primary"), ("d", "backup"),
               ("e", "fanout"), ("f", "fanout")]
    shop = cluster_file(tmp_path / "shop.toml", servers)
    async with spawn("manager", "serve", "--universe", "k", "--listen", "127.0.0.1:0") as (
            _, manager):
        def member(name: str) -> list[str]:
            (tmp_path / name).mkdir(exist_ok=True)
            return ["--id", name, "--cluster", shop, "--state-dir", str(tmp_path / name),
                    "--universe", "k", "--manager", f"{manager[0]}:{manager[1]}",
                    "--listen", "127.0.0.1:0", "--heartbeat", "0.5"]

        async with server(*member("a")) as a, server(*member("b")) as b, \
                server(*member("c")) as c, server(*member("d")) as d, \
                server(*member("e")) as e, server(*member("f")) as f:
            everyone = {"a": a, "b": b, "c": c, "d": d, "e": e, "f": f}
            for lines in everyone.values():
                await lines.until("(5 of 5 peers); root a at epoch")
            # the newest epoch any of them said (a root may be chosen again as ballots
            # meet: the epoch can move on after the first)
            epoch = max(int(m) for lines in everyone.values() for line in lines.seen
                        for m in re.findall(r"at epoch (\d+)", line))
            killed_at = trio.current_time()
            said = {n: len(lines.seen) for n, lines in everyone.items()}
            a.proc.send_signal(signal.SIGKILL)
            for name in "bcdef":
                with trio.fail_after(5):
                    line = await everyone[name].until("(4 of 5 peers); root b at epoch",
                                                      after=said[name])
                assert int(line.rsplit(" ", 1)[1]) > epoch
            assert trio.current_time() - killed_at < 5
            async with server(*member("a")) as back:
                line = await back.until("(5 of 5 peers); root a at epoch")
                assert int(line.rsplit(" ", 1)[1]) > epoch + 1


async def test_consumers_on_fanout_servers_keep_receiving_when_the_root_is_sigkilled(
        tmp_path: pathlib.Path) -> None:
    """Three primaries, a backup and two fanout servers, each an MQ server process: a
    shared topic published on the backup (a client there, retrying what was not
    answered with the same sequence) and consumed on the two fanout servers (one
    group, a consumer on each).  SIGKILL the root: b is root within 5 s (the links' loss is
    seen at once),
    both consumers keep receiving what is published after it, and once a is back (root
    again, the most senior), every acknowledged message was consumed."""
    import signal

    from mq import ServiceError
    from rdvpump.mqtool import connect

    servers = [("a", "primary"), ("b", "primary"), ("c", "primary"), ("d", "backup"),
               ("e", "fanout"), ("f", "fanout")]
    shop = cluster_file(tmp_path / "shop.toml", servers)
    acked: list[bytes] = []
    got: dict[str, list[bytes]] = {"e": [], "f": []}
    async with spawn("manager", "serve", "--universe", "k", "--listen", "127.0.0.1:0") as (
            _, manager):
        def member(name: str) -> list[str]:
            (tmp_path / name).mkdir(exist_ok=True)
            return ["--id", name, "--cluster", shop, "--state-dir", str(tmp_path / name),
                    "--role", "server", "--mq-dir", str(tmp_path / name), "--universe", "k",
                    "--manager", f"{manager[0]}:{manager[1]}", "--listen", "127.0.0.1:0",
                    "--heartbeat", "0.5"]

        async with server(*member("a")) as a, server(*member("b")) as b, \
                server(*member("c")) as c, server(*member("d")) as d, \
                server(*member("e")) as e, server(*member("f")) as f:
            everyone = {"a": a, "b": b, "c": c, "d": d, "e": e, "f": f}
            where = {n: await lines.address() for n, lines in everyone.items()}
            for lines in everyone.values():
                await lines.until("(5 of 5 peers); root a at epoch")
            async with connect("k", f"d@{where['d']}", token=TOKEN, timeout=30) as producer, \
                    connect("k", f"e@{where['e']}", token=TOKEN, timeout=30) as on_e, \
                    connect("k", f"f@{where['f']}", token=TOKEN, timeout=30) as on_f, \
                    trio.open_nursery() as nursery:
                await producer.declare("orders", shared=True)

                async def consume(client: Any, into: list[bytes]) -> None:
                    with trio.fail_after(30):
                        while True:  # the state's way to this server, bounded
                            try:
                                subscription = await client.subscribe("orders", window=4)
                                break
                            except ServiceError:
                                client.subscriptions.clear()
                                await trio.sleep(0.1)
                    async for message in subscription:
                        into.append(bytes(message.body))
                        await message.ack()

                nursery.start_soon(consume, on_e, got["e"])
                nursery.start_soon(consume, on_f, got["f"])

                async def publish(n: int) -> None:
                    body, sequence = b"%d" % n, producer.sequence
                    with trio.fail_after(30):
                        while True:
                            try:
                                await producer.publish("orders", body)
                                break
                            except ServiceError:  # not answered: again, same sequence
                                producer.sequence = sequence
                                await trio.sleep(0.1)
                    acked.append(body)

                published = trio.Event()

                async def publish_all() -> None:
                    for n in range(400):
                        await publish(n)
                    published.set()

                nursery.start_soon(publish_all)
                with trio.fail_after(30):
                    while len(acked) < 200:
                        await trio.sleep(0.01)  # polled: the producer's progress, bounded
                said = {n: len(lines.seen) for n, lines in everyone.items()}
                killed_at = trio.current_time()
                a.proc.send_signal(signal.SIGKILL)  # under load: publishing goes on
                before = len(acked)
                with trio.fail_after(5):  # the new root, on every survivor
                    for name in "bcdef":
                        await everyone[name].until("root b at epoch", after=said[name])
                print(f"root b on every survivor {trio.current_time() - killed_at:.3f} s "
                      f"after the SIGKILL")
                with trio.fail_after(60):
                    await published.wait()
                late = set(acked[before + 1:])
                with trio.fail_after(30):
                    while not late <= set(got["e"]) | set(got["f"]):
                        await trio.sleep(0.1)  # polled: the consumers' progress, bounded
                # both fanout servers' consumers received messages published after the kill
                assert late & set(got["e"]) and late & set(got["f"])
                async with server(*member("a")) as back:
                    await back.until("(5 of 5 peers); root a at epoch")
                    with trio.fail_after(60):
                        while not set(acked) <= set(got["e"]) | set(got["f"]):
                            await trio.sleep(0.1)  # polled, bounded
                nursery.cancel_scope.cancel()


async def test_a_hung_root_is_replaced_and_steps_down_when_it_wakes(
        tmp_path: pathlib.Path) -> None:
    """SIGSTOP of the root's process closes no link: its peers count it out once it has
    been silent for the silence timeout, the next primary is root, and a publish through
    another server is acknowledged by it; woken, the old root steps down, then takes over
    again at a newer epoch as the most senior primary (how soon, against b's beats, is a
    matter of the machine's timing: whether it was seen following b first is not
    asserted)."""
    shop = cluster_file(tmp_path / "shop.toml", [("a", "primary"), ("b", "primary"),
                                                 ("c", "primary")])
    async with spawn("manager", "serve", "--universe", "k", "--listen", "127.0.0.1:0") as (
            _, manager):
        common = ["--universe", "k", "--manager", f"{manager[0]}:{manager[1]}", "--listen",
                  "127.0.0.1:0"]

        def member(name: str) -> list[str]:
            (tmp_path / name).mkdir()
            return ["--id", name, "--cluster", shop, "--state-dir", str(tmp_path / name),
                    "--role", "server", "--mq-dir", str(tmp_path / name), *common]

        async with server(*member("a")) as a, server(*member("b")) as b, \
                server(*member("c")) as c:
            for lines in (a, b, c):
                await lines.until("(2 of 2 peers); root a")
            where = {n: await lines.address() for n, lines in (("a", a), ("b", b), ("c", c))}
            env = {**os.environ, "RDVPUMP_TOKEN": TOKEN}

            async def publish(via: str) -> str:
                done = await trio.run_process(
                    [*RDVPUMP, "mq", "publish", "orders", "--server", f"{via}@{where[via]}",
                     "--universe", "k"], stdin=b"m\n", capture_stdout=True, env=env)
                return done.stdout.decode()

            await trio.run_process([*RDVPUMP, "mq", "declare", "orders", "--shared",
                                    "--server", f"c@{where['c']}", "--universe", "k"],
                                   capture_stdout=True, env=env)
            assert (await publish("c")).startswith("published 1 to orders on a:15555")
            seen_b, seen_c = len(b.seen), len(c.seen)
            a.proc.send_signal(signal.SIGSTOP)
            try:
                said = await b.until("b: a silent for", after=seen_b)
                assert "counted out until it is heard again" in said
                await b.until("(1 of 2 peers; a silent); root b", after=seen_b)
                await c.until("root b", after=seen_c)
                assert (await publish("c")).startswith("published 1 to orders on b:15555")
            finally:
                seen_b = len(b.seen)
                a.proc.send_signal(signal.SIGCONT)
            await a.until("a steps down")
            await b.until("b: a heard again")
            # a, the most senior primary, is root again, at a newer epoch than b's; b
            # relays to it once b too follows it on links both ways (under a loaded
            # machine's timing a's line can come first, and a publish through b then met
            # b's link to a closing: 503, "may or may not be stored")
            await a.until("(2 of 2 peers); root a")
            await b.until("(2 of 2 peers); root a", after=seen_b)
            assert (await publish("b")).startswith("published 1 to orders on a:15555")
