"""Embedding rdvpump in a trio program: a universe, an echo service, a client.

Run it: ``python examples/embed_echo.py``.  The README shows this file and a
test runs it.
"""

from __future__ import annotations

import trio

from brokermgr import open_universe
from channels import AsyncMessageQueue
from rdv import RefusedError


async def main() -> None:
    async with open_universe("shop", seed=42) as universe:
        orders = universe.add_broker("orders")
        web = universe.add_broker("web")

        async def handle(queue: AsyncMessageQueue) -> None:
            async for request in queue:  # ends when the client closes its end
                await queue.send(b"ack " + request)

        async with trio.open_nursery() as nursery:
            await nursery.start(orders.serve_queues, 80, handle)

            async with await web.connect_queue("orders", 80) as queue:
                for item in (b"apple", b"pear", b"plum"):
                    await queue.send(item)
                    print((await queue.receive()).decode())

            try:
                await web.connect_queue("orders", 443)
            except RefusedError as exc:
                print(f"refused as expected: {exc.reason}")

            nursery.cancel_scope.cancel()


if __name__ == "__main__":
    trio.run(main)
