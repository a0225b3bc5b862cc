"""The demo universe: an in-process echo run on the trio face, checked byte for byte.

Returns a summary; printing is the CLI's job.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import trio

from brokermgr import echo, open_universe
from channels import AsyncMessageQueue
from pump import ConfigError


@dataclass
class ClientReport:
    client: str
    links: int = 0
    messages: int = 0
    bytes: int = 0
    mismatches: int = 0


@dataclass
class DemoReport:
    universe: str
    seed: int
    ring_capacity: int
    clients: list[ClientReport] = field(default_factory=list)
    server_links: int = 0
    pump_steps: int = 0
    elapsed_s: float = 0.0

    @property
    def messages(self) -> int:
        return sum(c.messages for c in self.clients)

    @property
    def bytes(self) -> int:
        return sum(c.bytes for c in self.clients)

    @property
    def ok(self) -> bool:
        return all(c.mismatches == 0 for c in self.clients) and self.messages > 0


async def run_echo_demo(*, clients: int = 4, connects: int = 3, messages: int = 50,
                        max_size: int = 10 * 1024, ring_capacity: int = 1 << 16,
                        seed: int = 1, name: str = "demo") -> DemoReport:
    """Clients connect to "Server" port 80 again and again, send random messages, check echoes."""
    if min(clients, connects, messages, max_size) < 1:
        raise ConfigError("clients, connects, messages and max_size must all be at least 1")
    report = DemoReport(universe=name, seed=seed, ring_capacity=ring_capacity)
    start = time.perf_counter()
    async with open_universe(name, seed=seed, ring_capacity=ring_capacity) as universe:
        if max_size > universe.max_message_size:
            raise ConfigError(f"max_size {max_size:,} is above the largest message a link "
                              f"carries, {universe.max_message_size:,} bytes")
        server = universe.add_broker("Server")

        async def count_and_echo(queue: AsyncMessageQueue) -> None:
            report.server_links += 1
            await echo(queue)

        async def client(i: int) -> None:
            broker = universe.add_broker(f"client{i}")
            rep = ClientReport(broker.id)
            report.clients.append(rep)
            for c in range(connects):
                async with await broker.connect_queue("Server", 80) as queue:
                    rep.links += 1
                    # each link's messages from a source of its own, made as they go (and
                    # made again to check the echoes): the same bytes whatever order the
                    # clients run in, and no list of every message in memory
                    link_seed = f"{seed}/{i}/{c}"
                    async with trio.open_nursery() as nursery:

                        async def send_all(queue: AsyncMessageQueue = queue,
                                           link_seed: str = link_seed) -> None:
                            for m in _messages(link_seed, messages, max_size):
                                await queue.send(m)

                        nursery.start_soon(send_all)
                        for want in _messages(link_seed, messages, max_size):
                            got = await queue.receive()
                            rep.messages += 1
                            rep.bytes += len(got)
                            rep.mismatches += got != want

        async with trio.open_nursery() as servers:
            await servers.start(server.serve_queues, 80, count_and_echo)
            async with trio.open_nursery() as nursery:
                for i in range(clients):
                    nursery.start_soon(client, i)
            servers.cancel_scope.cancel()
        report.pump_steps = universe.pump.step_number
    report.clients.sort(key=lambda c: c.client)
    report.elapsed_s = time.perf_counter() - start
    return report


def _messages(link_seed: str, count: int, max_size: int) -> Iterator[bytes]:
    """A link's messages: ``count`` random ones of 1 to ``max_size`` bytes, the same for
    the same ``link_seed``."""
    rng = random.Random(link_seed)
    for _ in range(count):
        yield rng.randbytes(rng.randint(1, max_size))
