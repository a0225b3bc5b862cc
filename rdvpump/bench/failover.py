"""rdvpump bench failover: a replicated group's master SIGKILLed, the time until a publish
is acknowledged by its successor; beside a three-node NATS JetStream cluster whose stream
leader is SIGKILLed the same way, in the same run.

Ours: a name service (``manager serve``) and three ``broker run --role server --group
a`` processes, ``--replication sync``, and a tracker, on 127.0.0.1, every setting at its
default.  A client in this process publishes 1 KiB messages to the master; each trial
SIGKILLs the master and times from the kill to the first publish the new master
acknowledges (the client asks the name service which member is master, every 5 ms, and
publishes there); the killed member is then started again on its directory and the next
trial waits until it is back in sync.  Beside it, in the same trials, an ``mq.Producer``
with its default settings that follows the tracker's route table publishes a message
every 5 ms, and the time from the kill to its first acknowledgement by another member
is the routed figure; an ``mq.Consumer`` of the route table acknowledges every message as it comes,
and what it gets again after each kill is the redelivery figure (duplicates per
failover, and how long before the kill the oldest of them had first come).  One more
trial SIGSTOPs the master instead (hung, its links open): the
members' silence rules find it.  Throughput, on a topic of its own: 1 KiB publishes
from 32 concurrent publishers each awaiting its acknowledgement (:data:`PUBLISHERS`),
then five times as many in batches as ``bench mq`` sends them, for the single server,
the ``async`` group and the ``sync`` group, each at ``--durability interval:1`` and at
``sync`` (:data:`DURABILITIES`).

NATS: three ``nats-server -js`` processes in one cluster, a stream with three replicas,
the ``nats-py`` client connected to all three; each trial SIGKILLs the stream's leader
and times from the kill to the first acknowledged ``js.publish`` (tried every 250 ms at
most), then starts it again and waits until every replica is current.  Before the
trials, its throughput the same two ways, at R = 3 and on a single server of its own
(file storage, fsynced on its own schedule: every two minutes).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from ..children import start_child
from ._failover_results import (
    BATCHED,
    DEADLINE,
    SIZE,
    FailoverResult,
    RedeliveryResult,
    ThroughputResult,
)
from ._jetstream import jetstream

__all__ = ["FailoverResult", "RedeliveryResult", "ThroughputResult", "run"]

UNIVERSE = "bench-failover"
RDVPUMP = [sys.executable, "-m", "rdvpump"]


#: The failover trials' figures.
Tried = list[FailoverResult | RedeliveryResult]


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("RDVPUMP_")}


@asynccontextmanager
async def _spawn(args: list[str]) -> AsyncIterator[tuple[trio.Process, str]]:
    """``rdvpump ARGS`` once its ``ready`` line came (it ends with this process, see
    :func:`~rdvpump.children.start_child`); killed and reaped on the way out."""
    started: list[trio.Process] = []
    try:
        # its stderr dropped: a nursery to read it would be entered and left out of
        # order by the exit stacks the benchmarks keep their children in
        child = await start_child(args, _env(), started, None)
        yield child.process, f"{child.address[0]}:{child.address[1]}"
    finally:
        for proc in started:
            if proc.returncode is None:
                proc.kill()
            with trio.move_on_after(10):
                await proc.wait()


async def _spawn_all(stack: AsyncExitStack, arg_lists: list[list[str]]
                     ) -> list[trio.Process]:
    """:func:`_spawn` of each ``rdvpump ARGS`` at once (each waits for its ``ready``
    line beside the others'), killed and reaped when ``stack`` closes."""
    started: list[trio.Process] = []

    async def reap() -> None:
        for proc in started:
            if proc.returncode is None:
                proc.kill()
            with trio.move_on_after(10):
                await proc.wait()

    stack.push_async_callback(reap)
    children: list[Any] = [None] * len(arg_lists)

    async def one(i: int) -> None:
        children[i] = await start_child(arg_lists[i], _env(), started, None)

    async with trio.open_nursery() as nursery:
        for i in range(len(arg_lists)):
            nursery.start_soon(one, i)
    return [child.process for child in children]


class _Group:
    """A name service and a group of three MQ server processes (one without
    ``replication``), and this process's client side of them."""

    def __init__(self, tmp: Path, replication: str | None, durability: str) -> None:
        self.tmp = tmp
        self.replication = replication
        self.durability = durability
        self.procs: dict[str, trio.Process] = {}
        self.manager = ""

    def member_args(self, name: str, member_id: int) -> list[str]:
        args = ["broker", "run", "--id", name, "--universe", UNIVERSE, "--manager",
                self.manager, "--role", "server", "--mq-dir", str(self.tmp / "data"),
                "--durability", self.durability]
        if self.replication is not None:
            args += ["--group", "a", "--group-id", str(member_id), "--replication",
                     self.replication, "--tracker", "t1:15555"]
        return args


async def _master(names: Any, *, not_: str | None = None, insync: int = 2) -> str:
    """The group's master once one other than ``not_`` is there with ``insync`` members
    in sync on its topics (polled every 5 ms, bounded)."""
    with trio.fail_after(DEADLINE):
        while True:
            group = await names.group("a")
            master = group.get("master")
            if master not in (None, not_) and len(group.get("insync") or []) >= insync:
                return str(master)
            await trio.sleep(0.005)


async def _declare_when_taken(client: Any, topic: str, deadline: float) -> None:
    """Declare ``topic`` once the master takes it (confirmed by the name service: the
    members start together, and it may be named master before it hears so)."""
    from brokermgr import ServiceError, Status

    while True:
        try:
            await client.declare(topic)
            return
        except ServiceError as exc:
            if exc.status != Status.UNAVAILABLE or trio.current_time() > deadline:
                raise
            await trio.sleep(0.005)


async def _publish_until_acked(client: Any, body: bytes, deadline: float,
                               topic: str = "bench") -> None:
    from brokermgr import ServiceError

    while True:
        try:
            await client.publish(topic, body)
            return
        except ServiceError:
            if trio.current_time() > deadline:
                raise
            await trio.sleep(0.005)


#: The MQ servers' ``--durability`` of the throughput figures: ``interval:1`` beside
#: JetStream's default (it fsyncs every two minutes), and ``sync``, the default (the
#: failover trials run at it).
DURABILITIES = ("interval:1", "sync")


async def _ours(trials: int, messages: int, publishers: int, tmp: Path,
                progress: Callable[[str], None]) -> tuple[list[FailoverResult | RedeliveryResult],
                                                          dict[tuple[str, str, str], float]]:
    """The failover trials, and every throughput of ours, by (system, durability,
    publish)."""
    rates: dict[tuple[str, str, str], float] = {}
    results: list[FailoverResult | RedeliveryResult] = []
    for durability in DURABILITIES:
        for replication in (None, "async", "sync"):
            label = replication or "single"
            progress(f"rdvpump {label}, --durability {durability}: starting")
            group = _Group(tmp / f"{label}-{durability.replace(':', '')}", replication,
                           durability)
            at = trials if (replication, durability) == ("sync", "sync") else 0
            awaited, batched, tried = await _measure(group, messages, publishers, at,
                                                     progress)
            rates[(label, durability, "awaited")] = awaited
            rates[(label, durability, "batched")] = batched
            results += tried
    return results, rates


async def _measure(group: _Group, messages: int, publishers: int, trials: int,
                   progress: Callable[[str], None]) -> tuple[float, float, Tried]:
    """One group (or single server) started: its awaited and batched throughputs, then
    ``trials`` failovers (none: no tracker started)."""
    from brokermgr import BrokerManager, NameClient
    from mq import MqClient
    from pump import Pump
    from rdv import Address

    body = b"x" * SIZE
    tried: Tried = []
    async with _spawn(["manager", "serve", "--universe", UNIVERSE, "--listen",
                       "127.0.0.1:0"]) as (_, manager), trio.open_nursery() as nursery:
        group.manager = manager
        universe = BrokerManager(UNIVERSE, pump=Pump(name="bench"))
        await nursery.start(universe.pump.serve)
        await nursery.start(universe.serve_network, "127.0.0.1", 0)
        names = NameClient(universe, [Address.parse(manager)])
        names.start()
        async with AsyncExitStack() as stack:
            members = [f"s{i}" for i in range(1 if group.replication is None else 3)]
            spawned = dict(zip(members, await _spawn_all(
                stack, [group.member_args(name, i) for i, name in enumerate(members)]),
                strict=True))
            first = "s0" if group.replication is None else await _master(names, insync=0)
            client = MqClient(universe.add_broker("c-rate"), f"{first}:15555", timeout=10)
            for topic in (RATE, "bench"):  # the trials' consumer sees only theirs
                await _declare_when_taken(client, topic, trio.current_time() + DEADLINE)
                # the first publish once the replicas follow the topic (sync: in sync)
                await _publish_until_acked(client, body, trio.current_time() + DEADLINE,
                                           topic)
            awaited = await _rate(client, messages, body, publishers)
            batched = await _batched_rate(client, BATCHED * messages, body)
            client.close()
            if trials:
                await stack.enter_async_context(_spawn([
                    "broker", "run", "--id", "t1", "--universe", UNIVERSE, "--manager",
                    manager, "--role", "tracker"]))
                tried = await _trials(universe, names, group, spawned, stack, trials,
                                      body, progress)
        names.close()
        nursery.cancel_scope.cancel()
    return awaited, batched, tried


#: Concurrent publishers of the throughput figures, by default (``sync`` adds the
#: replicas' round trip to each publish: with more in flight, one acknowledgement of a
#: replica covers several).
PUBLISHERS = 32


async def _rate(client: Any, messages: int, body: bytes, publishers: int) -> float:
    """1 KiB publishes from ``publishers`` concurrent publishers, one message each:
    messages per second."""
    per = max(1, messages // publishers)

    async def publisher() -> None:
        for _ in range(per):
            await client.publish(RATE, body)

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(publishers):
            nursery.start_soon(publisher)
    return publishers * per / (time.perf_counter() - start)


#: The topic of the throughput figures (the trials publish to ``bench``).
RATE = "rate"


async def _batched_rate(client: Any, messages: int, body: bytes) -> float:
    """1 KiB publishes in batches, a few batches in flight, as ``bench mq`` sends them:
    messages per second."""
    from .mq import IN_FLIGHT, batch_for, publish_in_flight

    start = time.perf_counter()
    await publish_in_flight(client, RATE, body, messages, batch_for(SIZE), IN_FLIGHT)
    return messages / (time.perf_counter() - start)


async def _trials(universe: Any, names: Any, group: _Group, spawned: dict[str, Any],
                  stack: AsyncExitStack, trials: int, body: bytes,
                  progress: Callable[[str], None]) -> list[FailoverResult | RedeliveryResult]:
    from brokermgr.tracking import RouteClient
    from mq import MqClient

    killed = FailoverResult("failover-rdvpump-sync-sigkill", trials)
    routed = FailoverResult("failover-rdvpump-sync-sigkill-routed-producer", trials)
    hung = FailoverResult("failover-rdvpump-sync-sigstop", 1)
    routes = RouteClient(universe.add_broker("routes"))
    routes.add_tracker("t1:15555")
    with trio.fail_after(DEADLINE):
        while len(routes.routes.servers_of("bench")) < 3:
            await routes.changed()
    clients = _RoutedClients(routes, body)
    kills: list[float] = []
    hung_at = float("inf")
    async with trio.open_nursery() as nursery:
        await nursery.start(clients.consumer.run)
        nursery.start_soon(clients.consume)
        nursery.start_soon(clients.publish_every_5ms)
        for trial in range(trials + 1):
            stop = trial == trials  # the last trial: a hung master, found by its silence
            master = await _master(names, insync=2)
            progress(f"rdvpump sync: trial {trial + 1} of {trials + 1}, master {master}")
            before = MqClient(universe.add_broker(f"c{trial}"), f"{master}:15555", timeout=5)
            await before.publish("bench", body)
            before.close()
            proc = spawned[master]
            start = trio.current_time()
            proc.send_signal(signal.SIGSTOP if stop else signal.SIGKILL)
            if not stop:
                kills.append(start)
            else:
                hung_at = start  # its redeliveries are not the last kill's
            successor = await _master(names, not_=master, insync=0)
            after = MqClient(universe.add_broker(f"d{trial}"), f"{successor}:15555",
                             timeout=1)
            await _publish_until_acked(after, body, start + DEADLINE)
            (hung if stop else killed).seconds.append(trio.current_time() - start)
            after.close()
            if not stop:
                routed.seconds.append(await clients.first_ack_after(start, master) - start)
            if stop:
                proc.kill()
            with trio.move_on_after(10):
                await proc.wait()
            spawned[master], _ = await stack.enter_async_context(
                _spawn(group.member_args(master, int(master[1:]))))
        nursery.cancel_scope.cancel()
    clients.close()
    routes.close()
    return [killed, routed, hung, clients.redeliveries(kills, hung_at)]


class _RoutedClients:
    """A routed producer publishing every 5 ms, each ack's time kept, and a routed
    consumer acknowledging each message, each message's first delivery kept."""

    def __init__(self, routes: Any, body: bytes) -> None:
        from mq import Consumer, Producer

        self.body = body
        self.producer = Producer(routes, "bench")  # every setting its default
        self.consumer = Consumer(routes, "bench", group="failover")  # from the end on
        #: when each publish was acknowledged, and by which server
        self.acked: list[tuple[float, str]] = []
        self.changed = trio.Event()
        self.first: dict[tuple[str, int], float] = {}
        self.again: list[tuple[float, float]] = []  # (redelivered, first delivered)
        self.deliveries = 0

    async def consume(self) -> None:
        async for message in self.consumer:
            now, key = trio.current_time(), (message.producer, message.sequence)
            self.deliveries += 1
            if key in self.first:
                self.again.append((now, self.first[key]))
            else:
                self.first[key] = now
            message.ack_nowait()

    async def publish_every_5ms(self) -> None:
        while True:
            stored = await self.producer.publish(self.body)
            self.acked.append((trio.current_time(), stored.server))
            self.changed.set()
            self.changed = trio.Event()
            await trio.sleep(0.005)

    async def first_ack_after(self, start: float, killed: str) -> float:
        """When the first publish after ``start`` was acknowledged by a server other than
        ``killed`` (one the master answered before it died is not a failover)."""
        with trio.fail_after(DEADLINE):
            while True:
                after = [t for t, server in self.acked
                         if t > start and server.partition(":")[0] != killed]
                if after:
                    return after[0]
                await self.changed.wait()

    def redeliveries(self, kills: list[float], end: float) -> RedeliveryResult:
        """What came again between each kill and the next (the last: and ``end``)."""
        redelivered = RedeliveryResult("failover-rdvpump-sync-sigkill-routed-consumer")
        redelivered.deliveries = self.deliveries
        for these, kill in zip(per_kill(self.again, kills, end), kills, strict=True):
            redelivered.duplicates.append(len(these))
            redelivered.span.append(max((kill - was for _, was in these), default=0.0))
        return redelivered

    def close(self) -> None:
        self.producer.close()
        self.consumer.close()


def per_kill(again: list[tuple[float, float]], kills: list[float], end: float
             ) -> list[list[tuple[float, float]]]:
    """The redeliveries ``(at, first delivered)`` of ``again`` that came after each kill
    and by the next one (the last kill's: by ``end``, where the trials that are not
    kills begin)."""
    bounds = [*kills[1:], end] if kills else []
    return [[(at, was) for at, was in again if kill < at <= until]
            for kill, until in zip(kills, bounds, strict=True)]


def run(trials: int = 20, messages: int = 20_000, *, publishers: int = PUBLISHERS,
        progress: Callable[[str], None] = lambda _: None) -> list[Any]:
    """Every figure: the failover times (ours killed and hung, NATS killed), then the
    throughputs: ours replicated against our single server, and against JetStream R = 3;
    JetStream R = 3 against its single server."""
    with tempfile.TemporaryDirectory(prefix="rdvpump-failover-") as tmp:
        ours, rates = trio.run(_ours, trials, messages, publishers, Path(tmp), progress)
        theirs, nats_rates = asyncio.run(jetstream(trials, messages, publishers, Path(tmp),
                                                   progress))
    rows: list[Any] = []
    for publish in ("awaited", "batched"):
        for durability in DURABILITIES:
            single = rates[("single", durability, publish)]
            for mode in ("async", "sync"):
                rows.append(ThroughputResult(
                    f"replication-{mode}", SIZE, rates[(mode, durability, publish)],
                    "single server", single, publish, durability))
            rows.append(ThroughputResult(
                "replication-sync", SIZE, rates[("sync", durability, publish)],
                "nats-jetstream-r3", nats_rates[("r3", publish)], publish, durability))
        rows.append(ThroughputResult(
            "nats-jetstream-r3", SIZE, nats_rates[("r3", publish)],
            "nats-jetstream single server", nats_rates[("single", publish)], publish,
            "jetstream default"))
    return [*ours, theirs, *rows]
