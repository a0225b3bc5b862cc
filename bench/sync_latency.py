"""How long a `sync` publish waits for its acknowledgement while another producer loads
the server: ``bench mq``'s manager, server (``--durability sync``), producer and
consumer processes moving COUNT messages of SIZE bytes, and beside them a probe in
this process publishing 1 KiB to a topic of its own, one at a time, each awaited.  The
probe starts once the load has stored a tenth of its messages and stops after SECONDS
or when the load has stored them all.

``python bench/sync_latency.py [SIZE COUNT SECONDS]`` (65536 30000 1.5): one line, the
probes' count and their p50, p90 and p99 in milliseconds.  Figures in bench/RESULTS.md.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import trio

from brokermgr import BrokerManager
from mq import MqClient
from pump import Pump
from rdv import Address
from rdvpump.bench import mq

PROBE = b"p" * 1024


async def _probe(port: int, count: int, seconds: float) -> list[float]:
    manager = BrokerManager(mq.UNIVERSE, pump=Pump(name="probe"))
    manager.directory["s1"] = Address("127.0.0.1", port)
    took: list[float] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(manager.pump.serve)
        await nursery.start(manager.serve_network, "127.0.0.1", 0)
        client = MqClient(manager.add_broker("probe"), "s1:15555", timeout=60)
        await client.connected()
        await client.declare("probe")

        async def stored() -> int:
            return int((await client.query("bench"))["bench"]["next"])

        with trio.fail_after(60):
            while await stored() < count // 10:
                await trio.sleep(0.01)
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            start = time.perf_counter()
            await client.publish("probe", PROBE)
            took.append(time.perf_counter() - start)
            if len(took) % 50 == 0 and await stored() >= count:
                break
        client.close()
        nursery.cancel_scope.cancel()
    return took


def main() -> None:
    size, count, seconds = (int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])) \
        if len(sys.argv) > 3 else (65536, 30000, 1.5)
    with mq.served("sync", Path(tempfile.mkdtemp(prefix="rdvpump-sync-latency-"))) as port:
        shape = ["127.0.0.1", str(port), str(size), str(count)]
        consumer = mq._Proc([*mq.CHILD, "consumer", *shape], ready="subscribed")
        try:
            producer = mq._Proc([*mq.CHILD, "producer", *shape])
            try:
                took = sorted(trio.run(_probe, port, count, seconds))
                producer.result()
                consumer.result()
            finally:
                producer.close()
        finally:
            consumer.close()

    def ms(q: float) -> float:
        return took[min(len(took) - 1, int(q * len(took)))] * 1e3

    print(f"{len(took)} probes: p50 {ms(0.5):.2f} ms, p90 {ms(0.9):.2f} ms, "
          f"p99 {ms(0.99):.2f} ms")


if __name__ == "__main__":
    main()
