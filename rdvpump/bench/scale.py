"""rdvpump bench scale: how the cost grows with the things a deployment has many of.

Six dimensions, each a series of steps, each step a universe of its own in this
process (one pump, in-memory links, trio's real clock), built, measured, torn down:

- ``brokers``: brokers of one universe, each registered with the name service by a name
  client of its own; measured: lookups of random brokers through the name service;
- ``topics``: topics of one MQ server (on disk, ``interval:1``); measured: publishes
  spread over every topic, from concurrent publishers;
- ``groups``: consume groups of one topic, a consumer each; measured: every message
  delivered to every group;
- ``consumers``: consumers of one consume group; measured: every message delivered once;
- ``replicated``: topics of a replicated group of two (a master and its slave following
  every topic, ``sync``: a publish's reply waits for the slave); measured: publishes
  spread over every topic, from concurrent publishers;
- ``servers``: servers reporting to one tracker, followed by a route client; measured: a
  topic declared on a server, until the client's route table holds it.

Per step: the throughput (operations a second of wall time), the p50 and p99 latency of
one operation (a lookup, a publish's reply, a message from its publish to its delivery, a
declare to the route table), and the memory the step's objects hold once built (Python's
allocations, by :mod:`tracemalloc`, measured while the universe is built and its
registrations and subscriptions settle, not while it is measured), and the files it holds
open once measured (``open_files``: sockets and pipes too; None where ``/proc/self/fd``
is not).  The baseline of a
step is the dimension's smallest step.  A step that does not finish within its deadline
is a failure, reported with its step (``error``).
"""

from __future__ import annotations

import gc
import math
import os
import random
import struct
import tempfile
import time
import tracemalloc
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

#: The dimensions and their steps.
STEPS: dict[str, tuple[int, ...]] = {
    "brokers": (10, 100, 1000),
    "topics": (1, 100, 1000, 10000),
    "groups": (1, 10, 100, 1000),
    "consumers": (1, 10, 100, 1000),
    "replicated": (1, 10, 100, 1000),
    "servers": (10, 100, 1000),
}
#: What each dimension's steps count, and what its operations are.
UNITS = {"brokers": ("brokers", "lookups"), "topics": ("topics", "publishes"),
         "groups": ("groups", "deliveries"), "consumers": ("consumers", "deliveries"),
         "replicated": ("topics", "publishes"), "servers": ("servers", "route updates")}
#: Operations measured per step at full scale (deliveries: at least this many).
OPERATIONS = 20_000
#: Seconds a step may take, built and measured, before it counts as stopped.
DEADLINE = 300.0
#: Concurrent publishers (and lookups) of a step.
CONCURRENCY = 8
_STAMP = struct.Struct("<d")


@dataclass
class ScaleResult:
    dimension: str
    n: int
    operations: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list, repr=False)
    memory_bytes: int = 0
    open_files: int | None = None
    build_seconds: float = 0.0
    baseline_per_s: float = 0.0
    baseline_memory_per_unit: float = 0.0
    error: str | None = None

    @property
    def case(self) -> str:
        return f"scale-{self.dimension}"

    @property
    def per_s(self) -> float:
        return self.operations / self.seconds if self.seconds > 0 else 0.0

    @property
    def memory_per_unit(self) -> float:
        return self.memory_bytes / self.n

    def quantile(self, q: float) -> float:
        if not self.latencies:
            return math.nan
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]

    def to_dict(self) -> dict[str, Any]:
        units, ops = UNITS[self.dimension]
        d: dict[str, Any] = {"case": self.case, "dimension": self.dimension,
                             units: self.n, "operations": ops}
        if self.error is not None:
            return {**d, "error": self.error}
        return {**d, "count": self.operations, "per_s": round(self.per_s, 1),
                "p50_ms": round(self.quantile(0.5) * 1e3, 3),
                "p99_ms": round(self.quantile(0.99) * 1e3, 3),
                "memory_bytes": self.memory_bytes,
                "memory_per_unit_bytes": round(self.memory_per_unit),
                "open_files": self.open_files,
                "build_s": round(self.build_seconds, 3),
                "baseline": "the smallest step", "baseline_per_s": round(self.baseline_per_s, 1),
                "ratio": round(self.per_s / self.baseline_per_s, 3)
                if self.baseline_per_s else None,
                "memory_per_unit_ratio": round(self.memory_per_unit
                                               / self.baseline_memory_per_unit, 3)
                if self.baseline_memory_per_unit else None}


class _Measure:
    """A step's clock, memory and files: ``built()`` once the universe stands (the memory
    its objects hold, then no more tracing), ``op(seconds)`` per operation measured,
    ``done()`` at the end (the files open then, beyond those open before)."""

    def __init__(self, result: ScaleResult) -> None:
        self.result = result
        self._files = _open_files()
        gc.collect()
        tracemalloc.start()
        self._began = time.perf_counter()
        self._start = 0.0

    def built(self) -> None:
        gc.collect()
        self.result.memory_bytes = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        self.result.build_seconds = time.perf_counter() - self._began
        self._start = time.perf_counter()

    def op(self, seconds: float) -> None:
        self.result.latencies.append(seconds)
        self.result.operations += 1

    def done(self, operations: int | None = None) -> None:
        self.result.seconds = time.perf_counter() - self._start
        if operations is not None:
            self.result.operations = operations
        files = _open_files()
        if files is not None and self._files is not None:
            self.result.open_files = files - self._files


def _open_files() -> int | None:
    """The file descriptors this process has open (None where /proc does not say)."""
    try:
        return len(os.listdir("/proc/self/fd")) - 1  # less the listing's own
    except OSError:
        return None


async def _concurrently(n: int, work: Callable[[int], Awaitable[None]]) -> None:
    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(work, i)


# -- brokers --------------------------------------------------------------------------


async def _brokers(n: int, operations: int, m: _Measure, tmp: Path) -> None:
    from brokermgr import BrokerManager, NameClient, NameService

    universe = BrokerManager("scale")
    async with trio.open_nursery() as nursery:
        await nursery.start(universe.pump.serve)
        # where its brokers say they listen (their links stay in memory: one process)
        await nursery.start(universe.serve_network, "127.0.0.1", 0)
        NameService(universe)
        clients = []
        for i in range(n):
            broker = universe.add_broker(f"b{i:05d}")
            names = NameClient(universe, ["@manager"], broker=broker)
            names.start()
            clients.append(names)
        for names in clients:
            await names.connected()
        asker = NameClient(universe, ["@manager"], broker=universe.add_broker("asker"))
        asker.start()
        await asker.connected()
        m.built()
        rng = random.Random(1)
        per = max(1, operations // CONCURRENCY)

        async def lookups(_: int) -> None:
            for _ in range(per):
                began = time.perf_counter()
                found = await asker.lookup(f"b{rng.randrange(n):05d}")
                if found is None:
                    raise RuntimeError("a registered broker was not found")
                m.op(time.perf_counter() - began)

        await _concurrently(CONCURRENCY, lookups)
        m.done()
        for names in [*clients, asker]:
            names.close()
        nursery.cancel_scope.cancel()


# -- an MQ server and its clients ---------------------------------------------------------


def mq_server(universe: Any, tmp: Path) -> Any:
    """Broker ``s1`` of ``universe`` an MQ server on disk in ``tmp`` (``interval:1``), as
    every step of MQ topics and the scripts in ``bench/`` that measure one use it."""
    from brokermgr.tracking import TrackNode
    from mq import MqServer

    node = TrackNode(universe.add_broker("s1"), role="server", state_dir=tmp)
    return MqServer(node, tmp, durability="interval:1")


def replicated_pair(universe: Any, directory: Path, *, replication: str = "async"
                    ) -> tuple[Any, Any]:
    """Brokers s1 and s2 of ``universe``: the master (confirmed) and the slave of
    replicated group ``a``, on disk in ``directory`` at ``interval:1`` (the slave not
    following yet), as the replicated steps and the scripts in ``bench/`` use them."""
    from brokermgr import GroupMember
    from brokermgr.tracking import TrackNode
    from mq import MqServer

    servers = []
    for i, (name, role) in enumerate((("s1", "master"), ("s2", "slave"))):
        node = TrackNode(universe.add_broker(name), role="server",
                         group=GroupMember("a", i, role, epoch=1),
                         state_dir=directory / f"{name}-state")
        servers.append(MqServer(node, directory / name, durability="interval:1",
                                replication=replication))
    servers[0].confirm()
    return servers[0], servers[1]


async def _publishes(universe: Any, names: list[str], operations: int, m: _Measure
                     ) -> None:
    """64 B publishes spread over ``names`` from :data:`CONCURRENCY` publishers of server
    s1, each awaiting its reply (one operation)."""
    from mq import MqClient

    publishers = [MqClient(universe.add_broker(f"p{i}"), "s1:15555", timeout=60)
                  for i in range(CONCURRENCY)]
    per = max(1, operations // CONCURRENCY)
    body = b"x" * 64
    n = len(names)

    async def publish(i: int) -> None:
        client = publishers[i]
        for k in range(per):
            began = time.perf_counter()
            await client.publish(names[(i * per + k) % n], body)
            m.op(time.perf_counter() - began)

    await _concurrently(CONCURRENCY, publish)
    m.done()
    for client in publishers:
        await client.aclose()


async def _topics(n: int, operations: int, m: _Measure, tmp: Path) -> None:
    from brokermgr import BrokerManager
    from mq import MqClient

    universe = BrokerManager("scale")
    async with trio.open_nursery() as nursery:
        await nursery.start(universe.pump.serve)
        server = mq_server(universe, tmp)
        admin = MqClient(universe.add_broker("admin"), "s1:15555", timeout=60)
        names = [f"t{i:05d}" for i in range(n)]
        for name in names:
            await admin.declare(name)
        m.built()
        await _publishes(universe, names, operations, m)
        await admin.aclose()
        server.close()
        nursery.cancel_scope.cancel()


async def _replicated(n: int, operations: int, m: _Measure, tmp: Path) -> None:
    """``n`` topics declared on the master of a group of two, the slave following every
    one (built once it does), then publishes as in ``topics``: each reply waits for the
    slave to have the message (``sync``)."""
    from brokermgr import BrokerManager
    from mq import MqClient

    universe = BrokerManager("scale")
    async with trio.open_nursery() as nursery:
        await nursery.start(universe.pump.serve)
        master, slave = replicated_pair(universe, tmp, replication="sync")
        admin = MqClient(universe.add_broker("admin"), "s1:15555", timeout=60)
        names = [f"t{i:05d}" for i in range(n)]
        for name in names:
            await admin.declare(name)
        follower = slave.follow("s1:15555")
        while len(follower.followed) < n:
            await follower.changed.wait()
        m.built()
        await _publishes(universe, names, operations, m)
        await admin.aclose()
        slave.close()
        master.close()
        nursery.cancel_scope.cancel()


async def _deliveries(groups: int, consumers: int, operations: int, m: _Measure,
                      tmp: Path) -> None:
    """One topic, ``groups`` groups of ``consumers`` consumers each: every message goes
    to every group, once per group; a message's latency is from its publish to each
    delivery."""
    from brokermgr import BrokerManager
    from mq import MqClient

    universe = BrokerManager("scale")
    async with trio.open_nursery() as nursery:
        await nursery.start(universe.pump.serve)
        server = mq_server(universe, tmp)
        admin = MqClient(universe.add_broker("admin"), "s1:15555", timeout=60)
        await admin.declare("t")
        subscriptions = []
        clients = []
        for g in range(groups):
            group = f"g{g:04d}"
            await admin.declare("t", group=group)
            for c in range(consumers):
                client = MqClient(universe.add_broker(f"c{g}.{c}"), "s1:15555", timeout=60)
                clients.append(client)
                subscriptions.append(await client.subscribe("t", group=group, window=1000))
        messages = max(10, operations // groups)
        total = messages * groups
        done = trio.Event()
        got = 0
        m.built()

        async def receive(subscription: Any) -> None:
            nonlocal got
            while True:
                batch = await subscription.receive_many()
                now = time.perf_counter()
                for message in batch:
                    m.op(now - _STAMP.unpack_from(message.body)[0])
                got += len(batch)
                await subscription.ack([message.offset for message in batch])
                if got >= total:
                    done.set()

        async with trio.open_nursery() as readers:
            for subscription in subscriptions:
                readers.start_soon(receive, subscription)
            for first in range(0, messages, 100):
                count = min(100, messages - first)
                stamp = _STAMP.pack(time.perf_counter())
                await admin.publish_many("t", [stamp + b"x" * 56] * count)
            await done.wait()
            m.done(got)
            readers.cancel_scope.cancel()
        for client in [admin, *clients]:
            client.close()
        server.close()
        nursery.cancel_scope.cancel()


async def _groups(n: int, operations: int, m: _Measure, tmp: Path) -> None:
    await _deliveries(n, 1, operations, m, tmp)


async def _consumers(n: int, operations: int, m: _Measure, tmp: Path) -> None:
    await _deliveries(1, n, operations, m, tmp)


# -- servers and a tracker -------------------------------------------------------------


async def _servers(n: int, operations: int, m: _Measure, tmp: Path) -> None:
    from brokermgr import BrokerManager
    from brokermgr.tracking import RouteClient, TrackNode

    universe = BrokerManager("scale")
    async with trio.open_nursery() as nursery:
        await nursery.start(universe.pump.serve)
        TrackNode(universe.add_broker("t1"), role="tracker", state_dir=tmp)
        nodes = [TrackNode(universe.add_broker(f"s{i:04d}"), role="server",
                           trackers=["t1:15555"], state_dir=tmp) for i in range(n)]
        client = RouteClient(universe.add_broker("client"))
        client.add_tracker("t1:15555")
        while len(client.routes.server_table) < n:
            await client.changed()
        m.built()
        updates = max(1, min(operations // 10, 2000))
        for k in range(updates):
            node = nodes[k % n]
            topic = f"topic-{k}"
            began = time.perf_counter()
            node.declare_topic(topic)
            while topic not in client.routes.topic_table:
                await client.changed()
            m.op(time.perf_counter() - began)
        m.done()
        client.close()
        nursery.cancel_scope.cancel()


_RUNS: dict[str, Callable[[int, int, _Measure, Path], Awaitable[None]]] = {
    "brokers": _brokers, "topics": _topics, "groups": _groups, "consumers": _consumers,
    "replicated": _replicated, "servers": _servers}


def _step(dimension: str, n: int, operations: int, deadline: float) -> ScaleResult:
    result = ScaleResult(dimension, n)
    with tempfile.TemporaryDirectory(prefix="rdvpump-scale-") as tmp:
        measure = _Measure(result)

        async def main() -> None:
            with trio.fail_after(deadline):
                await _RUNS[dimension](n, operations, measure, Path(tmp))

        try:
            trio.run(main)
        except trio.TooSlowError:
            result.error = f"stopped: not done within {deadline:g} s"
        finally:
            if tracemalloc.is_tracing():
                tracemalloc.stop()
    return result


def steps_at(dimension: str, scale: float) -> list[int]:
    """The dimension's steps, shrunk by ``scale`` below 1."""
    return sorted({max(1, round(n * min(1.0, scale))) for n in STEPS[dimension]})


def run(dimensions: list[str], *, scale: float = 1.0, deadline: float = DEADLINE,
        progress: Callable[[str], None] | None = None) -> Iterator[ScaleResult]:
    """Each dimension's steps in turn, each against the dimension's first step.  A
    ``scale`` below 1 (a smoke run) also shrinks the steps."""
    operations = max(100, int(OPERATIONS * scale))
    for dimension in dimensions:
        steps = steps_at(dimension, scale)
        # a run of the smallest step first, not reported: what a first run imports and
        # caches is not counted as any step's memory or time
        _step(dimension, steps[0], 100, deadline)
        first: ScaleResult | None = None
        for n in steps:
            if progress:
                progress(f"{dimension}: {n:,}")
            result = _step(dimension, n, operations, deadline)
            if first is None and result.error is None:
                first = result
            if first is not None:
                result.baseline_per_s = first.per_s
                result.baseline_memory_per_unit = first.memory_per_unit
            yield result


def plot(results: list[ScaleResult], path: str | Path) -> None:
    """One row per dimension: throughput and p99 latency against the step, and memory
    per unit, each on log axes (matplotlib's Agg canvas: the ``replay`` extra)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    dimensions = list(dict.fromkeys(r.dimension for r in results))
    fig = Figure(figsize=(12, 2.6 * len(dimensions)), dpi=100)
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(dimensions), 3, squeeze=False)
    for row, dimension in zip(axes, dimensions, strict=True):
        done = [r for r in results if r.dimension == dimension and r.error is None]
        units, ops = UNITS[dimension]
        xs = [r.n for r in done]
        for ax, ys, label in ((row[0], [r.per_s for r in done], f"{ops}/s"),
                              (row[1], [r.quantile(0.99) * 1e3 for r in done], "p99 ms"),
                              (row[2], [r.memory_per_unit / 1024 for r in done],
                               f"KiB per {units[:-1]}")):
            ax.plot(xs, ys, marker="o")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel(units)
            ax.set_ylabel(label)
            ax.grid(True, which="both", alpha=0.3)
        failed = [r.n for r in results if r.dimension == dimension and r.error is not None]
        row[0].set_title(dimension + (f" (stopped at {failed[0]:,})" if failed else ""))
    fig.tight_layout()
    fig.savefig(str(path))
