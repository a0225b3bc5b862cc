"""rdvpump bench sim: what simulation on the virtual clock buys.

One workload, three ways in the same run: a universe of ``brokers`` brokers (a
fifth of them echo servers) and ``links`` links, each link sending a message
every ``interval`` seconds of pump time, with a random phase, for ``duration``
seconds; the servers echo, the clients compare every echo with what they sent.

- ``virtual clock (pump)``: the pump's own simulation (``run_until``), no trio;
- ``virtual clock (trio)``: the pump served by trio under
  :func:`rdvpump.testing.run_simulation` (mock clock, seeded scheduling), as
  ``universe run`` does;
- ``real clock (trio)``: the same pump served by trio on the real clock, the
  baseline: it takes ``duration`` seconds of wall time whatever the work.

Each reports pump steps and messages (sent plus echoed) per second of wall time.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import trio

from brokermgr import BrokerManager, EchoListener
from channels import MessageQueue, QueueFullError
from pump import Pump

from .._errors import RunError
from ..testing import run_simulation

MESSAGE = 64


@dataclass(frozen=True)
class SimResult:
    case: str
    brokers: int
    links: int
    simulated_seconds: float
    wall_seconds: float
    steps: int
    messages: int
    baseline: str
    baseline_msgs_per_s: float

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.wall_seconds

    @property
    def msgs_per_s(self) -> float:
        return self.messages / self.wall_seconds

    @property
    def ratio(self) -> float:
        return self.msgs_per_s / self.baseline_msgs_per_s if self.baseline_msgs_per_s else 0.0

    def to_dict(self) -> dict[str, object]:
        return {"case": self.case, "brokers": self.brokers, "links": self.links,
                "simulated_seconds": self.simulated_seconds,
                "wall_seconds": round(self.wall_seconds, 3), "steps": self.steps,
                "messages": self.messages, "steps_per_s": round(self.steps_per_s, 1),
                "msgs_per_s": round(self.msgs_per_s, 1), "baseline": self.baseline,
                "baseline_msgs_per_s": round(self.baseline_msgs_per_s, 1),
                "ratio": round(self.ratio, 3)}


class _Server:
    def accepted(self, queue: MessageQueue) -> None:
        queue.set_listener(EchoListener(queue))


class _Ticker:
    """A client's end of one link: a message every ``interval`` until ``end``; each echo
    compared with the message it answers."""

    def __init__(self, world: _World, n: int) -> None:
        self.world = world
        self.n = n
        self.sent: deque[bytes] = deque()
        self.count = 0

    def connected(self, queue: MessageQueue) -> None:
        self.queue = queue
        queue.set_listener(self)
        pump = self.world.pump
        pump.call_later(pump.random.random() * self.world.interval, self.tick)

    def refused(self, reason: str) -> None:
        self.world.errors.append(f"link {self.n} refused: {reason}")

    def tick(self) -> None:
        world = self.world
        if world.pump.now() >= world.end or self.queue.closed:
            return
        self.count += 1
        message = self.count.to_bytes(8, "big") * (MESSAGE // 8)
        try:
            self.queue.send(message)
        except QueueFullError:
            world.errors.append(f"link {self.n}: queue full")
            return
        self.sent.append(message)
        world.messages += 1
        world.pump.call_later(world.interval, self.tick)

    def received(self, message: bytes) -> None:
        if not self.sent or message != self.sent.popleft():
            self.world.errors.append(f"link {self.n}: an echo differs from what was sent")
        self.world.messages += 1

    def drained(self) -> None:
        pass

    def closed(self, reason: str) -> None:
        if self.world.pump.now() < self.world.end:
            self.world.errors.append(f"link {self.n} closed: {reason}")


class _World:
    def __init__(self, pump: Pump, brokers: int, links: int, interval: float,
                 duration: float) -> None:
        self.pump = pump
        self.interval = interval
        self.end = duration
        self.messages = 0
        self.errors: list[str] = []
        universe = BrokerManager("sim", pump=pump, ring_capacity=4096)
        n_servers = max(1, brokers // 5)
        servers = [universe.add_broker(f"s{i:03d}") for i in range(n_servers)]
        clients = [universe.add_broker(f"c{i:03d}") for i in range(brokers - n_servers)]
        for s in servers:
            s.listen(80, _Server())
        self.tickers = [_Ticker(self, n) for n in range(links)]
        for n, ticker in enumerate(self.tickers):
            clients[n % len(clients)].connect(servers[n % n_servers].id, 80, ticker)
        self.universe = universe

    def check(self) -> None:
        if self.errors:
            raise RunError(f"bench sim: {len(self.errors)} errors, the first: "
                               f"{self.errors[0]}")


def _on_pump(brokers: int, links: int, interval: float, duration: float
             ) -> tuple[float, int, int]:
    pump = Pump(seed=1)
    world = _World(pump, brokers, links, interval, duration)
    start = time.perf_counter()
    pump.run_until(duration + 1.0)  # a second more: the last echoes come home
    wall = time.perf_counter() - start
    world.check()
    return wall, pump.step_number, world.messages


def _served(brokers: int, links: int, interval: float, duration: float, clock: str
            ) -> tuple[float, int, int]:
    pump = Pump(seed=1)
    world = _World(pump, brokers, links, interval, duration)

    async def main() -> float:
        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            await nursery.start(pump.serve)
            await trio.sleep(duration + 1.0)
            nursery.cancel_scope.cancel()
        return time.perf_counter() - start

    wall = run_simulation(main, seed=1, clock=clock)
    world.check()
    return wall, pump.step_number, world.messages


def run(*, brokers: int = 100, links: int = 1000, interval: float = 0.1,
        duration: float = 5.0, progress: Callable[[str], object] = lambda _: None
        ) -> Iterator[SimResult]:
    """The real-clock baseline first, then the two virtual-clock runs beside it."""
    progress(f"real clock: {duration:g} s of {brokers} brokers and {links} links ...")
    real = _served(brokers, links, interval, duration, "real")
    progress("virtual clock, pump ...")
    pump = _on_pump(brokers, links, interval, duration)
    progress("virtual clock, trio ...")
    mock = _served(brokers, links, interval, duration, "virtual")
    baseline = "real clock (trio)"
    real_rate = real[2] / real[0]
    for case, (wall, steps, messages) in (("virtual clock (pump)", pump),
                                          ("virtual clock (trio)", mock),
                                          (baseline, real)):
        yield SimResult(case, brokers, links, duration + 1.0, wall, steps, messages, baseline,
                        real_rate)
