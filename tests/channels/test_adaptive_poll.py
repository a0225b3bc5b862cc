"""Adaptive polling of TCP links (StreamLink): it spins only while the link is the one
busy link of its process and polls pay; a quiet link, a slow peer and a process with two
busy links do not keep a core spinning.  Real sockets on 127.0.0.1; the peer is driven
by the test, and its pauses are the scenario (a peer that answers slowly or not at all)."""

from __future__ import annotations

import trio

from channels import ChannelManager, MessageQueue, StreamLink
from pump import Pump


async def tcp_pair() -> tuple[trio.SocketStream, trio.SocketStream]:
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    port = listener.socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        accepted: list[trio.SocketStream] = []

        async def accept() -> None:
            accepted.append(await listener.accept())

        nursery.start_soon(accept)
        ours = await trio.open_tcp_stream("127.0.0.1", port)
    await listener.aclose()
    return ours, accepted[0]


class Counter:
    def __init__(self) -> None:
        self.count = 0
        self.event = trio.Event()

    def received(self, message: bytes) -> None:
        self.count += 1
        self.event.set()

    def drained(self) -> None:
        pass

    def closed(self, reason: str) -> None:
        pass


async def linked(pump: Pump, nursery: trio.Nursery
                 ) -> tuple[StreamLink, trio.SocketStream, Counter]:
    """A StreamLink whose far end is a raw socket the test writes frames into."""
    ours, theirs = await tcp_pair()
    channel = ChannelManager(pump).open_end("me", "peer", 1)
    counter = Counter()
    MessageQueue(channel).set_listener(counter)
    link = StreamLink(channel, ours)
    nursery.start_soon(link.run)
    return link, theirs, counter


async def feed(raw: trio.SocketStream, counter: Counter, n: int, gap: float) -> None:
    for _ in range(n):
        counter.event = trio.Event()
        await raw.send_all((3).to_bytes(4, "big") + b"abc")
        await counter.event.wait()
        await trio.sleep(gap)  # the peer's pause before its next message


async def test_a_slow_peer_makes_polls_back_off() -> None:
    pump = Pump()
    async with trio.open_nursery() as nursery:
        await nursery.start(pump.serve)
        link, raw, counter = await linked(pump, nursery)
        await feed(raw, counter, 200, 0.0005)  # busy (under 1 ms), but never within 100 us
        assert counter.count == 200
        assert link.poll_hits == 0
        assert 1 <= link.polls <= 12  # 1, 2, 4 ... 64 waits apart, not 199 spins
        await raw.aclose()
        nursery.cancel_scope.cancel()


async def test_a_quiet_link_never_polls() -> None:
    pump = Pump()
    async with trio.open_nursery() as nursery:
        await nursery.start(pump.serve)
        link, raw, counter = await linked(pump, nursery)
        await feed(raw, counter, 1, 0.005)
        first = link.polls  # the first message came at once: at most one poll after it
        await feed(raw, counter, 20, 0.005)  # then a message every 5 ms: quiet
        assert counter.count == 21 and first <= 1 and link.polls == first
        await raw.aclose()
        nursery.cancel_scope.cancel()


async def test_two_busy_links_in_one_process_do_not_poll() -> None:
    pump = Pump()
    async with trio.open_nursery() as nursery:
        await nursery.start(pump.serve)
        one, raw1, counter1 = await linked(pump, nursery)
        two, raw2, counter2 = await linked(pump, nursery)
        await feed(raw1, counter1, 1, 0.0002)
        await feed(raw2, counter2, 1, 0.0002)
        before = one.polls + two.polls  # before both were busy, one may have polled once
        for _ in range(100):
            await feed(raw1, counter1, 1, 0.0002)
            await feed(raw2, counter2, 1, 0.0002)
        assert counter1.count == counter2.count == 101
        assert before <= 1 and one.polls + two.polls == before
        await raw1.aclose()
        await raw2.aclose()
        nursery.cancel_scope.cancel()
