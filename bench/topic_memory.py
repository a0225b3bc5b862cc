"""What an MQ server holds in memory for topics whose consumers keep up: TOPICS topics on
disk (``interval:1``), a consumer each reading as messages come, MESSAGES messages of
1 KiB published to each in batches of 100; once every message is read, the memory
Python's allocations hold (``tracemalloc``, started once the consumers are attached,
so the server's topics and the clients themselves are not counted), and how much of it
is the bodies the topics keep in memory for their readers.  One process, in-memory
links.

``python bench/topic_memory.py [TOPICS] [MESSAGES]`` (default 50 topics, 4,000
messages each).  Figures in bench/RESULTS.md.
"""

from __future__ import annotations

import gc
import sys
import tempfile
import tracemalloc
from pathlib import Path
from typing import Any

import trio

from brokermgr import BrokerManager
from mq import MqClient
from rdvpump.bench.scale import mq_server


async def measure(topics: int, messages: int, directory: Path) -> tuple[int, int]:
    """Bytes held once everything was read, and the bodies kept for readers."""
    universe = BrokerManager("topic-memory")
    async with trio.open_nursery() as nursery:
        await nursery.start(universe.pump.serve)
        server = mq_server(universe, directory)
        admin = MqClient(universe.add_broker("admin"), "s1:15555", timeout=60)
        subscriptions = []
        for i in range(topics):
            await admin.declare(f"t{i}")
            client = MqClient(universe.add_broker(f"c{i}"), "s1:15555", timeout=60)
            subscriptions.append(await client.subscribe(f"t{i}"))
        read = [0]
        everything = trio.Event()

        async def consume(subscription: Any) -> None:
            while True:
                batch = await subscription.receive_batch()
                read[0] += len(batch)
                await batch.ack()
                if read[0] == topics * messages:
                    everything.set()

        gc.collect()
        tracemalloc.start()
        try:
            async with trio.open_nursery() as readers:
                for subscription in subscriptions:
                    readers.start_soon(consume, subscription)
                for i in range(topics):
                    for first in range(0, messages, 100):
                        count = min(100, messages - first)
                        await admin.publish_many(f"t{i}", [b"x" * 1024] * count)
                with trio.fail_after(120):
                    await everything.wait()
                readers.cancel_scope.cancel()
            gc.collect()
            held = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
        kept = sum(len(record.body) for state in server.catalogue.topics.values()
                   for record in state.topic.log.tail.held())
        server.close()
        nursery.cancel_scope.cancel()
    return held, kept


def main() -> None:
    topics = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    messages = int(sys.argv[2]) if len(sys.argv) > 2 else 4000
    with tempfile.TemporaryDirectory(prefix="rdvpump-topic-memory-") as directory:
        held, kept = trio.run(measure, topics, messages, Path(directory))
    print(f"{topics} topics, {messages:,} messages of 1 KiB each read as they came: "
          f"{held / 1e6:.1f} MB held, {kept / 1e6:.1f} MB of it bodies kept for readers")


if __name__ == "__main__":
    main()
