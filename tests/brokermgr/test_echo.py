"""The echo scenario: clients connect again and again to "Server" on port 80.

Each connection sends messages of random sizes (1 B to 10 KiB, from the
pump's seeded generator), the server echoes them, the client compares every
byte.  Run over rings of 4, 64 and 65536 bytes.
"""

from __future__ import annotations

from collections import deque

import pytest

from brokermgr import Broker, BrokerManager, EchoListener
from channels import MessageQueue, QueueFullError, QueueListener
from pump import Pump
from rdv import AcceptListener, ConnectListener


class EchoServer(AcceptListener):
    def __init__(self) -> None:
        self.links = 0

    def accepted(self, queue: MessageQueue) -> None:
        self.links += 1
        queue.set_listener(EchoListener(queue))


class EchoClient(ConnectListener, QueueListener):
    def __init__(self, broker: Broker, connects: int, messages: int, max_size: int) -> None:
        self.broker = broker
        self.connects_left = connects
        self.messages = messages
        self.max_size = max_size
        self.rng = broker.pump.random
        self.bytes_compared = 0
        self.mismatches: list[str] = []
        self.closes: list[str] = []
        self.done_links = 0

    def start(self) -> None:
        self.connects_left -= 1
        self.broker.connect("Server", 80, self)

    def refused(self, reason: str) -> None:
        self.mismatches.append(f"refused: {reason}")

    def connected(self, queue: MessageQueue) -> None:
        self.queue = queue
        self.to_send = deque(
            bytes(self.rng.getrandbits(8) for _ in range(self.rng.randint(1, self.max_size)))
            for _ in range(self.messages))
        self.expected: deque[bytes] = deque()
        queue.set_listener(self)
        self.drained()

    def drained(self) -> None:
        try:
            while self.to_send:
                self.queue.send(self.to_send[0])
                self.expected.append(self.to_send.popleft())
        except QueueFullError:
            pass

    def received(self, message: bytes) -> None:
        want = self.expected.popleft()
        if message != want:
            self.mismatches.append(f"link {self.queue.link_id}: got {len(message)} bytes, "
                                   f"wanted {len(want)}")
        self.bytes_compared += len(message)
        if not self.expected and not self.to_send:
            self.queue.close()

    def closed(self, reason: str) -> None:
        self.closes.append(reason)
        if self.expected or self.to_send:
            self.mismatches.append(f"closed early: {reason}")
            return
        self.done_links += 1
        if self.connects_left:
            self.start()


@pytest.mark.parametrize("ring", [pytest.param(4, marks=pytest.mark.slow), 64, 65536])
def test_echo_every_byte_comes_back(ring: int) -> None:
    pump = Pump(seed=2024)
    universe = BrokerManager("echo", pump=pump, ring_capacity=ring, high_water=32 * 1024)
    server = EchoServer()
    universe.add_broker("Server").listen(80, server)
    clients = [EchoClient(universe.add_broker(f"client{i}"), connects=3, messages=8,
                          max_size=10 * 1024) for i in range(4)]
    for c in clients:
        c.start()
    pump.run_until_idle()
    assert [c.mismatches for c in clients] == [[]] * 4
    assert [c.done_links for c in clients] == [3] * 4
    assert server.links == 12
    assert all(r == "closed" for c in clients for r in c.closes)
    total = sum(c.bytes_compared for c in clients)
    assert total > 12 * 8  # every message had at least one byte, most far more
    assert pump.failures == 0
