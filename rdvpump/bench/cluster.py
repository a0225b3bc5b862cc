"""rdvpump bench cluster: the external switching rate (XSR) of OpenAMQ's cluster figures,
on this machine.

A cluster of 1 + B server processes on 127.0.0.1 (a root, the one primary, and B fanout
servers; ``broker run --cluster``, ``--durability interval:1``), one shared topic with
B x Q consume groups, Q on each fanout server, and B x Q external clients, one per group,
each consuming on its group's fanout server (the Q clients of each fanout server in a
process of their own, this module run as a program): every message reaches every client
(OpenAMQ's B brokers each fanning one faucet out to Q queues).  One external faucet in
this process publishes 1,000-byte messages to the root, in batches of 100, two in
flight by default (``in_flight``).  The clients are sinks: each acknowledges what it
gets, as columns by default (``sink="batch"``: ``receive_batch``, no object made per
message), or as a :class:`~mq.Message` each (``sink="messages"``: ``receive_many``).
The figure: deliveries per second, from the first publish to the last delivery,
against the target those figures set for B = 3, Q = 4 (480 K messages/s).  Beside it,
the CPU each kind of process used over the same span (Linux's ``/proc``): a figure that
swings far less between runs than the rate does, for comparing two trees.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from .._errors import RunError
from .failover import _env, _spawn
from .mq import publish_in_flight

UNIVERSE = "bench-cluster"
SIZE = 1000
BATCH = 100
#: Batches the faucet keeps in flight on its link by default: it publishes the next
#: while the root stores the last (OpenAMQ's faucet publishes without waiting for each
#: message to be taken; ``bench mq``'s producer keeps several batches in flight too).
IN_FLIGHT = 2
#: OpenAMQ's tentative XSR for B = Q = 4 on its own hardware, messages per second.
SEED_XSR = 480_000
#: How the clients consume: ``receive_batch`` (columns) or ``receive_many`` (a Message
#: each).
SINKS = ("batch", "messages")
DEADLINE = 120.0


@dataclass
class ClusterResult:
    case: str
    brokers: int
    queues: int
    messages: int
    #: batches the faucet keeps in flight
    in_flight: int
    #: how the clients consume (:data:`SINKS`)
    sink: str
    deliveries_per_s: float
    baseline: str
    baseline_per_s: float
    #: CPU seconds each kind of process used from the first publish to the last
    #: delivery (:data:`ROLES`); None where ``/proc`` cannot be read
    cpu_s: dict[str, float] | None = None
    #: the deliveries counted (for the CPU a delivery)
    deliveries: int = 0

    def to_dict(self) -> dict[str, Any]:
        cpu = self.cpu_s
        return {"case": self.case, "brokers": self.brokers, "queues": self.queues,
                "size": SIZE, "messages": self.messages, "in_flight": self.in_flight,
                "sink": self.sink,
                "deliveries_per_s": round(self.deliveries_per_s, 1),
                "baseline": self.baseline, "baseline_per_s": self.baseline_per_s,
                "ratio": round(self.deliveries_per_s / self.baseline_per_s, 3),
                "cpu_s": None if cpu is None else {k: round(v, 2) for k, v in cpu.items()},
                "cpu_us_per_delivery": None if cpu is None or not self.deliveries else round(
                    sum(cpu.values()) / self.deliveries * 1e6, 2)}


#: The kinds of process whose CPU a run reports: the root, the fanout servers, the
#: clients' processes, and this one (the faucet).
ROLES = ("root", "fanout", "clients", "faucet")


def cpu_seconds(pids: dict[str, list[int]]) -> dict[str, float] | None:
    """The CPU seconds (user and system, every thread) the processes of each role have
    used so far, from Linux's ``/proc/PID/stat`` (a process that ended and is not
    reaped yet still has its there); None where that cannot be read."""
    try:
        tick = os.sysconf("SC_CLK_TCK")
        used = {}
        for role, ids in pids.items():
            total = 0
            for pid in ids:
                # the fields after the command's ")": utime and stime are the 12th and 13th
                fields = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
                total += int(fields[11]) + int(fields[12])
            used[role] = total / tick
    except (OSError, ValueError, IndexError):
        return None
    return used


def _cluster_file(path: Path, brokers: int) -> Path:
    servers = [("root", "primary"), *((f"f{i}", "fanout") for i in range(brokers))]
    path.write_text('[cluster]\nname = "bench"\n' + "".join(
        f'[[server]]\nid = "{i}"\naddress = "127.0.0.1:1"\ntype = "{t}"\n' for i, t in servers))
    return path


async def _until_ok(attempt: Callable[[], Any]) -> Any:
    """``attempt()`` again until it is not refused (the cluster settling), bounded."""
    from mq import ServiceError

    with trio.fail_after(DEADLINE):
        while True:
            try:
                return await attempt()
            except ServiceError:
                await trio.sleep(0.05)


async def _declare_feed(faucet: Any, groups: list[str]) -> None:
    """The shared topic and its groups, each declared through the root once it answers."""
    await _until_ok(lambda: faucet.declare("feed", shared=True))
    for group in groups:
        async def declare(group: str = group) -> Any:
            return await faucet.declare("feed", group=group, shared=True)

        await _until_ok(declare)


async def _xsr(brokers: int, queues: int, messages: int, in_flight: int, sink: str,
               tmp: Path, progress: Callable[[str], None]) -> ClusterResult:
    from brokermgr import BrokerManager, NameClient
    from mq import MqClient
    from pump import Pump
    from rdv import Address

    file = _cluster_file(tmp / "cluster.toml", brokers)
    ids = ["root", *(f"f{i}" for i in range(brokers))]
    pids: dict[str, list[int]] = {role: [] for role in ROLES}
    pids["faucet"].append(os.getpid())
    async with _spawn(["manager", "serve", "--universe", UNIVERSE, "--listen",
                       "127.0.0.1:0"]) as (_, manager), AsyncExitStack() as stack, \
            trio.open_nursery() as nursery:
        for server in ids:
            (tmp / server).mkdir()
            process, _ = await stack.enter_async_context(_spawn([
                "broker", "run", "--id", server, "--universe", UNIVERSE, "--manager", manager,
                "--cluster", str(file), "--state-dir", str(tmp / server), "--role", "server",
                "--mq-dir", str(tmp / server), "--durability", "interval:1",
                "--listen", "127.0.0.1:0", "--heartbeat", "0.5"]))
            pids["root" if server == "root" else "fanout"].append(process.pid)
        universe = BrokerManager(UNIVERSE, pump=Pump(name="bench"))
        await nursery.start(universe.pump.serve)
        await nursery.start(universe.serve_network, "127.0.0.1", 0)
        names = NameClient(universe, [Address.parse(manager)])
        names.start()
        progress(f"cluster of {len(ids)}: declaring")
        faucet = MqClient(universe.add_broker("faucet"), "root:15555", timeout=30)
        groups = [(f"f{b}", f"q{b}.{q}") for b in range(brokers) for q in range(queues)]
        await _declare_feed(faucet, [group for _, group in groups])
        per_server: dict[str, list[str]] = {}
        for server, group in groups:
            per_server.setdefault(server, []).append(group)
        # each fanout server's clients in a process of their own (external clients)
        procs = [await stack.enter_async_context(_clients_process(
            manager, server, messages, sink, names_)) for server, names_ in per_server.items()]
        for proc in procs:
            await _expect(proc, "ready")
        pids["clients"] += [proc.proc.pid for proc in procs]
        progress(f"{messages} messages of {SIZE} bytes to {len(groups)} clients")
        before = cpu_seconds(pids)
        start = time.perf_counter()
        await publish_in_flight(faucet, "feed", b"x" * SIZE, messages, BATCH, in_flight)
        for proc in procs:
            await _expect(proc, "done")
        elapsed = time.perf_counter() - start
        after = cpu_seconds(pids)
        names.close()
        nursery.cancel_scope.cancel()
    if elapsed <= 0:
        raise RunError("the run took no time")
    cpu = None if before is None or after is None else {
        role: after[role] - before[role] for role in ROLES}
    return ClusterResult("cluster-xsr", brokers, queues, messages, in_flight, sink,
                         messages * len(groups) / elapsed, "OpenAMQ XSR target (B=Q=4)",
                         SEED_XSR, cpu, messages * len(groups))


@asynccontextmanager
async def _clients_process(manager: str, server: str, messages: int, sink: str,
                           groups: list[str]) -> AsyncIterator[_Lines]:
    """A process of this module (:func:`_clients`) consuming ``groups`` on ``server``;
    killed and reaped on the way out."""
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "rdvpump.bench.cluster", manager, server, str(messages), sink,
         *groups], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, env=_env())
    try:
        yield _Lines(proc)
    finally:
        if proc.returncode is None:
            proc.kill()
        with trio.move_on_after(10):
            await proc.wait()


class _Lines:
    def __init__(self, proc: trio.Process) -> None:
        self.proc = proc
        self.buffer = b""

    async def line(self) -> str:
        assert self.proc.stdout is not None
        while b"\n" not in self.buffer:
            chunk = await self.proc.stdout.receive_some(4096)
            if not chunk:
                raise RunError(f"a clients process ended (exit {self.proc.returncode})")
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line.decode()


async def _expect(proc: _Lines, word: str) -> None:
    with trio.move_on_after(DEADLINE) as waited:
        line = await proc.line()
    if waited.cancelled_caught:
        raise RunError(f"a clients process said nothing for {DEADLINE:.0f} s (waiting for "
                       f"{word!r}): the cluster stopped delivering to it")
    if line != word:
        raise RunError(f"a clients process said {line!r}, not {word!r}")


async def _clients(manager: str, server: str, messages: int, sink: str, groups: list[str]
                   ) -> None:
    """One client per group consuming on ``server``: ``ready`` once all consume, ``done``
    once each had ``messages`` (acknowledged as they come, as ``sink`` says)."""
    from brokermgr import BrokerManager, NameClient
    from mq import MqClient
    from pump import Pump
    from rdv import Address

    universe = BrokerManager(UNIVERSE, pump=Pump(name="clients"))
    async with trio.open_nursery() as nursery:
        await nursery.start(universe.pump.serve)
        await nursery.start(universe.serve_network, "127.0.0.1", 0)
        names = NameClient(universe, [Address.parse(manager)])
        names.start()
        subscriptions = []
        for group in groups:
            client = MqClient(universe.add_broker(f"client-{group}"), f"{server}:15555",
                              timeout=30)

            async def subscribe(client: Any = client, group: str = group) -> Any:
                return await client.subscribe("feed", group=group, window=2000)

            subscriptions.append(await _until_ok(subscribe))
        print("ready", flush=True)

        async def batches(subscription: Any) -> None:
            count = 0
            while count < messages:
                batch = await subscription.receive_batch(2000)
                count += len(batch)
                await batch.ack()

        async def each(subscription: Any) -> None:
            count = 0
            while count < messages:
                got = await subscription.receive_many(2000)
                count += len(got)
                await subscription.ack([m.offset for m in got])

        async with trio.open_nursery() as sinks:
            for subscription in subscriptions:
                sinks.start_soon(batches if sink == "batch" else each, subscription)
        print("done", flush=True)
        names.close()
        nursery.cancel_scope.cancel()


#: OpenAMQ's tentative capacity of one broker, messages per second: its internal switching
#: rate into B brokers of Q queues each is B x Q times it.
SEED_BROKER = 25_000


def run(brokers: int = 3, queues: int = 4, messages: int = 20_000, *, isr: bool = True,
        in_flight: int = IN_FLIGHT, sink: str = "batch",
        progress: Callable[[str], None] = lambda _: None) -> list[ClusterResult]:
    """The XSR figure (``brokers`` x ``queues``), then, with ``isr``, the internal one's
    configuration (B = 7, Q = 12), its 84 groups each consumed by a client of this
    process that discards what it gets: OpenAMQ's sinks are queues with no consumer,
    which cost a root nothing here (it sends a group's messages only to consumers)."""
    import tempfile

    results = []
    with tempfile.TemporaryDirectory(prefix="rdvpump-cluster-") as tmp:
        (Path(tmp) / "xsr").mkdir()
        results.append(trio.run(_xsr, brokers, queues, messages, in_flight, sink,
                                Path(tmp) / "xsr", progress))
        if isr:
            (Path(tmp) / "isr").mkdir()
            internal = trio.run(_xsr, 7, 12, messages, in_flight, sink, Path(tmp) / "isr",
                                progress)
            results.append(ClusterResult("cluster-isr-discarding-clients", 7, 12, messages,
                                         in_flight, sink, internal.deliveries_per_s,
                                         "OpenAMQ ISR B x Q x 25 K", 7 * 12 * SEED_BROKER,
                                         internal.cpu_s, internal.deliveries))
    return results


if __name__ == "__main__":  # a process of external clients (see _clients_process)
    from channels import keep_freed_memory

    keep_freed_memory()  # as an embedding client moving large frames would (bench mq's too)
    trio.run(_clients, sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5:])
