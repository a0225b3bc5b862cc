"""What a master's shipment of consume-group positions to its replica costs as its
topics grow: TOPICS topics declared on the master of a replicated group (on disk,
``interval:1``), its slave following every one; one topic in a hundred has a consumer,
and before each shipment it is sent one message and acknowledges it (so those topics'
positions move, the rest are idle).  The shipment is then called by hand 10 times in
a row (a second's calls, each after its topics moved) with the server's tick between
(which looks at every topic once a second), five times: for each of the two timers, the
longest call and the ten calls' sum, each the best of the five.  One process,
in-memory links.

``python bench/positions_pause.py [TOPICS]`` (default 5,000).  Figures in
bench/RESULTS.md.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import trio

from brokermgr import BrokerManager
from mq import MqClient
from rdvpump.bench.scale import replicated_pair

BUSY_EVERY = 100


async def measure(topics: int, directory: Path) -> dict[str, tuple[float, float]]:
    """For the shipment and the tick: seconds of the longest of ten calls, and of the
    ten, each the best of five."""
    universe = BrokerManager("positions-pause")
    async with trio.open_nursery() as nursery:
        await nursery.start(universe.pump.serve)
        master, slave = replicated_pair(universe, directory)
        admin = MqClient(universe.add_broker("admin"), "s1:15555", timeout=60)
        names = [f"t{i}" for i in range(topics)]
        for name in names:
            await admin.declare(name)
        busy = names[::BUSY_EVERY]
        readers = [await admin.subscribe(name) for name in busy]
        follower = slave.follow("s1:15555")
        while len(follower.followed) < topics:
            await follower.changed.wait()
        master._tick_timer.cancel()  # its timers are called here, in their order
        master._positions_timer.cancel()
        best = {"shipment": (float("inf"),) * 2, "tick": (float("inf"),) * 2}
        for _ in range(5):
            calls: dict[str, list[float]] = {"shipment": [], "tick": []}
            for _ in range(10):
                for name in busy:
                    await admin.publish(name, b"x")
                for reader in readers:
                    message = await reader.receive()
                    await reader.ack([message.offset])
                for name in busy:  # until the master has taken every ack
                    group = master.catalogue.topics[name].topic.groups[name]
                    while group.in_flight:
                        await trio.sleep(0.001)
                start = time.perf_counter()
                master._ship_positions()
                middle = time.perf_counter()
                master._tick()
                calls["shipment"].append(middle - start)
                calls["tick"].append(time.perf_counter() - middle)
            for timer, times in calls.items():
                best[timer] = (min(best[timer][0], max(times)),
                               min(best[timer][1], sum(times)))
        admin.close()
        slave.close()
        master.close()
        nursery.cancel_scope.cancel()
    return best


def main() -> None:
    topics = int(sys.argv[1]) if len(sys.argv) > 1 else 5_000
    with tempfile.TemporaryDirectory(prefix="rdvpump-positions-pause-") as directory:
        best = trio.run(measure, topics, Path(directory))
    print(f"{topics:,} topics, {len(range(0, topics, BUSY_EVERY))} of them moving: " +
          "; ".join(f"the {timer}'s longest call {longest * 1e3:.2f} ms, "
                    f"{total * 1e3:.2f} ms a second" for timer, (longest, total) in best.items()))


if __name__ == "__main__":
    main()
