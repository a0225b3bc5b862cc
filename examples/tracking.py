"""zbus-style tracking in one trio program: two trackers, three servers, a client.

Run it: ``python examples/tracking.py``.  A test runs it.
"""

from __future__ import annotations

import tempfile

import trio

from brokermgr import open_universe
from brokermgr.tracking import ConsumerRoute, ProducerRoute, RouteClient, TrackNode, by_key_hash


async def main() -> None:
    # state_dir keeps each broker's InfoVersion epoch, so versions keep increasing
    # across restarts whatever the clock does (without one: a warning, and the clock)
    with tempfile.TemporaryDirectory() as state:
        await run(state)


async def run(state: str) -> None:
    async with open_universe("shop") as universe:
        for t in ("t1", "t2"):
            TrackNode(universe.add_broker(t), role="tracker", state_dir=state)
        servers = {}
        for s in ("s1", "s2", "s3"):
            node = TrackNode(universe.add_broker(s), role="server",
                             trackers=["t1:15555", "t2:15555"], state_dir=state)
            node.declare_topic("orders")
            servers[s] = node
        servers["s2"].update_group("orders", "orders", consumers=["billing"])

        client = RouteClient(universe.add_broker("web"))
        client.add_tracker("t1:15555")
        client.add_tracker("t2:15555")
        with trio.fail_after(5):
            while len(client.routes.servers_of("orders")) < 3 or not any(
                    t.consumer_count for t in client.routes.servers_of("orders").values()):
                await client.changed()

        print("servers:", sorted(client.routes.server_table))
        print("producer (round-robin over servers with consumers):",
              ProducerRoute(client, "orders").servers())
        print("producer by key 'cust-42':", ProducerRoute(client, "orders", by_key_hash)
              .servers("cust-42"))
        print("consumer (all servers):", ConsumerRoute(client, "orders").servers())

        servers["s3"].broker.close("crashed")  # its links drop: trackers and client follow
        with trio.fail_after(5):
            while "s3:15555" in client.routes.server_table:
                await client.changed()
        print("after s3 crashed:", sorted(client.routes.server_table))


if __name__ == "__main__":
    trio.run(main)
