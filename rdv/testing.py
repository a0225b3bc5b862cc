"""Test helpers: a network of memory streams between NetNodes, for the mock clock.

``MemoryNetwork`` stands in for TCP in deterministic tests of the handshake,
the stream adapter and the name service; real tests use real sockets.  Its
hosts can be partitioned as a network partitions TCP: new connections between
them are refused, open ones hang (bytes wait, none is lost) until healed, and
only the peers' own timeouts (heartbeats, expiry) notice.
"""

from __future__ import annotations

import trio
import trio.testing

from ._address import Address
from ._net import NetNode


class _Wire:
    """One direction of a connection between two hosts: a memory stream pair whose
    bytes move only while the hosts are not partitioned."""

    def __init__(self, network: MemoryNetwork, src: str, dst: str) -> None:
        self.network, self.src, self.dst = network, src, dst
        self.send = trio.testing.MemorySendStream(self._pump_soon, None, self.pump)
        self.receive = trio.testing.MemoryReceiveStream(self._pump_soon)

    def pump(self) -> None:
        if not self.network.partitioned(self.src, self.dst):
            trio.testing.memory_stream_pump(self.send, self.receive)

    async def _pump_soon(self) -> None:
        self.pump()


class MemoryNetwork:
    """Addresses served by NetNodes, reached through memory stream pairs."""

    def __init__(self) -> None:
        self._nodes: dict[Address, NetNode] = {}
        self._cut: set[tuple[str, str]] = set()
        self._wires: list[_Wire] = []

    def partition(self, a: str, b: str) -> None:
        """Cut hosts ``a`` and ``b`` apart: connects between them are refused, open
        connections hang until :meth:`heal`."""
        self._cut |= {(a, b), (b, a)}

    def heal(self, a: str, b: str) -> None:
        """Join them again: what waited on open connections moves on, in order."""
        self._cut -= {(a, b), (b, a)}
        for wire in self._wires:
            wire.pump()

    def partitioned(self, a: str, b: str) -> bool:
        return (a, b) in self._cut

    def attach(self, node: NetNode, host: str | None = None) -> None:
        """Let ``node`` dial through this network (call before serving it), from
        ``host`` (the one it serves on, by default)."""

        async def open_stream(address: Address) -> trio.abc.Stream:
            return self.open_stream(address, source=host)

        node.open_stream = open_stream

    async def serve(self, node: NetNode, address: Address, *,
                    task_status: trio.TaskStatus[Address] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve ``node`` at ``address`` until cancelled (then the address is free again)."""
        self.attach(node, address[0])
        self._nodes[address] = node
        try:
            await node.serve_streams(address, task_status=task_status)
        finally:
            if self._nodes.get(address) is node:
                del self._nodes[address]

    def open_stream(self, address: Address, *, source: str | None = None) -> trio.abc.Stream:
        """A connection from host ``source`` (None: from outside any partition)."""
        node = self._nodes.get(address)
        if node is None:
            raise OSError(f"connection refused: nothing serves {address[0]}:{address[1]}")
        if source is None:
            ours, theirs = trio.testing.memory_stream_pair()
        else:
            if self.partitioned(source, address[0]):
                raise OSError(f"no route to host {address[0]} from {source}: partitioned")
            out, back = _Wire(self, source, address[0]), _Wire(self, address[0], source)
            self._wires += [out, back]
            ours = trio.StapledStream(out.send, back.receive)
            theirs = trio.StapledStream(back.send, out.receive)
        node.spawn_inbound(theirs)
        return ours
