"""rdvpump bench nemesis: Jepsen-style runs of a ``sync`` replicated group, or of a
cluster, on real network namespaces, each a schedule of faults drawn from a seed,
checked by the history checker.

Every process on a host of its own (:mod:`rdvpump.nemesis`, an impairable network): a
name service, and either three ``broker run --role server --group a --replication sync``
members or three primaries of a cluster (``broker run --cluster``, a shared topic), with
every other setting at its default; a producer and a consumer (:mod:`._history_client`)
that follow the master the name service names, or move to the cluster's next server
when one fails them.  Each run plays a schedule drawn from its seed over the servers'
hosts (a host cut off, a minority split away, a bridge, a host paused or crashed and
restarted, every frame delayed, reordered, lost and duplicated), each fault healed at
its end; then the producer stops, the consumer drains, and :func:`mq.check_history`
reads the whole history: no acknowledged message lost, no two masters (or roots)
acknowledging in one epoch, none stored twice, none out of order, no offset delivered
with two messages.  A cluster's servers' own logs are read too: no epoch in which two
servers became root.

The figures of each run: its availability (the share of the faults' time, in slots of
0.1 s, in which a publish was acknowledged; and the publishes acknowledged over those
attempted while a fault lasts), the longest time without an acknowledged publish, the
time from the last heal to the next acknowledged publish, and the deliveries that were
redeliveries (a consumer that moves to a new master gets again what its group had not
acknowledged there).
"""

from __future__ import annotations

import contextlib
import json
import re
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
#: A cluster's servers, its primaries in order of seniority.
PRIMARIES = ("a", "b", "c")
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
    #: ``sync-group`` or ``cluster``.
    kind: str = "sync-group"
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
    #: A cluster's: the epochs at which a server became root (each once, or a finding).
    root_epochs: int | None = None

    @property
    def ok(self) -> bool:
        return not self.detail and self.recover_s is not None

    def to_dict(self) -> dict[str, Any]:
        return {"case": f"nemesis-{self.kind}", "seed": self.seed, "faults": self.faults,
                "ok": self.ok, "attempted": self.attempted,
                "acknowledged": self.acknowledged,
                "availability": round(self.available, 4),
                "acknowledged_over_attempted_in_faults": round(
                    self.acknowledged_in_faults / max(self.attempted_in_faults, 1), 4),
                "longest_unavailable_s": round(self.longest_unavailable_s, 3),
                "recover_s": None if self.recover_s is None else round(self.recover_s, 3),
                "deliveries": self.deliveries, "redeliveries": self.redeliveries,
                "findings": self.findings, "detail": self.detail,
                **({} if self.root_epochs is None else {"root_epochs": self.root_epochs})}


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


#: The hosts of a run's network: a group's, a cluster's.
HOSTS = ("m", *MEMBERS, "p", "c")
CLUSTER_HOSTS = ("m", *PRIMARIES, "p", "q")
#: Where a cluster's servers listen.
CLUSTER_LISTEN = 9901


async def run_one(seed: int, tmp: Path, *, faults: int = 3,
                  insync_lag: float | None = None, cluster: bool = False) -> RunResult:
    """One schedule drawn from ``seed``, played against a fresh group (or cluster) on a
    network of its own."""
    with Network(CLUSTER_HOSTS if cluster else HOSTS, impairable=True, seed=seed) as net:
        if cluster:
            return await play_cluster(net, seed, tmp, faults=faults)
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
    tmp = tmp / f"run{seed}"
    try:
        lag = [] if insync_lag is None else ["--insync-lag", str(insync_lag)]
        manager = await _manager(net)
        for i, name in enumerate(MEMBERS):
            await net.spawn(name, [
                *RDVPUMP, "broker", "run", "--id", name, "--universe", UNIVERSE,
                "--manager", manager, "--listen", f"{net.hosts[name].address}:0", "--role",
                "server", "--mq-dir", str(tmp), "--group", "a", "--group-id", str(i),
                "--replication", "sync", *lag],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        await _exercise(net, drawn, result, manager, ("p", "c"), [])
    finally:
        await net.aclose()
    return result


async def play_cluster(net: Network, seed: int, tmp: Path, *, faults: int = 3,
                       within: float = 6.0, lasting: tuple[float, float] = (1.0, 3.0)
                       ) -> RunResult:
    """One schedule drawn from ``seed`` against a fresh cluster of three primaries on
    ``net`` (an impairable network of :data:`CLUSTER_HOSTS`), publishing to and
    consuming from a shared topic; its servers' logs read for the roots they became."""
    drawn = schedule(seed, PRIMARIES, faults=faults, within=within, lasting=lasting,
                     actions=(*ACTIONS, IMPAIR))
    result = RunResult(seed, [f.label for f in drawn], kind="cluster")
    tmp = tmp / f"cluster{seed}"
    tmp.mkdir(parents=True)
    shop = tmp / "shop.toml"
    shop.write_text('[cluster]\nname = "shop"\n' + "".join(
        f'[[server]]\nid = "{name}"\naddress = "{net.hosts[name].address}:'
        f'{CLUSTER_LISTEN}"\ntype = "primary"\n' for name in PRIMARIES))
    logs = {name: tmp / f"{name}.log" for name in PRIMARIES}
    with contextlib.ExitStack() as files:
        try:
            manager = await _manager(net)
            for name in PRIMARIES:
                log = files.enter_context(logs[name].open("ab"))  # open while the run
                # lasts: a process restarted writes to it too
                await net.spawn(name, [
                    *RDVPUMP, "broker", "run", "--id", name, "--universe", UNIVERSE,
                    "--manager", manager, "--cluster", str(shop), "--role", "server",
                    "--mq-dir", str(tmp / name)],
                    stdout=subprocess.DEVNULL, stderr=log.fileno())
            await _exercise(net, drawn, result, manager, ("p", "q"), list(PRIMARIES))
        finally:
            await net.aclose()
    became: dict[int, set[str]] = {}
    for log_path in logs.values():
        for found in re.finditer(r"cluster shop: (\w+) is root at epoch (\d+)",
                                 log_path.read_text(errors="replace")):
            became.setdefault(int(found[2]), set()).add(found[1])
    result.root_epochs = len(became)
    two = {epoch: sorted(roots) for epoch, roots in became.items() if len(roots) > 1}
    if two:
        result.findings["two roots in one epoch"] = len(two)
        result.detail += [f"two roots in one epoch: epoch {e}: {', '.join(r)}"
                          for e, r in sorted(two.items())]
    if not became:
        result.detail.append("no server's log says it became root")
    return result


async def _manager(net: Network) -> str:
    manager = f"{net.hosts['m'].address}:9876"
    await net.spawn("m", [*RDVPUMP, "manager", "serve", "--universe", UNIVERSE, "--listen",
                          manager], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return manager


async def _exercise(net: Network, drawn: list[Fault], result: RunResult, manager: str,
                    hosts: tuple[str, str], servers: list[str]) -> None:
    """A producer and a consumer on ``hosts`` (of a cluster's ``servers``, or following
    the group's master), the schedule ``drawn`` played, then the history checked."""
    clients = {}
    async with trio.open_nursery() as nursery:
        for role, host in zip(("produce", "consume"), hosts, strict=True):
            proc = await net.spawn(host, [*CLIENT, role, manager, UNIVERSE,
                                          net.hosts[host].address, ",".join(servers)],
                                   stdin=subprocess.PIPE, stderr=subprocess.DEVNULL)
            clients[role] = client = _Client(proc)
            nursery.start_soon(client.read)
        producer, consumer = clients["produce"], clients["consume"]
        if not await _until(lambda: len(producer.acked()) >= 10, lambda: producer.changed,
                            DEADLINE):  # a run that fails: said, and the next one plays
            result.detail.append(f"the {result.kind} acknowledged no ten publishes in "
                                 f"{DEADLINE:g} s from its start: no fault played")
            nursery.cancel_scope.cancel()
            return
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
    _measure(result, producer, consumer, start, spans)


def _measure(result: RunResult, producer: _Client, consumer: _Client, start: float,
             spans: list[tuple[float, float]]) -> None:
    """What the clients saw: publishes attempted and acknowledged (in the faults too),
    availability during the faults by :data:`SLOT`, the longest gap, and the history
    checked."""
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
        cluster: bool = False,
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
                                            insync_lag=insync_lag, cluster=cluster)))
    return results


def summary(results: list[RunResult]) -> dict[str, Any]:
    """Every run's figures at once."""
    rows = [r.to_dict() for r in results]
    recover = sorted(r["recover_s"] for r in rows if r["recover_s"] is not None)
    available = sorted(r["availability"] for r in rows)

    def at(values: list[float], q: float) -> float | None:
        return values[min(len(values) - 1, int(q * len(values)))] if values else None

    kind = results[0].kind if results else "sync-group"
    return {"case": f"nemesis-{kind}-summary", "schedules": len(rows),
            "failed": [r["seed"] for r in rows if not r["ok"]],
            "availability_p50": at(available, 0.5), "availability_min": at(available, 0),
            "recover_p50_s": at(recover, 0.5), "recover_p99_s": at(recover, 0.99),
            "recover_max_s": recover[-1] if recover else None,
            "longest_unavailable_max_s": max((r["longest_unavailable_s"] for r in rows),
                                             default=None),
            "redeliveries": sum(r["redeliveries"] for r in rows),
            "deliveries": sum(r["deliveries"] for r in rows),
            **({"root_epochs": sum(r.root_epochs or 0 for r in results)}
               if kind == "cluster" else {}),
            "findings": {k: sum(r["findings"].get(k, 0) for r in rows)
                         for k in sorted({k for r in rows for k in r["findings"]})}}
