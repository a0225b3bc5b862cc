"""Universe files (TOML) and the workloads they name: echo, stream and fanout.

A workload is played by brokers through the async API, so the same code runs
a universe in one process (``universe run``) or one process per broker
(``universe up``).  ``fanout`` is the "internal switching rate" test of the
OpenAMQ notes: one faucet switching every message into Q sink queues.
"""

from __future__ import annotations

import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from brokermgr import Broker, open_universe
from brokermgr.tracking import DEFAULT_TRACK_PORT, TrackNode
from channels import DEFAULT_MAX_MESSAGE_SIZE, AsyncMessageQueue
from mq import MqClient, MqServer
from pump import RdvpumpError

KINDS = ("echo", "stream", "fanout", "mq")
_UNIVERSE_KEYS = {"name", "ring_capacity", "seed", "token"}
_BROKER_KEYS = {"id"}
_WORKLOAD_KEYS = {"kind", "from", "to", "port", "messages", "size"}


class UniverseFileError(RdvpumpError, ValueError):
    """A universe file that cannot be used, with the file and the field in the message."""


@dataclass(frozen=True)
class WorkloadSpec:
    kind: str
    source: str
    targets: tuple[str, ...]
    port: int
    messages: int
    size: int

    @property
    def label(self) -> str:
        return f"{self.kind} {self.source}->{','.join(self.targets)}:{self.port}"


@dataclass(frozen=True)
class UniverseSpec:
    name: str
    brokers: tuple[str, ...]
    workloads: tuple[WorkloadSpec, ...]
    ring_capacity: int = 1 << 16
    seed: int = 0
    token: str = ""

    def roles(self, broker_id: str) -> tuple[list[tuple[str, int]], list[WorkloadSpec]]:
        """What ``broker_id`` serves (kind, port) and which workloads it drives."""
        serves = sorted({(w.kind if w.kind in ("echo", "mq") else "sink", w.port)
                         for w in self.workloads if broker_id in w.targets})
        drives = [w for w in self.workloads if w.source == broker_id]
        return serves, drives


def _check_keys(where: str, table: dict[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise UniverseFileError(f"{where}: unknown field {unknown[0]!r} "
                                f"(allowed: {', '.join(sorted(allowed))})")


def _int(where: str, table: dict[str, Any], key: str, default: int | None, low: int) -> int:
    value = table.get(key, default)
    if value is None:
        raise UniverseFileError(f"{where}: missing field {key!r}")
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise UniverseFileError(f"{where}: {key} must be an integer >= {low}, got {value!r}")
    return value


def load_universe(path: str | Path) -> UniverseSpec:
    """Read and check a universe file; every problem names the file and the field."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise UniverseFileError(f"{path}: no such file") from None
    except tomllib.TOMLDecodeError as exc:
        raise UniverseFileError(f"{path}: not valid TOML: {exc}") from None
    _check_keys(str(path), data, {"universe", "broker", "workload"})
    uni = data.get("universe", {})
    _check_keys(f"{path} [universe]", uni, _UNIVERSE_KEYS)
    name = uni.get("name")
    if not isinstance(name, str) or not name:
        raise UniverseFileError(f"{path} [universe]: name must be a non-empty string")
    brokers: list[str] = []
    for i, b in enumerate(data.get("broker", [])):
        where = f"{path} [[broker]] #{i + 1}"
        _check_keys(where, b, _BROKER_KEYS)
        if not isinstance(b.get("id"), str) or not b["id"] or b["id"].startswith("@"):
            raise UniverseFileError(f"{where}: id must be a non-empty string not starting "
                                    "with '@'")
        if b["id"] in brokers:
            raise UniverseFileError(f"{where}: duplicate broker id {b['id']!r}")
        brokers.append(b["id"])
    workloads: list[WorkloadSpec] = []
    for i, w in enumerate(data.get("workload", [])):
        where = f"{path} [[workload]] #{i + 1}"
        _check_keys(where, w, _WORKLOAD_KEYS)
        kind = w.get("kind")
        if kind not in KINDS:
            raise UniverseFileError(f"{where}: kind must be one of {', '.join(KINDS)}, "
                                    f"got {kind!r}")
        source, targets = w.get("from"), w.get("to")
        if isinstance(targets, str):
            targets = [targets]
        if not isinstance(targets, list) or not targets or not all(
                isinstance(t, str) for t in targets):
            raise UniverseFileError(f"{where}: to must be a broker id or a list of them")
        if kind == "mq" and "port" not in w:
            w = {**w, "port": DEFAULT_TRACK_PORT}
        if kind != "fanout" and len(targets) != 1:
            raise UniverseFileError(f"{where}: {kind} goes to exactly one broker")
        for who in [source, *targets]:
            if who not in brokers:
                raise UniverseFileError(f"{where}: unknown broker {who!r}")
        workloads.append(WorkloadSpec(
            kind, str(source), tuple(targets), _int(where, w, "port", 80, 0),
            _int(where, w, "messages", None, 1), _int(where, w, "size", None, 0)))
    if not brokers:
        raise UniverseFileError(f"{path}: a universe needs at least one [[broker]]")
    _check_runnable(path, workloads)
    ring = _int(f"{path} [universe]", uni, "ring_capacity", 1 << 16, 1)
    if ring & (ring - 1):
        raise UniverseFileError(f"{path} [universe]: ring_capacity must be a power of two")
    return UniverseSpec(name, tuple(brokers), tuple(workloads), ring,
                        _int(f"{path} [universe]", uni, "seed", 0, 0), str(uni.get("token", "")))


def _check_runnable(path: Path, workloads: list[WorkloadSpec]) -> None:
    """What would fail once running, said before anything starts (the same for
    ``universe run`` and ``universe up``): messages over the queue's maximum size, and
    one port of a broker serving two kinds of workload."""
    serving: dict[tuple[str, int], tuple[str, int]] = {}
    for i, w in enumerate(workloads):
        where = f"{path} [[workload]] #{i + 1}"
        if w.size > DEFAULT_MAX_MESSAGE_SIZE:
            raise UniverseFileError(f"{where}: size {w.size} exceeds the largest message, "
                                    f"{DEFAULT_MAX_MESSAGE_SIZE} bytes")
        role = w.kind if w.kind in ("echo", "mq") else "sink"
        for target in w.targets:
            other = serving.setdefault((target, w.port), (role, i))
            if other[0] != role:
                raise UniverseFileError(
                    f"{where}: {target}:{w.port} already serves {other[0]} for workload "
                    f"#{other[1] + 1}; a port serves one kind: give this one another port")


@dataclass
class Stats:
    """Counters of one broker's workloads, read by the live table."""

    links: int = 0
    messages: int = 0
    bytes: int = 0
    errors: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"links": self.links, "messages": self.messages, "bytes": self.bytes,
                "errors": self.errors}


@dataclass
class WorkloadReport:
    label: str
    messages: int
    bytes: int
    seconds: float
    verified: bool

    @property
    def msgs_per_s(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"workload": self.label, "messages": self.messages, "bytes": self.bytes,
                "seconds": round(self.seconds, 4), "verified": self.verified}


async def serve_role(broker: Broker, kind: str, port: int, stats: Stats, *,
                     task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Echo every message back, count them (a sink), or run a memory-only MQ server
    (``mq``), on ``port`` until cancelled."""
    if kind == "mq":
        node = TrackNode(broker, role="server", port=port)
        server = MqServer(node, None)
        try:
            task_status.started()
            await trio.sleep_forever()
        finally:
            stats.messages += server.counts["stored"]
            server.close()
            node.close()

    async def handle(queue: AsyncMessageQueue) -> None:
        stats.links += 1
        try:
            async for message in queue:
                stats.messages += 1
                stats.bytes += len(message)
                if kind == "echo":
                    await queue.send(message)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            stats.errors.append(f"{queue.remote_id}: {exc}")

    await broker.serve_queues(port, handle, task_status=task_status)


async def drive(broker: Broker, w: WorkloadSpec, stats: Stats) -> WorkloadReport:
    """Play one workload from ``broker``; every echo is compared, every sink send counted,
    every message through an MQ server consumed, compared and acknowledged."""
    rng = broker.pump.random
    if w.kind == "mq":
        return await _drive_mq(broker, w, stats, rng)
    queues = [await broker.connect_queue(t, w.port) for t in w.targets]
    stats.links += len(queues)
    payloads = [rng.randbytes(w.size) for _ in range(min(w.messages, 16))]
    verified = True
    start = time.perf_counter()
    if w.kind == "echo":
        (q,) = queues

        async def send_all() -> None:
            for i in range(w.messages):
                await q.send(payloads[i % len(payloads)])

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send_all)
            for i in range(w.messages):
                got = await q.receive()
                verified &= got == payloads[i % len(payloads)]
                stats.messages += 1
                stats.bytes += len(got)
    else:
        for i in range(w.messages):
            message = payloads[i % len(payloads)]
            for q in queues:
                await q.send(message)
                stats.messages += 1
                stats.bytes += len(message)
    for q in queues:
        await q.aclose()  # flushes: every message is in the link before it ends
    seconds = time.perf_counter() - start
    switched = w.messages * len(queues)
    return WorkloadReport(w.label, switched, switched * w.size, seconds, verified)


async def _drive_mq(broker: Broker, w: WorkloadSpec, stats: Stats, rng: Any
                    ) -> WorkloadReport:
    """Publish ``messages`` to the server's topic ``workload.<source>`` in batches and
    consume them back through it, each compared with what was sent, then acknowledged."""
    (target,) = w.targets
    payloads = [rng.randbytes(w.size) for _ in range(min(w.messages, 16))]
    client = MqClient(broker, f"{target}:{w.port}")
    topic = f"workload.{w.source}"
    verified = True
    try:
        await client.connected()
        await client.declare(topic, flags=["memory"])
        subscription = await client.subscribe(topic, window=1000)
        stats.links += 1
        start = time.perf_counter()
        batch = max(1, min(200, (256 << 10) // max(w.size, 1)))

        async def publish_all() -> None:
            for first in range(0, w.messages, batch):
                n = min(batch, w.messages - first)
                await client.publish_many(
                    topic, [payloads[(first + i) % len(payloads)] for i in range(n)])

        got = 0
        async with trio.open_nursery() as nursery:
            nursery.start_soon(publish_all)
            while got < w.messages:
                messages = await subscription.receive_many()
                for m in messages:
                    verified &= m.body == payloads[m.offset % len(payloads)]
                got += len(messages)
                stats.messages += len(messages)
                stats.bytes += sum(len(m.body) for m in messages)
                await subscription.ack([m.offset for m in messages])
        seconds = time.perf_counter() - start
    finally:
        client.close()
    return WorkloadReport(w.label, w.messages, w.messages * w.size, seconds,
                          verified and got == w.messages)


async def run_in_process(spec: UniverseSpec, *, trace: Any = None, trace_dir: str | None = None,
                         trace_format: str = "jsonl", run: str | None = None
                         ) -> list[WorkloadReport]:
    """Every broker of ``spec`` on one pump in this process; run its workloads to the end.

    With ``trace_dir`` the pump writes its trace there (see :func:`open_universe`).
    """
    reports: list[WorkloadReport] = []
    async with open_universe(spec.name, seed=spec.seed, trace=trace, trace_dir=trace_dir,
                             trace_format=trace_format, run=run,
                             ring_capacity=spec.ring_capacity) as universe:
        brokers = {b: universe.add_broker(b) for b in spec.brokers}
        stats = {b: Stats() for b in spec.brokers}
        async with trio.open_nursery() as servers:
            for b in spec.brokers:
                for kind, port in spec.roles(b)[0]:
                    await servers.start(serve_role, brokers[b], kind, port, stats[b])

            async def play(w: WorkloadSpec) -> None:
                reports.append(await drive(brokers[w.source], w, stats[w.source]))

            async with trio.open_nursery() as clients:
                for w in spec.workloads:
                    clients.start_soon(play, w)
            # One-way workloads are verified at the sinks: every message must arrive.
            expected = sink_expectations(spec)
            with trio.move_on_after(60):
                while any(stats[b].messages < n for b, n in expected.items()):
                    await trio.sleep(0.001)
            arrived = all(stats[b].messages >= n for b, n in expected.items())
            for r in reports:
                if r.label.startswith(("stream", "fanout")):
                    r.verified = arrived
            servers.cancel_scope.cancel()
    order = {w.label: i for i, w in enumerate(spec.workloads)}
    return sorted(reports, key=lambda r: order[r.label])


def sink_expectations(spec: UniverseSpec) -> dict[str, int]:
    """Messages each sink broker must count for the one-way workloads to be complete."""
    expected: dict[str, int] = {}
    for w in spec.workloads:
        if w.kind in ("stream", "fanout"):  # echo and mq are checked where they start
            for t in w.targets:
                expected[t] = expected.get(t, 0) + w.messages
    return expected
