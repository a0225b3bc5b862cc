"""How long saving consume groups' positions stops an MQ server's pump as the groups that
move grow: GROUPS topics on one server (on disk, ``interval:1``), each with a consumer;
each round every topic is sent a message, which its consumer acknowledges (every group's
position moves), then the server's tick is called by hand ten times (a second's calls:
the one that visits the topics saves every position that moved, a file and its
directory fsynced each).  Five rounds: the longest call, the best of the five, and, once
the round is over, how long until every position is on disk.  One process, in-memory
links.

``python bench/cursor_pause.py [GROUPS]`` (default 1,000).  Figures in bench/RESULTS.md.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import trio

from brokermgr import BrokerManager
from mq import CursorStore, MqClient
from mq.storage._cursor import decode_cursor
from rdvpump.bench.scale import mq_server


async def measure(groups: int, directory: Path) -> tuple[float, float]:
    """Seconds of the longest call of the tick, and until the positions are on disk,
    each the best of five rounds."""
    universe = BrokerManager("cursor-pause")
    async with trio.open_nursery() as nursery:
        await nursery.start(universe.pump.serve)
        server = mq_server(universe, directory)
        server._tick_timer.cancel()  # the tick is called here
        client = MqClient(universe.add_broker("c"), "s1:15555", timeout=60)
        names = [f"t{i}" for i in range(groups)]
        readers = []
        for name in names:
            await client.declare(name)
            readers.append(await client.subscribe(name))
        longest = on_disk = float("inf")
        for round_ in range(5):
            for name in names:
                await client.publish(name, b"x")
            for reader in readers:
                message = await reader.receive()
                await reader.ack([message.offset])
            for name in names:  # until the server has taken every ack
                group = server.catalogue.topics[name].topic.groups[name]
                while group.in_flight:
                    await trio.sleep(0.001)
            calls = []
            start = time.perf_counter()
            for _ in range(10):
                call = time.perf_counter()
                server._tick()
                calls.append(time.perf_counter() - call)
            paths = [CursorStore.path_in(server.catalogue.topics[n].directory, n)
                     for n in names]
            while any(decode_cursor(p.read_bytes(), str(p)) != round_ + 1 for p in paths):
                await trio.sleep(0.001)
            longest = min(longest, max(calls))
            on_disk = min(on_disk, time.perf_counter() - start)
        client.close()
        server.close()
        nursery.cancel_scope.cancel()
    return longest, on_disk


def main() -> None:
    groups = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000
    with tempfile.TemporaryDirectory(prefix="rdvpump-cursor-pause-") as directory:
        longest, on_disk = trio.run(measure, groups, Path(directory))
    print(f"{groups:,} groups moving: the tick's longest call {longest * 1e3:.2f} ms; "
          f"every position on disk {on_disk * 1e3:.1f} ms after the round began")


if __name__ == "__main__":
    main()
