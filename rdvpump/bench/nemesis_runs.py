"""rdvpump bench nemesis: Jepsen-style runs of a ``sync`` replicated group on real network
namespaces, each a schedule of faults drawn from a seed, checked by the history checker.

Every process on a host of its own (:mod:`rdvpump.nemesis`, an impairable network): a
name service, three ``broker run --role server --group a --replication sync`` members
with every other setting at its default, a producer and a consumer
(:mod:`._history_client`) that follow the master the name service names.  Each run
plays a schedule drawn from its seed over the members' hosts (a host cut off, a
minority split away, a bridge, a host paused or crashed and restarted, every frame
delayed, reordered, lost and duplicated), each fault healed at its end; then the
producer stops, the consumer drains, and :func:`mq.check_history` reads the whole
history: no acknowledged message lost, no two masters acknowledging in one epoch, none
stored twice, none out of order, no offset delivered with two messages.

The figures of each run: its availability (the share of the faults' time, in slots of
0.1 s, in which a publish was acknowledged; and the publishes acknowledged over those
attempted while a fault lasts), the longest time without an acknowledged publish, the
time from the last heal to the next acknowledged publish, and the deliveries that were
redeliveries (a consumer that moves to a new master gets again what its group had not
acknowledged there).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import trio

from mq import check_history
from mq._history import Acked, Consumed, Operation, Published

from .._errors import RunError
from ..nemesis import ACTIONS, IMPAIR, Fault, Network, schedule, unavailable

UNIVERSE = "bench-nemesis"
RDVPUMP = [sys.executable, "-m", "rdvpump"]
CLIENT = [sys.executable, "-m", "rdvpump.bench._history_client"]
MEMBERS = ("s0", "s1", "s2")
#: Seconds a run may take to start, to recover after its schedule, and to drain.
DEADLINE = 60.0
#: The availability during faults is the share of the faults' time slots this long in
#: which a publish was acknowledged.
SLOT = 0.1


@dataclass
class RunResult:
    """One schedule's run."""

    seed: int
    faults: list[str]
    attempted: int = 0
    acknowledged: int = 0
    attempted_in_faults: int = 0
    acknowledged_in_faults: int = 0
    available: float = 0.0
    longest_unavailable_s: float = 0.0
    recover_s: float | None = None
    deliveries: int = 0
    redeliveries: int = 0
    findings: dict[str, int] = field(default_factory=dict)
    detail: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.detail and self.recover_s is not None

    def to_dict(self) -> dict[str, Any]:
        return {"case": "nemesis-sync-group", "seed": self.seed, "faults": self.faults,
                "ok": self.ok, "attempted": self.attempted,
                "acknowledged": self.acknowledged,
                "availability": round(self.available, 4),
                "acknowledged_over_attempted_in_faults": round(
                    self.acknowledged_in_faults / max(self.attempted_in_faults, 1), 4),
                "longest_unavailable_s": round(self.longest_unavailable_s, 3),
                "recover_s": None if self.recover_s is None else round(self.recover_s, 3),
                "deliveries": self.deliveries, "redeliveries": self.redeliveries,
                "findings": self.findings, "detail": self.detail}


class _Client:
    """A history client's process: its operations, each with its time."""

    def __init__(self, proc: trio.Process) -> None:
        self.proc = proc
        self.rows: list[dict[str, Any]] = []
        self.done = trio.Event()
        self.changed = trio.Event()

    async def read(self) -> None:
        assert self.proc.stdout is not None
        buffer = b""
        while chunk := await self.proc.stdout.receive_some(65536):
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                row = json.loads(line)
                if row["op"] == "done":
                    self.done.set()
                else:
                    self.rows.append(row)
            self.changed.set()
            self.changed = trio.Event()
        self.done.set()

    async def stop(self) -> None:
        assert self.proc.stdin is not None
        await self.proc.stdin.send_all(b"stop\n")

    def acked(self, after: float = float("-inf")) -> list[dict[str, Any]]:
        return [r for r in self.rows if r["op"] == "publish" and r["status"] == "ok"
                and r["t"] > after]


def _operation(row: dict[str, Any]) -> Operation:
    kinds: dict[str, type[Published] | type[Consumed] | type[Acked]] = {
        "publish": Published, "consume": Consumed, "ack": Acked}
    return kinds[row["op"]](**{k: v for k, v in row.items() if k not in ("t", "error", "op")})


async def _until(event_of: Callable[[], bool], changed: Callable[[], trio.Event],
                 seconds: float) -> bool:
    with trio.move_on_after(seconds):
        while not event_of():
            await changed().wait()
        return True
    return False


#: The hosts of a run's network.
HOSTS = ("m", *MEMBERS, "p", "c")


async def run_one(seed: int, tmp: Path, *, faults: int = 3,
                  insync_lag: float | None = None) -> RunResult:
    """One schedule drawn from ``seed``, played against a fresh group on a network of its
    own."""
    with Network(HOSTS, impairable=True, seed=seed) as net:
        return await play(net, seed, tmp, faults=faults, insync_lag=insync_lag)


async def play(net: Network, seed: int, tmp: Path, *, faults: int = 3, within: float = 6.0,
               lasting: tuple[float, float] = (1.0, 3.0),
               insync_lag: float | None = None) -> RunResult:
    """One schedule drawn from ``seed`` against a fresh group on ``net`` (an impairable
    network of :data:`HOSTS`), its members at ``insync_lag`` (None: the default); every
    process it started killed and reaped at its end."""
    drawn = schedule(seed, MEMBERS, faults=faults, within=within, lasting=lasting,
                     actions=(*ACTIONS, IMPAIR))
    result = RunResult(seed, [f.label for f in drawn])
    try:
        lag = [] if insync_lag is None else ["--insync-lag", str(insync_lag)]
        await _play(net, drawn, tmp / f"run{seed}", result, lag)
    finally:
        await net.aclose()
    return result


async def _play(net: Network, drawn: list[Fault], tmp: Path, result: RunResult,
                extra: list[str]) -> None:
    manager = f"{net.hosts['m'].address}:9876"
    quiet = subprocess.DEVNULL
    await net.spawn("m", [*RDVPUMP, "manager", "serve", "--universe", UNIVERSE, "--listen",
                          manager], stdout=quiet, stderr=quiet)
    for i, name in enumerate(MEMBERS):
        await net.spawn(name, [
            *RDVPUMP, "broker", "run", "--id", name, "--universe", UNIVERSE, "--manager",
            manager, "--listen", f"{net.hosts[name].address}:0", "--role", "server",
            "--mq-dir", str(tmp), "--group", "a", "--group-id", str(i), "--replication",
            "sync", *extra], stdout=quiet, stderr=quiet)
    clients = {}
    async with trio.open_nursery() as nursery:
        for role, host in (("produce", "p"), ("consume", "c")):
            proc = await net.spawn(host, [*CLIENT, role, manager, UNIVERSE,
                                          net.hosts[host].address],
                                   stdin=subprocess.PIPE, stderr=subprocess.DEVNULL)
            clients[role] = client = _Client(proc)
            nursery.start_soon(client.read)
        producer, consumer = clients["produce"], clients["consume"]
        if not await _until(lambda: len(producer.acked()) >= 10, lambda: producer.changed,
                            DEADLINE):
            raise RunError(f"seed {result.seed}: the group acknowledged nothing in "
                           f"{DEADLINE:g} s")
        start = time.monotonic()  # the clients' clock (trio's has an offset of its own)
        spans = [(start + f.at, start + f.at + f.lasting) for f in drawn]
        await net.play(drawn)
        healed = time.monotonic()
        if await _until(lambda: bool(producer.acked(healed)), lambda: producer.changed,
                        DEADLINE):
            result.recover_s = producer.acked(healed)[0]["t"] - healed
        await producer.stop()
        with trio.move_on_after(DEADLINE):
            await producer.done.wait()
        wanted = {(r["producer"], r["sequence"]) for r in producer.acked()}

        def drained() -> bool:
            return wanted <= {(r["producer"], r["sequence"]) for r in consumer.rows
                              if r["op"] == "consume"}

        await _until(drained, lambda: consumer.changed, DEADLINE)
        await consumer.stop()
        nursery.cancel_scope.cancel()
    publishes = [r for r in producer.rows if r["op"] == "publish"]
    result.attempted = len(publishes)
    result.acknowledged = sum(r["status"] == "ok" for r in publishes)
    within = [r for r in publishes if any(a <= r["t"] <= b for a, b in spans)]
    result.attempted_in_faults = len(within)
    result.acknowledged_in_faults = sum(r["status"] == "ok" for r in within)
    times = [r["t"] for r in producer.acked()]
    slots = {int((t - start) / SLOT) for t in times}
    during = [i for a, b in spans for i in range(int((a - start) / SLOT),
                                                  int((b - start) / SLOT))]
    result.available = sum(i in slots for i in during) / max(len(during), 1)
    result.longest_unavailable_s = max((b - a for a, b in zip(times, times[1:],
                                                              strict=False)), default=0.0)
    report = check_history([_operation(r) for r in producer.rows + consumer.rows],
                           {"orders": ["orders"]})
    result.deliveries = report.counts.get("deliveries", 0)
    result.redeliveries = report.counts.get("redeliveries", 0)
    result.findings = {k: v for k, v in report.counts.items()
                       if v and k in ("lost", "stored twice", "out of order",
                                      "two histories", "delivered though refused",
                                      "two masters in one epoch")}
    result.detail = [f"{f.kind}: {f.detail}" for f in report.findings[:5]]
    if result.recover_s is None:
        result.detail.append(f"nothing acknowledged within {DEADLINE:g} s of the heal")


def run(seeds: list[int], *, faults: int = 3, insync_lag: float | None = None,
        progress: Callable[[str], None] = lambda _: None) -> list[RunResult]:
    """A run per seed, one after another."""
    why = unavailable(impairable=True)
    if why is not None:
        raise RunError(f"bench nemesis {why}")
    results = []
    with tempfile.TemporaryDirectory(prefix="rdvpump-nemesis-") as tmp:
        for i, seed in enumerate(seeds):
            progress(f"schedule {i + 1} of {len(seeds)} (seed {seed})")
            results.append(trio.run(partial(run_one, seed, Path(tmp), faults=faults,
                                            insync_lag=insync_lag)))
    return results


def summary(results: list[RunResult]) -> dict[str, Any]:
    """Every run's figures at once."""
    rows = [r.to_dict() for r in results]
    recover = sorted(r["recover_s"] for r in rows if r["recover_s"] is not None)
    available = sorted(r["availability"] for r in rows)

    def at(values: list[float], q: float) -> float | None:
        return values[min(len(values) - 1, int(q * len(values)))] if values else None

    return {"case": "nemesis-sync-group-summary", "schedules": len(rows),
            "failed": [r["seed"] for r in rows if not r["ok"]],
            "availability_p50": at(available, 0.5), "availability_min": at(available, 0),
            "recover_p50_s": at(recover, 0.5), "recover_p99_s": at(recover, 0.99),
            "recover_max_s": recover[-1] if recover else None,
            "longest_unavailable_max_s": max((r["longest_unavailable_s"] for r in rows),
                                             default=None),
            "redeliveries": sum(r["redeliveries"] for r in rows),
            "deliveries": sum(r["deliveries"] for r in rows),
            "findings": {k: sum(r["findings"].get(k, 0) for r in rows)
                         for k in sorted({k for r in rows for k in r["findings"]})}}
