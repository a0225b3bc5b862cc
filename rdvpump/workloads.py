"""The workloads a universe file names, played: echo, stream, fanout and mq.

A workload is played by brokers through the async API, so the same code runs
a universe in one process (``universe run``) or one process per broker
(``universe up``).  ``fanout`` is the "internal switching rate" test of the
OpenAMQ's clustering design: one faucet switching every message into Q sink queues.
The files themselves are read by :mod:`rdvpump.universe_file`.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import trio

from brokermgr import Broker, open_universe
from channels import AsyncMessageQueue, Batch
from pump import RdvpumpError

from ._errors import first_leaf
from .testing import Faults, SimulationError
from .universe_file import FaultSpec, UniverseSpec, WorkloadSpec

if TYPE_CHECKING:  # loaded by the roles that run one
    from mq import MqServer

#: The most (virtual) seconds a universe run may take before it is stopped and says so.
RUN_LIMIT = 600.0

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
    #: Why the workload did not complete (a link lost, a connect refused, ...).
    error: str | None = None

    @property
    def msgs_per_s(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        found = {"workload": self.label, "messages": self.messages, "bytes": self.bytes,
                 "seconds": round(self.seconds, 4), "verified": self.verified}
        if self.error is not None:
            found["error"] = self.error
        return found


def payloads(spec: UniverseSpec, w: WorkloadSpec) -> list[bytes]:
    """The messages workload ``w`` sends in turn: a function of the file's seed and the
    workload, so that a sink, in this process or another, compares every byte."""
    rng = random.Random(f"rdvpump payloads {spec.seed} {w.label}")
    return [rng.randbytes(w.size) for _ in range(min(w.messages, 16))]


def sink_payloads(spec: UniverseSpec, broker_id: str) -> dict[tuple[str, int], list[bytes]]:
    """What the sinks of ``broker_id`` expect, by (sending broker, port): each message in
    order.  Where two one-way workloads share a sender and a port, they are counted only."""
    found: dict[tuple[str, int], list[bytes]] = {}
    shared: set[tuple[str, int]] = set()
    for w in spec.workloads:
        if w.kind in ("stream", "fanout") and broker_id in w.targets:
            key = (w.source, w.port)
            if key in found:
                shared.add(key)
            found[key] = payloads(spec, w)
    return {k: v for k, v in found.items() if k not in shared}


_LINK_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError, trio.EndOfChannel,
                RdvpumpError)
#: Messages a workload sends or takes in one call of the async face's batch methods.
BATCH = 1024


class _Cycle:
    """A workload's payloads repeated, so that a batch of messages ``first..`` compares
    with one list comparison (in C) instead of one per message."""

    def __init__(self, payloads: list[bytes]) -> None:
        self.k = len(payloads)
        self.ring = payloads * ((BATCH + self.k - 1) // self.k + 1)
        sizes = set(map(len, payloads))
        #: The payloads' one size (a batch that matches has len(batch) * size bytes).
        self.size = sizes.pop() if len(sizes) == 1 else None

    def slice(self, first: int, n: int) -> list[bytes]:
        start = first % self.k
        return self.ring[start:start + n]

    def matches(self, batch: list[bytes], first: int) -> bool:
        return batch == self.slice(first, len(batch))


async def serve_role(broker: Broker, kind: str, port: int, stats: Stats,
                     expected: dict[tuple[str, int], list[bytes]] | None = None, *,
                     watch: Callable[[MqServer], None] | None = None,
                     task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Echo every message back, count and compare them (a sink: ``expected`` holds what
    each sender sends, in order), or run a memory-only MQ server (``mq``), on ``port``
    until cancelled.  ``watch`` is given the MQ server (the process's metrics)."""
    if kind == "mq":  # loaded here: brokers of the other roles start without the MQ
        from brokermgr.tracking import TrackNode
        from mq import MqServer

        node = TrackNode(broker, role="server", port=port)
        server = MqServer(node, None)
        if watch is not None:
            watch(server)
        try:
            task_status.started()
            await trio.sleep_forever()
        finally:
            stats.messages += server.counts["stored"]
            server.close()
            node.close()

    async def handle(queue: AsyncMessageQueue) -> None:
        stats.links += 1
        expect = (expected or {}).get((queue.remote_id, port)) if kind == "sink" else None
        cycle = _Cycle(expect) if expect else None
        n = 0
        try:
            while True:  # a batch at a time: the fast path of the async face
                try:
                    batch = await queue.receive_many(BATCH)
                except trio.EndOfChannel:
                    break
                if cycle is not None and not cycle.matches(batch, n):
                    stats.errors.append(f"a message among {n + 1}..{n + len(batch)} from "
                                        f"{queue.remote_id} on port {port} is not the one sent")
                    cycle = None
                n += len(batch)
                stats.messages += len(batch)
                if cycle is not None and cycle.size is not None:  # matched: sizes known
                    stats.bytes += len(batch) * cycle.size
                else:
                    stats.bytes += sum(map(len, batch))
                if kind == "echo":
                    await queue.send_many(batch)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            stats.errors.append(f"{queue.remote_id}: {exc}")

    await broker.serve_queues(port, handle, task_status=task_status)


async def drive(broker: Broker, w: WorkloadSpec, stats: Stats,
                messages: list[bytes]) -> WorkloadReport:
    """Play one workload from ``broker`` with ``messages`` (:func:`payloads`); every echo
    is compared, every sink send counted, every message through an MQ server consumed,
    compared and acknowledged.  A link that breaks ends the workload with the reason."""
    done = [0]
    start = trio.current_time()
    try:
        if w.kind == "mq":
            return await _drive_mq(broker, w, stats, messages, done)
        return await _drive_links(broker, w, stats, messages, done)
    except _LINK_ERRORS as exc:
        error: BaseException = exc
    except BaseExceptionGroup as group:  # from the nursery of an echo
        found, rest = group.split(_LINK_ERRORS)
        if found is None or rest is not None:
            raise
        error = first_leaf(found)
    return WorkloadReport(w.label, done[0], done[0] * w.size, trio.current_time() - start,
                          False, str(error) or repr(error))


async def _drive_links(broker: Broker, w: WorkloadSpec, stats: Stats, payload: list[bytes],
                       done: list[int]) -> WorkloadReport:
    queues = [await broker.connect_queue(t, w.port) for t in w.targets]
    stats.links += len(queues)
    verified = True
    cycle = _Cycle(payload)
    start = trio.current_time()
    if w.kind == "echo":
        (q,) = queues

        async def send_all() -> None:
            for first in range(0, w.messages, BATCH):
                await q.send_many(cycle.slice(first, min(BATCH, w.messages - first)))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send_all)
            while done[0] < w.messages:
                got = await q.receive_many(min(BATCH, w.messages - done[0]))
                verified &= cycle.matches(got, done[0])
                done[0] += len(got)
                stats.messages += len(got)
                stats.bytes += sum(map(len, got))
    else:
        for first in range(0, w.messages, BATCH):
            chunk = cycle.slice(first, min(BATCH, w.messages - first))
            # to several sinks, the chunk is joined once and copied from there into each link
            out: list[bytes] | Batch = Batch(chunk) if len(queues) > 1 else chunk
            for q in queues:
                await q.send_many(out)
                done[0] += len(chunk)
                stats.messages += len(chunk)
                stats.bytes += len(chunk) * w.size
    for q in queues:
        await q.aclose()  # flushes: every message is in the link before it ends
    seconds = trio.current_time() - start
    switched = w.messages * len(queues)
    return WorkloadReport(w.label, switched, switched * w.size, seconds, verified,
                          None if verified else "an echoed message differs from the one sent")


async def _drive_mq(broker: Broker, w: WorkloadSpec, stats: Stats, payload: list[bytes],
                    done: list[int]) -> WorkloadReport:
    """Publish ``messages`` to the server's topic ``workload.<source>`` in batches and
    consume them back through it, each compared with what was sent, then acknowledged."""
    from mq import MqClient

    (target,) = w.targets
    client = MqClient(broker, f"{target}:{w.port}")
    topic = f"workload.{w.source}"
    verified = True
    try:
        await client.connected()
        await client.declare(topic, flags=["memory"])
        subscription = await client.subscribe(topic, window=1000)
        stats.links += 1
        start = trio.current_time()
        batch = max(1, min(200, (256 << 10) // max(w.size, 1)))

        async def publish_all() -> None:
            for first in range(0, w.messages, batch):
                n = min(batch, w.messages - first)
                await client.publish_many(
                    topic, [payload[(first + i) % len(payload)] for i in range(n)])

        async with trio.open_nursery() as nursery:
            nursery.start_soon(publish_all)
            while done[0] < w.messages:
                messages = await subscription.receive_many()
                for m in messages:
                    verified &= m.body == payload[m.offset % len(payload)]
                done[0] += len(messages)
                stats.messages += len(messages)
                stats.bytes += sum(len(m.body) for m in messages)
                await subscription.ack([m.offset for m in messages])
        seconds = trio.current_time() - start
        await client.aclose()  # the last acks leave before the link ends
    finally:
        if not client.link.closing:  # failed or cancelled: no waiting
            client.close()
    ok = verified and done[0] == w.messages
    return WorkloadReport(w.label, w.messages, w.messages * w.size, seconds, ok,
                          None if ok else "a consumed message differs from the one published")


@dataclass
class RunResult:
    """What :func:`run_universe` found: one report per workload (in file order), and
    notes on faults that could not be applied when their time came."""

    reports: list[WorkloadReport]
    notes: list[str] = field(default_factory=list)

    @property
    def verified(self) -> bool:
        return all(r.verified for r in self.reports)


async def run_universe(spec: UniverseSpec, *, trace: Any = None, trace_dir: str | None = None,
                       trace_format: str = "jsonl", run: str | None = None,
                       faults: tuple[FaultSpec, ...] | None = None,
                       limit: float = RUN_LIMIT) -> RunResult:
    """Every broker of ``spec`` on one pump in this process; run its workloads to the end.

    ``faults`` (default: :meth:`UniverseSpec.all_faults`) are applied at their pump times
    through :class:`rdvpump.testing.Faults`; with none, links are not relayed.  A run that
    takes longer than ``limit`` seconds (of the clock it runs on) is stopped, and the
    unfinished workloads say so.  With ``trace_dir`` the pump writes its trace there
    (see :func:`open_universe`).
    """
    faults = spec.all_faults() if faults is None else faults
    done: dict[str, WorkloadReport] = {}
    notes: list[str] = []
    async with open_universe(spec.name, seed=spec.seed, trace=trace, trace_dir=trace_dir,
                             trace_format=trace_format, run=run,
                             ring_capacity=spec.ring_capacity) as universe:
        sim = Faults(universe) if faults else None
        brokers = {b: universe.add_broker(b) for b in spec.brokers}
        stats = {b: Stats() for b in spec.brokers}
        start = trio.current_time()
        async with trio.open_nursery() as servers:
            scopes: dict[str, trio.CancelScope] = {}

            async def serve_broker(broker: Broker, *, task_status: trio.TaskStatus[None]
                                   = trio.TASK_STATUS_IGNORED) -> None:
                with trio.CancelScope() as scopes[broker.id]:
                    async with trio.open_nursery() as roles:
                        for kind, port in spec.roles(broker.id)[0]:
                            await roles.start(serve_role, broker, kind, port,
                                              stats[broker.id], sink_payloads(spec, broker.id))
                        task_status.started()

            for b in spec.brokers:
                await servers.start(serve_broker, brokers[b])
            if sim is not None:
                sim.on_crash.append(lambda b: scopes[b].cancel())
                sim.on_restart.append(lambda broker: servers.start_soon(serve_broker, broker))
                for f in faults:
                    universe.pump.call_at(f.at, _apply, sim, f, notes, kind="fault")

            async def play(w: WorkloadSpec) -> None:
                done[w.label] = await drive(brokers[w.source], w, stats[w.source],
                                            payloads(spec, w))

            # One-way workloads are checked at the sinks: every message, in order.
            expected = sink_expectations(spec)
            with trio.move_on_at(start + limit):
                async with trio.open_nursery() as clients:
                    for w in spec.workloads:
                        clients.start_soon(play, w)
                while any(stats[b].messages < n and not stats[b].errors
                          for b, n in expected.items()):
                    await trio.sleep(0.01)
            servers.cancel_scope.cancel()
    return RunResult([_report(w, done.get(w.label), stats, expected, limit)
                      for w in spec.workloads], notes)


def _apply(sim: Faults, f: FaultSpec, notes: list[str]) -> None:
    """A fault at its time; one that cannot apply (a broker already down) is a note."""
    try:
        sim.apply(f.action, **f.kwargs())
    except SimulationError as exc:
        notes.append(f"fault at {f.label}: {exc}")


def _report(w: WorkloadSpec, report: WorkloadReport | None, stats: dict[str, Stats],
            expected: dict[str, int], limit: float) -> WorkloadReport:
    """A workload's report, its sinks checked; one that did not finish says so."""
    if report is None:
        return WorkloadReport(w.label, 0, 0, limit, False,
                              f"did not finish within {limit:g} s")
    if report.verified and w.kind in ("stream", "fanout"):
        _check_sinks(report, w, stats, expected)
    return report


def _check_sinks(report: WorkloadReport, w: WorkloadSpec, stats: dict[str, Stats],
                 expected: dict[str, int]) -> None:
    for t in w.targets:
        if stats[t].errors:
            report.verified, report.error = False, f"at {t}: {stats[t].errors[0]}"
            return
        if stats[t].messages < expected[t]:
            report.verified = False
            report.error = f"{t} received {stats[t].messages} of {expected[t]} messages"
            return


async def run_in_process(spec: UniverseSpec, *, trace: Any = None, trace_dir: str | None = None,
                         trace_format: str = "jsonl", run: str | None = None
                         ) -> list[WorkloadReport]:
    """:func:`run_universe`'s reports (the file's faults applied)."""
    result = await run_universe(spec, trace=trace, trace_dir=trace_dir,
                                trace_format=trace_format, run=run)
    return result.reports


def sink_expectations(spec: UniverseSpec) -> dict[str, int]:
    """Messages each sink broker must count for the one-way workloads to be complete."""
    expected: dict[str, int] = {}
    for w in spec.workloads:
        if w.kind in ("stream", "fanout"):  # echo and mq are checked where they start
            for t in w.targets:
                expected[t] = expected.get(t, 0) + w.messages
    return expected
