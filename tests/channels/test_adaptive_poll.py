"""Adaptive polling of TCP links (StreamLink): it spins only while the link is the one
busy link of its process, a core of the machine is free and polls pay; a quiet link, a
slow peer, a process with two busy links and a machine whose cores are all taken do not
keep a core spinning.  Real sockets on 127.0.0.1; the peer is driven by the test, and
its pauses are the scenario (a peer that answers slowly or not at all).  Each test says
whether the machine's cores are taken (the suite's own processes may take them)."""

from __future__ import annotations

import contextlib
import os
import pathlib
import sys
from collections.abc import AsyncIterator
from functools import partial

import pytest
import trio

from channels import ChannelManager, MessageQueue, StreamLink, _stream
from pump import Pump


@pytest.fixture(autouse=True)
def free_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """A core is free, whatever else runs on the machine (the rules under test are the
    link's own); a test that takes them says so."""
    monkeypatch.setattr(_stream._cores, "taken", lambda now: False)


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


@contextlib.asynccontextmanager
async def links(n: int) -> AsyncIterator[list[tuple[StreamLink, trio.SocketStream, Counter]]]:
    """``n`` StreamLinks on one served pump, each with the raw socket of its far end (the
    test writes frames into it) and the counter of what its queue received."""
    pump = Pump()
    async with trio.open_nursery() as nursery:
        await nursery.start(pump.serve)
        made = []
        for _ in range(n):
            ours, theirs = await tcp_pair()
            channel = ChannelManager(pump).open_end("me", "peer", 1)
            counter = Counter()
            MessageQueue(channel).set_listener(counter)
            link = StreamLink(channel, ours)
            nursery.start_soon(link.run)
            made.append((link, theirs, counter))
        try:
            yield made
        finally:  # a failed test leaves no socket for the collector to warn of in another
            for _, raw, _ in made:
                await raw.aclose()
            nursery.cancel_scope.cancel()


async def feed(raw: trio.SocketStream, counter: Counter, n: int, gap: float) -> None:
    for _ in range(n):
        counter.event = trio.Event()
        await raw.send_all((3).to_bytes(4, "big") + b"abc")
        await counter.event.wait()
        await trio.sleep(gap)  # the peer's pause before its next message


def busy_despite_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """The peer's 0.5 ms pauses count as busy.  With the 1 ms threshold of
    :data:`~channels._stream.ADAPTIVE_QUIET` the link's waits around them came out over
    it: one poll in 200 messages on an idle machine, none on a loaded one (the suite's
    other workers); the rules these tests check are the back-off and the cores."""
    monkeypatch.setattr(_stream, "ADAPTIVE_QUIET", 0.05)


async def test_a_slow_peer_makes_polls_back_off(monkeypatch: pytest.MonkeyPatch) -> None:
    busy_despite_load(monkeypatch)
    async with links(1) as [(link, raw, counter)]:
        await feed(raw, counter, 200, 0.0005)  # busy, but never within the 100 us window
        assert counter.count == 200
        assert link.poll_hits == 0
        # windows that pass empty back off (1, 2, 4 ... 64 waits apart: eight in 200
        # messages); a window cut short by other work (this test's peer is a task of the
        # same loop) does not, so a few more; without the back-off, one after each message
        assert 1 <= link.polls <= 40


async def test_a_quiet_link_never_polls() -> None:
    async with links(1) as [(link, raw, counter)]:
        await feed(raw, counter, 1, 0.005)
        first = link.polls  # the first message came at once: at most one poll after it
        await feed(raw, counter, 20, 0.005)  # then a message every 5 ms: quiet
        assert counter.count == 21 and first <= 1 and link.polls == first


async def test_two_busy_links_in_one_process_do_not_poll() -> None:
    async with links(2) as [(one, raw1, counter1), (two, raw2, counter2)]:
        await feed(raw1, counter1, 1, 0.0002)
        await feed(raw2, counter2, 1, 0.0002)
        before = one.polls + two.polls  # before both were busy, one may have polled once
        for _ in range(100):
            await feed(raw1, counter1, 1, 0.0002)
            await feed(raw2, counter2, 1, 0.0002)
        assert counter1.count == counter2.count == 101
        # Without the rule, each of the 200 messages would be followed by a poll.  A
        # hiccup of the machine over 1 ms makes one link look like the only busy one for
        # a message or two, so a handful is allowed (seen once in a full run, not alone).
        assert before <= 1 and one.polls + two.polls - before <= 6


#: The flooding peer: connects, writes its frames with one blocking sendall, and exits.
FLOOD = """
import socket, sys
port, count = int(sys.argv[1]), int(sys.argv[2])
sock = socket.create_connection(("127.0.0.1", port))
sock.sendall(((3).to_bytes(4, "big") + b"abc") * count)
sock.close()
"""


class Upto(Counter):
    """Counts, and sets its event only at ``target`` (no task wakes per message)."""

    def __init__(self, target: int) -> None:
        super().__init__()
        self.target = target

    def received(self, message: bytes) -> None:
        self.count += 1
        if self.count == self.target:
            self.event.set()


async def test_a_link_whose_polls_keep_paying_still_lets_timers_run() -> None:
    # A peer process floods the link, so every poll of the receive loop gets bytes; the
    # loop still yields at least every POLL_YIELD, and a timer of this process fires
    # while the flood lasts instead of after it.
    count = 100_000
    pump = Pump()
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    port = listener.socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        await nursery.start(pump.serve)
        proc = await nursery.start(partial(trio.run_process, [
            sys.executable, "-c", FLOOD, str(port), str(count)], check=False))
        with trio.fail_after(30):
            ours = await listener.accept()
        await listener.aclose()
        # a small ring: each read takes a few frames, so the flood takes many polls
        channel = ChannelManager(pump, capacity=64).open_end("me", "peer", 1)
        counter = Upto(count)
        MessageQueue(channel).set_listener(counter)
        link = StreamLink(channel, ours)
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while 0 < counter.count < count or counter.count == 0:
                await trio.sleep(0.001)
                if 0 < counter.count < count:
                    ticks += 1

        nursery.start_soon(tick)
        nursery.start_soon(link.run)
        with trio.fail_after(30):
            await counter.event.wait()
        assert proc.returncode == 0 or await proc.wait() == 0
        assert link.poll_hits >= 1000  # the scenario: polls that pay, one after another
        assert ticks >= 5  # about 60 on this machine; none if polls never yield
        nursery.cancel_scope.cancel()


async def test_a_busy_link_does_not_poll_while_every_core_is_taken(
        monkeypatch: pytest.MonkeyPatch) -> None:
    busy_despite_load(monkeypatch)
    async with links(1) as [(link, raw, counter)]:
        await feed(raw, counter, 30, 0.0005)  # busy: with a free core it polls
        assert counter.count == 30 and link.polls >= 1
    monkeypatch.setattr(_stream._cores, "taken", lambda now: True)
    async with links(1) as [(link, raw, counter)]:
        await feed(raw, counter, 30, 0.0005)  # the same, every core taken
        assert counter.count == 30 and link.polls == 0


def test_the_cores_are_taken_when_more_threads_are_runnable_than_cores(
        tmp_path: pathlib.Path) -> None:
    loadavg = tmp_path / "loadavg"
    cores = _stream._Cores()
    cores.cores = 2
    loadavg.write_bytes(b"0.52 0.58 0.59 3/467 12345\n")
    cores.fd = os.open(loadavg, os.O_RDONLY)
    try:
        assert cores.taken(10.0)  # three runnable, two cores: one waits
        loadavg.write_bytes(b"0.52 0.58 0.59 2/467 12345\n")
        assert cores.taken(10.0 + _stream.CORES_CHECK_EVERY / 2)  # read again only later
        assert not cores.taken(10.0 + _stream.CORES_CHECK_EVERY)
        loadavg.write_bytes(b"no such line\n")  # unreadable: never taken from then on
        assert not cores.taken(20.0) and cores.failed
        loadavg.write_bytes(b"0.52 0.58 0.59 9/467 12345\n")
        assert not cores.taken(30.0)
    finally:
        os.close(cores.fd)


@pytest.mark.parametrize(("line", "count"), [(b"0.00 0.01 0.05 1/80 7\n", 1),
                                             (b"3.57 4.98 4.07 12/512 99", 12)])
def test_runnable_threads_are_read_from_loadavg(line: bytes, count: int) -> None:
    assert _stream.runnable(line) == count


@pytest.mark.parametrize("line", [b"", b"0.1 0.2 0.3", b"0.1 0.2 0.3 12 99",
                                  b"0.1 0.2 0.3 a/b 99"])
def test_a_line_that_is_not_loadavg_s_is_refused(line: bytes) -> None:
    with pytest.raises(ValueError):
        _stream.runnable(line)
