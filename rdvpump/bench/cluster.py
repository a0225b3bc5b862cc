"""rdvpump bench cluster: the external switching rate (XSR) of OpenAMQ's cluster figures,
on this machine.

A cluster of 1 + B server processes on 127.0.0.1 (a root, the one primary, and B fanout
servers; ``broker run --cluster``, ``--durability interval:1``), one shared topic with
B x Q consume groups, Q on each fanout server, and B x Q external clients in this
process, one per group, each consuming on its group's fanout server: every message
reaches every client (OpenAMQ's B brokers each fanning one faucet out to Q queues).  One
external faucet in this process publishes 1,000-byte messages to the root, in batches.
The figure: deliveries per second, from the first publish to the last delivery,
against the target those figures set for B = 3, Q = 4 (480 K messages/s).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from .._errors import RunError
from .failover import _spawn

UNIVERSE = "bench-cluster"
SIZE = 1000
BATCH = 100
#: OpenAMQ's tentative XSR for B = Q = 4 on its own hardware, messages per second.
SEED_XSR = 480_000
DEADLINE = 120.0


@dataclass
class ClusterResult:
    case: str
    brokers: int
    queues: int
    messages: int
    deliveries_per_s: float
    baseline: str
    baseline_per_s: float

    def to_dict(self) -> dict[str, Any]:
        return {"case": self.case, "brokers": self.brokers, "queues": self.queues,
                "size": SIZE, "messages": self.messages,
                "deliveries_per_s": round(self.deliveries_per_s, 1),
                "baseline": self.baseline, "baseline_per_s": self.baseline_per_s,
                "ratio": round(self.deliveries_per_s / self.baseline_per_s, 3)}


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


async def _xsr(brokers: int, queues: int, messages: int, tmp: Path,
               progress: Callable[[str], None]) -> ClusterResult:
    from brokermgr import BrokerManager, NameClient
    from mq import MqClient
    from pump import Pump
    from rdv import Address

    file = _cluster_file(tmp / "cluster.toml", brokers)
    ids = ["root", *(f"f{i}" for i in range(brokers))]
    async with _spawn(["manager", "serve", "--universe", UNIVERSE, "--listen",
                       "127.0.0.1:0"]) as (_, manager), AsyncExitStack() as stack, \
            trio.open_nursery() as nursery:
        for server in ids:
            (tmp / server).mkdir()
            await stack.enter_async_context(_spawn([
                "broker", "run", "--id", server, "--universe", UNIVERSE, "--manager", manager,
                "--cluster", str(file), "--state-dir", str(tmp / server), "--role", "server",
                "--mq-dir", str(tmp / server), "--durability", "interval:1",
                "--listen", "127.0.0.1:0", "--heartbeat", "0.5"]))
        universe = BrokerManager(UNIVERSE, pump=Pump(name="bench"))
        await nursery.start(universe.pump.serve)
        await nursery.start(universe.serve_network, "127.0.0.1", 0)
        names = NameClient(universe, [Address.parse(manager)])
        names.start()
        progress(f"cluster of {len(ids)}: declaring")
        faucet = MqClient(universe.add_broker("faucet"), "root:15555", timeout=30)
        await _until_ok(lambda: faucet.declare("feed", shared=True))
        groups = [(f"f{b}", f"q{b}.{q}") for b in range(brokers) for q in range(queues)]
        for _, group in groups:
            async def declare(group: str = group) -> Any:
                return await faucet.declare("feed", group=group, shared=True)

            await _until_ok(declare)
        counts = [0] * len(groups)
        done = trio.Event()

        async def sink(index: int, server: str, group: str) -> None:
            client = MqClient(universe.add_broker(f"client-{group}"), f"{server}:15555",
                              timeout=30)
            subscription = await _until_ok(lambda: client.subscribe(
                "feed", group=group, window=2000))
            subscribed.append(group)
            while counts[index] < messages:
                got = await subscription.receive_many(2000)
                counts[index] += len(got)
                await subscription.ack([m.offset for m in got])
            if all(c >= messages for c in counts):
                done.set()

        subscribed: list[str] = []
        for index, (server, group) in enumerate(groups):
            nursery.start_soon(sink, index, server, group)
        with trio.fail_after(DEADLINE):
            while len(subscribed) < len(groups):
                await trio.sleep(0.05)
        progress(f"{messages} messages of {SIZE} bytes to {len(groups)} clients")
        body = b"x" * SIZE
        start = time.perf_counter()
        for first in range(0, messages, BATCH):
            await faucet.publish_many("feed", [body] * min(BATCH, messages - first))
        with trio.fail_after(DEADLINE):
            await done.wait()
        elapsed = time.perf_counter() - start
        names.close()
        nursery.cancel_scope.cancel()
    if elapsed <= 0:
        raise RunError("the run took no time")
    return ClusterResult("cluster-xsr", brokers, queues, messages,
                         messages * len(groups) / elapsed, "OpenAMQ XSR target (B=Q=4)",
                         SEED_XSR)


#: OpenAMQ's tentative capacity of one broker, messages per second: its internal switching
#: rate into B brokers of Q queues each is B x Q times it.
SEED_BROKER = 25_000


def run(brokers: int = 3, queues: int = 4, messages: int = 20_000, *, isr: bool = True,
        progress: Callable[[str], None] = lambda _: None) -> list[ClusterResult]:
    """The XSR figure (``brokers`` x ``queues``), then, with ``isr``, the internal one's
    configuration (B = 7, Q = 12), its 84 groups each consumed by a client of this
    process that discards what it gets: OpenAMQ's sinks are queues with no consumer,
    which cost a root nothing here (it sends a group's messages only to consumers)."""
    import tempfile

    results = []
    with tempfile.TemporaryDirectory(prefix="rdvpump-cluster-") as tmp:
        (Path(tmp) / "xsr").mkdir()
        results.append(trio.run(_xsr, brokers, queues, messages, Path(tmp) / "xsr",
                                progress))
        if isr:
            (Path(tmp) / "isr").mkdir()
            internal = trio.run(_xsr, 7, 12, messages, Path(tmp) / "isr", progress)
            results.append(ClusterResult("cluster-isr-discarding-clients", 7, 12, messages,
                                         internal.deliveries_per_s,
                                         "OpenAMQ ISR B x Q x 25 K", 7 * 12 * SEED_BROKER))
    return results
