"""Testing your brokers: a client and an echo server, cut apart by a partition.

Run it with ``pytest examples/test_partition.py``; ``--sim-seed N`` runs it with
another seed, and a failing test says which seed to replay.
"""

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from brokermgr import echo  # sends every message back until the link ends
from channels import AsyncMessageQueue
from rdvpump.testing import Faults, open_simulation


@asynccontextmanager
async def echo_link(faults: Faults) -> AsyncIterator[AsyncMessageQueue]:
    """A "client" broker's link to an echo server on broker "server", port 80."""
    server = faults.universe.add_broker("server")
    client = faults.universe.add_broker("client")
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve_queues, 80, echo)
        yield await client.connect_queue("server", 80)
        nursery.cancel_scope.cancel()


def test_a_short_partition_delays_but_loses_nothing(
        simulate: Callable[..., Any], sim_seed: int) -> None:
    async def main() -> tuple[list[bytes], float]:
        async with open_simulation(seed=sim_seed) as faults, echo_link(faults) as queue:
            faults.partition("client", "server")
            faults.pump.call_later(2.0, faults.heal, "client", "server")
            start = trio.current_time()
            for i in range(100):
                await queue.send(b"message %d" % i)
            replies = [await queue.receive() for _ in range(100)]
            return replies, trio.current_time() - start

    replies, took = simulate(main)
    assert replies == [b"message %d" % i for i in range(100)]
    assert took == pytest.approx(2.0)  # the partition's two seconds, on the virtual clock


def test_a_long_partition_closes_the_link_with_a_reason(
        simulate: Callable[..., Any], sim_seed: int) -> None:
    async def main() -> str | None:
        async with open_simulation(seed=sim_seed, partition_timeout=5) as faults, \
                echo_link(faults) as queue:
            faults.partition("client", "server")
            with pytest.raises(trio.BrokenResourceError):
                await queue.receive()
            return queue.close_reason

    assert simulate(main) == "partitioned"
