"""``rdvpump bench fanout``: OpenAMQ's internal switching rate, Q sinks per faucet.

One faucet broker switches every message into Q sink queues, all in one process
on one pump; a delivery is one message arriving at one sink, compared with what
was sent.  Three ways in the same run, for each Q:

- ``universe-workload``: ``rdvpump universe run``'s fanout workload on trio's
  real clock (the async face's batch calls, every byte compared at the sinks);
- ``listener``: the pump's listener API driven by the pump alone (``send_many``
  into each queue, sinks comparing each message as it arrives);
- against OpenAMQ's published upper figure of 25,000 messages per second per
  broker for its internal switching, a constant, and against the listener row.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from brokermgr import BrokerManager
from channels import MessageQueue, QueueFullError
from pump import Pump

from .._errors import RunError
from ..testing import run_simulation
from ..universe_file import UniverseSpec, WorkloadSpec
from ..workloads import run_universe

#: OpenAMQ's published switching rate per broker, upper end (messages per second).
SEED_RATE = 25_000.0
BATCH = 1024


@dataclass(frozen=True)
class FanoutResult:
    case: str
    sinks: int
    size: int
    messages: int
    seconds: float
    baseline: str
    baseline_deliveries_per_s: float

    @property
    def deliveries_per_s(self) -> float:
        return self.messages * self.sinks / self.seconds

    @property
    def ratio(self) -> float:
        return self.deliveries_per_s / self.baseline_deliveries_per_s

    def to_dict(self) -> dict[str, object]:
        return {"case": self.case, "sinks": self.sinks, "size": self.size,
                "messages": self.messages, "seconds": round(self.seconds, 4),
                "deliveries_per_s": round(self.deliveries_per_s, 1),
                "baseline": self.baseline,
                "baseline_deliveries_per_s": round(self.baseline_deliveries_per_s, 1),
                "ratio": round(self.ratio, 3)}


def workload(sinks: int, messages: int, size: int) -> float:
    """Seconds of the fanout workload of ``universe run --clock real``, checked."""
    targets = tuple(f"q{i}" for i in range(1, sinks + 1))
    spec = UniverseSpec("fanout", ("faucet", *targets),
                        (WorkloadSpec("fanout", "faucet", targets, 5672, messages, size),))
    result = run_simulation(run_universe, spec, clock="real")
    (report,) = result.reports
    if not report.verified:
        raise RunError(f"bench fanout: the workload failed: {report.error}")
    return report.seconds


class _Feed:
    """The faucet's end of one sink's link: batches of ``ring`` (the payloads in turn)
    until ``messages`` are queued."""

    def __init__(self, ring: list[bytes], messages: int, bad: list[str]) -> None:
        self.ring = ring
        self.messages = messages
        self.bad = bad
        self.sent = 0

    def connected(self, queue: MessageQueue) -> None:
        self.queue = queue
        queue.set_listener(self)
        self.drained()

    def refused(self, reason: str) -> None:
        self.bad.append(f"refused: {reason}")

    def drained(self) -> None:
        send_many, ring, messages = self.queue.send_many, self.ring, self.messages
        while self.sent < messages:
            n = min(BATCH, messages - self.sent)
            start = self.sent & 15
            try:
                done = send_many(ring[start:start + n])
            except QueueFullError:
                return
            self.sent += done
            if done < n:
                return
        self.queue.close()

    def received(self, message: bytes) -> None:
        pass

    def closed(self, reason: str) -> None:
        pass


def listener(sinks: int, messages: int, size: int) -> float:
    """Seconds for the listener API to switch ``messages`` into ``sinks`` queues, each
    delivery compared with the message sent."""
    pump = Pump(seed=1)
    universe = BrokerManager("fanout", pump=pump)
    faucet = universe.add_broker("faucet")
    payloads = [bytes([i]) * size for i in range(16)]
    ring = payloads * (BATCH // 16 + 2)
    got = [0] * sinks
    bad: list[str] = []

    class Sink:
        def __init__(self, i: int) -> None:
            self.i = i

        def accepted(self, queue: MessageQueue) -> None:
            queue.set_listener(self)

        def received(self, message: bytes) -> None:
            n = got[self.i]
            if message is not payloads[n & 15] and message != payloads[n & 15]:
                bad.append(f"sink {self.i}: message {n + 1} differs")
            got[self.i] = n + 1

        def closed(self, reason: str) -> None:
            pass

    for i in range(sinks):
        universe.add_broker(f"q{i}").bind(1, Sink(i))
    start = time.perf_counter()
    for i in range(sinks):
        faucet.connect(f"q{i}", 1, _Feed(ring, messages, bad))
    pump.run_until_idle()
    seconds = time.perf_counter() - start
    if bad or got != [messages] * sinks:
        raise RunError(f"bench fanout: {bad[0] if bad else f'delivered {got}'}")
    return seconds


def run(sinks: tuple[int, ...] = (1, 4, 16), *, messages: int = 100_000, size: int = 1000,
        repeat: int = 3, progress: Callable[[str], object] = lambda _: None
        ) -> Iterator[FanoutResult]:
    """For each Q: the workload and the listener API, best of ``repeat``, against the
    seed's figure and against the listener row."""
    seed = "openamq-25k-msg-s"
    for q in sinks:
        best: dict[str, float] = {}
        for r in range(repeat):
            for case, fn in (("universe-workload", workload), ("listener", listener)):
                progress(f"Q = {q}: {case} ({r + 1}/{repeat})")
                seconds = fn(q, messages, size)
                best[case] = min(best.get(case, seconds), seconds)
        listener_rate = messages * q / best["listener"]
        for case in ("universe-workload", "listener"):
            yield FanoutResult(case, q, size, messages, best[case], seed, SEED_RATE)
        yield FanoutResult("universe-workload", q, size, messages, best["universe-workload"],
                           "listener", listener_rate)
