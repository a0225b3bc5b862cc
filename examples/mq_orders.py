"""An MQ server and two clients in one process: declare, publish, consume, ack."""

import tempfile

import trio

from brokermgr import open_universe
from brokermgr.tracking import TrackNode
from mq import MqClient, MqServer


async def main() -> None:
    with tempfile.TemporaryDirectory() as data:
        async with open_universe("shop") as universe:
            node = TrackNode(universe.add_broker("s1"), role="server", state_dir=data)
            server = MqServer(node, data, durability="sync")  # acked after fsync
            shop = MqClient(universe.add_broker("shop"), "s1:15555")
            await shop.declare("orders")
            await shop.declare("orders", group="eu-billing", filter="eu.#", start="beginning")
            await shop.publish("orders", b"order 1", tag="eu.fr")
            stored = await shop.publish_many("orders", [b"order 2", b"order 3"], tag="us.ny")
            print("stored at", [s.offset for s in stored], "on", stored[0].server)

            billing = MqClient(universe.add_broker("billing"), "s1:15555")
            eu = await billing.subscribe("orders", group="eu-billing", window=10)
            async for message in eu:
                print("eu-billing got", message.body, "tagged", message.tag)
                await message.ack()
                break
            print("topics:", await billing.query())
            server.close()


trio.run(main)
