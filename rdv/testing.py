"""Test helpers: a network of memory streams between NetNodes, for the mock clock.

``MemoryNetwork`` stands in for TCP in deterministic tests of the handshake,
the stream adapter and the name service; real tests use real sockets.
"""

from __future__ import annotations

import trio
import trio.testing

from ._address import Address
from ._net import NetNode


class MemoryNetwork:
    """Addresses served by NetNodes, reached through memory stream pairs."""

    def __init__(self) -> None:
        self._nodes: dict[Address, NetNode] = {}

    def attach(self, node: NetNode) -> None:
        """Let ``node`` dial through this network (call before serving it)."""

        async def open_stream(address: Address) -> trio.abc.Stream:
            return self.open_stream(address)

        node.open_stream = open_stream

    async def serve(self, node: NetNode, address: Address, *,
                    task_status: trio.TaskStatus[Address] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve ``node`` at ``address`` until cancelled (then the address is free again)."""
        self.attach(node)
        self._nodes[address] = node
        try:
            await node.serve_streams(address, task_status=task_status)
        finally:
            if self._nodes.get(address) is node:
                del self._nodes[address]

    def open_stream(self, address: Address) -> trio.abc.Stream:
        node = self._nodes.get(address)
        if node is None:
            raise OSError(f"connection refused: nothing serves {address[0]}:{address[1]}")
        ours, theirs = trio.testing.memory_stream_pair()
        node.spawn_inbound(theirs)
        return ours
