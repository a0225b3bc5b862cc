"""What a replicated group costs while nothing happens, as its topics grow: TOPICS topics
declared on the master of a group of two (on disk, ``interval:1``), its slave following
every one (both servers in this process, in-memory links); then the process's CPU over
3 s of idle, as a share of one core.  The slave asks its master for its topics ten times
a second (its beat), the master ships positions ten times a second and ticks once a
second.  Also printed: how long declaring the topics and following them took, and what
the master's ``progress()`` costs (what it tells the name service at each beat, 0.1 s
in a ``broker run``: the records it holds, its replicas in sync), best of ten calls.

``python bench/replica_idle.py [TOPICS]`` (default 2,000).  Figures in bench/RESULTS.md.
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

IDLE = 3.0


async def measure(topics: int, directory: Path) -> tuple[float, float, float, float]:
    """Seconds to declare and to follow the topics, the idle CPU share, and seconds of
    a call of the master's ``progress()``."""
    universe = BrokerManager("replica-idle")
    async with trio.open_nursery() as nursery:
        await nursery.start(universe.pump.serve)
        master, slave = replicated_pair(universe, directory)
        admin = MqClient(universe.add_broker("admin"), "s1:15555", timeout=60)
        start = time.perf_counter()
        for i in range(topics):
            await admin.declare(f"t{i}")
        declared = time.perf_counter()
        follower = slave.follow("s1:15555")
        while len(follower.followed) < topics:
            await follower.changed.wait()
        followed = time.perf_counter()
        cpu, wall = time.process_time(), time.perf_counter()
        await trio.sleep(IDLE)
        share = (time.process_time() - cpu) / (time.perf_counter() - wall)
        beat = float("inf")
        for _ in range(10):
            call = time.perf_counter()
            master.progress()
            beat = min(beat, time.perf_counter() - call)
        admin.close()
        slave.close()
        master.close()
        nursery.cancel_scope.cancel()
    return declared - start, followed - declared, share, beat


def main() -> None:
    topics = int(sys.argv[1]) if len(sys.argv) > 1 else 2_000
    with tempfile.TemporaryDirectory(prefix="rdvpump-replica-idle-") as directory:
        declare, follow, share, beat = trio.run(measure, topics, Path(directory))
    print(f"{topics:,} topics: declared in {declare:.1f} s, followed in {follow:.1f} s; "
          f"idle, {share:.3f} of a core; the master's progress() {beat * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
