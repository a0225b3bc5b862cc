"""rdvpump bench partition: a replicated group's master cut off from the network without
a word (no FIN, no RST), the time until a publish is acknowledged by its successor;
beside a three-node NATS JetStream cluster whose stream leader is cut off the same way,
in the same run.

Each process runs on a host of its own (:mod:`rdvpump.nemesis`: Linux network
namespaces on a bridge; root and iproute2): a name service, three ``broker run --role
server --group a --replication sync`` members with every other setting at its default,
and a client (:mod:`._probe`) that publishes 1 KiB messages to the master.  Each trial
cuts the master's host off (a ``tc`` filter drops its frames) and times, on the client,
from the cut to the first publish another member acknowledged (the client asks the
name service which member is master, every 5 ms, and publishes there); then the network
heals, and the next trial waits until the old master is back in sync as a slave.

NATS: three ``nats-server -js`` processes on three hosts in one cluster, a stream with
three replicas, a ``nats-py`` client on a fourth host connected to all three (pinging
its server every second, so that it leaves a cut-off one); each trial cuts the stream
leader's host off and times to the first acknowledged ``js.publish`` (tried every
250 ms at most), then heals and waits until every replica is current.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import trio

from .._errors import RunError
from ..nemesis import Network, unavailable
from ._failover_results import FailoverResult

UNIVERSE = "bench-partition"
RDVPUMP = [sys.executable, "-m", "rdvpump"]
PROBE = [sys.executable, "-m", "rdvpump.bench._probe"]
DEADLINE = 120.0


async def _line(proc: trio.Process, buffer: list[bytes]) -> str:
    """The next line ``proc`` writes on stdout (bounded)."""
    assert proc.stdout is not None
    with trio.fail_after(DEADLINE):
        while b"\n" not in buffer[0]:
            chunk = await proc.stdout.receive_some(4096)
            if not chunk:
                raise RunError(f"a process of the benchmark ended ({proc.args!r})")
            buffer[0] += chunk
    line, buffer[0] = buffer[0].split(b"\n", 1)
    return line.decode().strip()


async def _ready(proc: trio.Process, buffer: list[bytes]) -> str:
    """The name on the probe's next ``ready NAME`` line (its other lines are skipped)."""
    while True:
        line = await _line(proc, buffer)
        if line.startswith("ready "):
            return line.split()[1]


async def _trials(net: Network, probe: trio.Process, trials: int, host_of: Callable[[str],
                  str], result: FailoverResult, progress: Callable[[str], None],
                  label: str) -> None:
    assert probe.stdin is not None
    buffer = [b""]
    master = await _ready(probe, buffer)
    for trial in range(trials):
        progress(f"{label}: trial {trial + 1} of {trials}, cutting {master} off")
        net.cut(host_of(master))
        await probe.stdin.send_all(f"cut {master}\n".encode())
        line = await _line(probe, buffer)
        if not line.startswith("acked "):
            raise RunError(f"{label}: the probe said {line!r}")
        result.seconds.append(float(line.split()[1]))
        net.heal()
        await probe.stdin.send_all(b"wait\n")
        master = await _ready(probe, buffer)


async def _ours(trials: int, tmp: Path, progress: Callable[[str], None]) -> FailoverResult:
    result = FailoverResult("partition-rdvpump-sync-master-cut", trials)
    with Network(["m", "s0", "s1", "s2", "c"]) as net:
        try:
            manager = f"{net.hosts['m'].address}:9876"
            await net.spawn("m", [*RDVPUMP, "manager", "serve", "--universe", UNIVERSE,
                                  "--listen", manager], stderr=subprocess.DEVNULL)
            for i in range(3):
                name = f"s{i}"
                await net.spawn(name, [
                    *RDVPUMP, "broker", "run", "--id", name, "--universe", UNIVERSE,
                    "--manager", manager, "--listen", f"{net.hosts[name].address}:0",
                    "--role", "server", "--mq-dir", str(tmp / "data"), "--group", "a",
                    "--group-id", str(i), "--replication", "sync"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            probe = await net.spawn("c", [*PROBE, "rdvpump", manager, UNIVERSE,
                                          net.hosts["c"].address], stderr=subprocess.DEVNULL,
                                  stdin=subprocess.PIPE)
            await _trials(net, probe, trials, lambda master: master, result, progress,
                          "rdvpump")
        finally:
            await net.aclose()
    return result


class _Said:
    """A server's stderr, line by line, and an event for each new chunk of it."""

    def __init__(self, proc: trio.Process) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self.changed = trio.Event()

    async def read(self) -> None:
        assert self.proc.stderr is not None
        buffer = b""
        while chunk := await self.proc.stderr.receive_some(65536):
            *lines, buffer = (buffer + chunk).split(b"\n")
            self.lines += [line.decode(errors="replace") for line in lines]
            self.changed.set()
            self.changed = trio.Event()

    async def until(self, needles: tuple[str, ...], after: int) -> None:
        with trio.fail_after(DEADLINE):
            while not any(all(n in x for n in needles) for x in self.lines[after:]):
                await self.changed.wait()


async def _root(trials: int, tmp: Path, progress: Callable[[str], None]) -> FailoverResult:
    """The cluster's case: three primaries a, b, c (a the most senior, so root), a client
    publishing to a shared topic through b; each trial cuts a off, times the first
    publish acknowledged through the new root, heals, and waits until a is root again
    with every peer linked."""
    result = FailoverResult("partition-rdvpump-cluster-root-cut", trials)
    shop = tmp / "shop.toml"
    shop.write_text('[cluster]\nname = "shop"\n' + "".join(
        f'[[server]]\nid = "{i}"\naddress = "127.0.0.1:9999"\ntype = "primary"\n'
        for i in "abc"))
    with Network(["m", "a", "b", "c", "p"]) as net:
        try:
            manager = f"{net.hosts['m'].address}:9876"
            await net.spawn("m", [*RDVPUMP, "manager", "serve", "--universe", UNIVERSE,
                                  "--listen", manager], stderr=subprocess.DEVNULL)
            said = {}
            async with trio.open_nursery() as nursery:
                for name in "abc":
                    state = tmp / f"cluster-{name}"
                    state.mkdir()
                    proc = await net.spawn(name, [
                        *RDVPUMP, "broker", "run", "--id", name, "--universe", UNIVERSE,
                        "--manager", manager, "--listen", f"{net.hosts[name].address}:0",
                        "--role", "server", "--cluster", str(shop), "--state-dir",
                        str(state), "--mq-dir", str(state)], stdout=subprocess.DEVNULL)
                    said[name] = _Said(proc)
                    nursery.start_soon(said[name].read)
                whole = ("(2 of 2 peers)", "; root a at epoch")
                for name in "abc":
                    await said[name].until(whole, 0)
                probe = await net.spawn("p", [*PROBE, "cluster", manager, UNIVERSE,
                                              net.hosts["p"].address, "b"],
                                        stderr=subprocess.DEVNULL, stdin=subprocess.PIPE)
                assert probe.stdin is not None
                buffer = [b""]
                await probe.stdin.send_all(b"wait\n")
                await _ready(probe, buffer)
                for trial in range(trials):
                    progress(f"rdvpump cluster: trial {trial + 1} of {trials}, cutting the "
                             f"root a off")
                    marks = {name: len(said[name].lines) for name in "abc"}
                    net.cut("a")
                    await probe.stdin.send_all(b"cut a\n")
                    line = await _line(probe, buffer)
                    if not line.startswith("acked "):
                        raise RunError(f"rdvpump cluster: the probe said {line!r}")
                    result.seconds.append(float(line.split()[1]))
                    net.heal()
                    for name in "abc":
                        await said[name].until(whole, marks[name])
                    await probe.stdin.send_all(b"wait\n")
                    await _ready(probe, buffer)
                nursery.cancel_scope.cancel()
        finally:
            await net.aclose()
    return result


async def _nats(trials: int, tmp: Path, progress: Callable[[str], None]) -> FailoverResult:
    binary = shutil.which("nats-server")
    if binary is None:
        raise RunError("nats-server not found: apt-get install nats-server")
    result = FailoverResult("partition-nats-jetstream-r3-leader-cut", trials)
    with Network(["n0", "n1", "n2", "c"]) as net:
        try:
            where = {f"n{i}": net.hosts[f"n{i}"].address for i in range(3)}
            for name, address in where.items():
                routes = ",".join(f"nats://{a}:6222" for n, a in where.items() if n != name)
                await net.spawn(name, [
                    binary, "-a", address, "-p", "4222", "-n", name, "-js", "-sd",
                    str(tmp / name), "--cluster_name", "bench", "--cluster",
                    f"nats://{address}:6222", "--routes", routes],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            urls = ",".join(f"nats://{a}:4222" for a in where.values())
            probe = await net.spawn("c", [*PROBE, "nats", urls], stderr=subprocess.DEVNULL,
                                    stdin=subprocess.PIPE)
            await _trials(net, probe, trials, lambda leader: leader, result, progress, "NATS")
        finally:
            await net.aclose()
    return result


def run(trials: int = 20, *, progress: Callable[[str], None] = lambda _: None
        ) -> list[FailoverResult]:
    """Ours (a group's master, a cluster's root), then NATS's: the seconds from each cut
    to the first acknowledgement."""
    why = unavailable()
    if why is not None:
        raise RunError(f"bench partition {why}")
    with tempfile.TemporaryDirectory(prefix="rdvpump-partition-") as tmp:
        ours = trio.run(_ours, trials, Path(tmp), progress)
        root = trio.run(_root, trials, Path(tmp), progress)
        theirs = trio.run(_nats, trials, Path(tmp), progress)
    return [ours, root, theirs]

