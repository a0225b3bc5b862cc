"""How long an MQ server's timer call stops its pump as its topics grow: TOPICS topics
declared on one server (on disk, ``interval:1``, one publish to every tenth), then the
server's tick called by hand 10 times in a row (a second's calls), five times: the
longest call and the sum of the ten, each the best of the five.
Each tick visits every topic (ack timeouts, positions to save), all in one call up to
1,000 topics and over ten calls beyond.  One process, in-memory links.

``python bench/tick_pause.py [TOPICS]`` (default 10,000).  Figures in bench/RESULTS.md.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import trio

from brokermgr import BrokerManager
from mq import MqClient
from rdvpump.bench.scale import mq_server


async def measure(topics: int, directory: Path) -> tuple[float, float]:
    """Seconds of the longest of ten calls of the tick, and of the ten, each the best
    of five."""
    universe = BrokerManager("tick-pause")
    async with trio.open_nursery() as nursery:
        await nursery.start(universe.pump.serve)
        server = mq_server(universe, directory)
        admin = MqClient(universe.add_broker("admin"), "s1:15555", timeout=60)
        for i in range(topics):
            await admin.declare(f"t{i}")
        for i in range(0, topics, 10):
            await admin.publish(f"t{i}", b"x")
        longest = total = float("inf")
        for _ in range(5):
            calls = []
            for _ in range(10):
                start = time.perf_counter()
                server._tick()
                calls.append(time.perf_counter() - start)
            longest, total = min(longest, max(calls)), min(total, sum(calls))
        server.close()
        nursery.cancel_scope.cancel()
    return longest, total


def main() -> None:
    topics = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    with tempfile.TemporaryDirectory(prefix="rdvpump-tick-pause-") as directory:
        longest, total = trio.run(measure, topics, Path(directory))
    print(f"{topics:,} topics: the longest call of the tick {longest * 1e3:.2f} ms, "
          f"{total * 1e3:.2f} ms a second")


if __name__ == "__main__":
    main()
