"""The trio face: connect_queue / accept_queue / serve_queues and awaitable queues."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial

import pytest
import trio
import trio.testing

from brokermgr import open_universe
from channels import AsyncMessageQueue, QueueFullError
from rdv import RdvUsageError, RefusedError


async def test_connect_queue_raises_the_refusal_reason(autojump_clock: object) -> None:
    async with open_universe("u") as u:
        server, client = u.add_broker("server"), u.add_broker("client")
        with pytest.raises(RefusedError) as info:
            await client.connect_queue("server", 80)
        assert info.value.reason == "not bound"
        assert isinstance(info.value, ConnectionRefusedError)
        with pytest.raises(RefusedError, match="unknown broker"):
            await client.connect_queue("ghost", 80)
        server.bind(80, _Keep())
        await client.connect_queue("server", 80)
        with pytest.raises(RefusedError, match="busy"):
            await client.connect_queue("server", 80)


class _Keep:
    def accepted(self, queue: object) -> None:
        self.queue = queue


async def test_accept_queue_pairs_once_then_unbinds(autojump_clock: object) -> None:
    async with open_universe("u") as u, trio.open_nursery() as nursery:
        server, client = u.add_broker("server"), u.add_broker("client")
        got: list[AsyncMessageQueue] = []

        async def accept() -> None:
            got.append(await server.accept_queue(80))

        nursery.start_soon(accept)
        await trio.testing.wait_all_tasks_blocked()
        q = await client.connect_queue("server", 80)
        await q.send(b"ping")
        while not got:
            await trio.sleep(0.01)
        assert await got[0].receive() == b"ping"
        assert got[0].remote_id == "client"
        assert server.ports == []


async def test_cancelled_accept_unbinds_the_port(autojump_clock: object) -> None:
    async with open_universe("u") as u:
        server = u.add_broker("server")
        with trio.move_on_after(1):
            await server.accept_queue(80)
        assert server.ports == []
        with pytest.raises(RefusedError, match="not bound"):
            await u.add_broker("c").connect_queue("server", 80)


async def test_serve_queues_echo_and_end_of_channel(autojump_clock: object) -> None:
    async with open_universe("u", ring_capacity=16) as u, trio.open_nursery() as nursery:
        server = u.add_broker("server")
        ends: list[str] = []

        async def echo(q: AsyncMessageQueue) -> None:
            async for m in q:  # ends cleanly when the client closes
                await q.send(m.upper())
            ends.append(q.remote_id)

        await nursery.start(server.serve_queues, 80, echo)
        with pytest.raises(RdvUsageError, match="already bound"):
            server.bind(80, _Keep())
        for i in range(3):
            async with await u.add_broker(f"c{i}").connect_queue("server", 80) as q:
                for word in (b"hello", b"x" * 100, b""):
                    await q.send(word)
                    assert await q.receive() == word.upper()
        await trio.testing.wait_all_tasks_blocked()
        assert ends == ["c0", "c1", "c2"]
        nursery.cancel_scope.cancel()
    assert server.ports == []


@asynccontextmanager
async def slow_receiver() -> AsyncIterator[
        tuple[AsyncMessageQueue, list[AsyncMessageQueue], trio.Nursery]]:
    """A client queue to a server whose handler never reads (ring 256 B, high-water mark
    2 KiB, receive buffer 4): a sender soon waits behind backpressure.  Yields the client
    queue, the server's queue (once accepted) in a list, and a nursery."""
    async with open_universe("u", ring_capacity=256, high_water=2048) as u, \
            trio.open_nursery() as nursery:
        server, client = u.add_broker("server"), u.add_broker("client")
        server_side: list[AsyncMessageQueue] = []

        async def hold(q: AsyncMessageQueue) -> None:
            server_side.append(q)
            await trio.sleep_forever()

        await nursery.start(partial(server.serve_queues, 80, hold, receive_buffer=4))
        yield await client.connect_queue("server", 80), server_side, nursery
        nursery.cancel_scope.cancel()


async def test_send_waits_behind_a_slow_receiver_with_bounded_memory(
        autojump_clock: object) -> None:
    async with slow_receiver() as (q, server_side, nursery):
        sent = 0

        async def flood() -> None:
            nonlocal sent
            for i in range(1000):
                await q.send(b"%04d" % i + b"." * 60)
                sent += 1

        nursery.start_soon(flood)
        await trio.sleep(1)
        assert 0 < sent < 1000  # stuck behind backpressure, not buffering everything
        assert q.statistics().bytes_queued <= 2048
        with pytest.raises(QueueFullError):
            q.send_nowait(b"x" * 64)
        for i in range(1000):  # the slow receiver finally reads: nothing was lost
            assert (await server_side[0].receive())[:4] == b"%04d" % i
        assert sent == 1000
        nursery.cancel_scope.cancel()


async def test_receive_after_abort_or_own_close(autojump_clock: object) -> None:
    async with open_universe("u") as u, trio.open_nursery() as nursery:
        server, client = u.add_broker("server"), u.add_broker("client")
        server_side: list[AsyncMessageQueue] = []

        async def keep(q: AsyncMessageQueue) -> None:
            server_side.append(q)

        await nursery.start(server.serve_queues, 80, keep)
        q = await client.connect_queue("server", 80)
        await q.send(b"before abort")
        await trio.testing.wait_all_tasks_blocked()
        server_side[0].queue.abort("server gave up")
        with pytest.raises(trio.BrokenResourceError, match="server gave up"):
            await q.receive()
        q2 = await client.connect_queue("server", 80)
        await q2.aclose()
        with pytest.raises(trio.ClosedResourceError):
            await q2.receive()
        with pytest.raises(trio.ClosedResourceError):
            await q2.send(b"x")
        nursery.cancel_scope.cancel()


async def test_receive_nowait_would_block(autojump_clock: object) -> None:
    async with open_universe("u") as u, trio.open_nursery() as nursery:
        server = u.add_broker("server")
        await nursery.start(server.serve_queues, 80, _noop)
        q = await u.add_broker("c").connect_queue("server", 80)
        with pytest.raises(trio.WouldBlock):
            q.receive_nowait()
        nursery.cancel_scope.cancel()


async def _noop(q: AsyncMessageQueue) -> None:
    await trio.sleep_forever()


async def test_send_many_and_receive_many_move_batches_in_order_through_backpressure(
        autojump_clock: object) -> None:
    async with open_universe("u", ring_capacity=256, high_water=2048) as u, \
            trio.open_nursery() as nursery:
        server, client = u.add_broker("server"), u.add_broker("client")
        got: list[bytes] = []
        batches: list[int] = []
        done = trio.Event()

        async def drain(q: AsyncMessageQueue) -> None:
            try:
                while True:
                    batch = await q.receive_many(100)
                    assert 1 <= len(batch) <= 100
                    batches.append(len(batch))
                    got.extend(batch)
            except trio.EndOfChannel:
                done.set()

        await nursery.start(partial(server.serve_queues, 80, drain, receive_buffer=64))
        q = await client.connect_queue("server", 80)
        sent = [b"%05d" % i + b"." * (i % 70) for i in range(10_000)]
        for start in range(0, len(sent), 1000):  # far past the high-water mark each time
            await q.send_many(sent[start:start + 1000])
        await q.aclose()
        await done.wait()
        assert got == sent
        assert max(batches) > 1  # batches, not one message per await
        nursery.cancel_scope.cancel()


async def test_a_cancelled_send_many_queued_a_whole_prefix_and_says_how_long(
        autojump_clock: object) -> None:
    async with slow_receiver() as (q, server_side, nursery):
        messages = [b"%04d" % i + b"." * 60 for i in range(1000)]
        sent = -1
        with trio.CancelScope() as scope:
            nursery.start_soon(_cancel_after, scope, 1.0)
            try:
                await q.send_many(messages)  # stuck behind backpressure
            except trio.Cancelled as exc:
                sent = exc.sent  # type: ignore[attr-defined]
                raise
        assert scope.cancelled_caught and 0 < sent < 1000
        with trio.CancelScope() as cancelled:  # a cancelled receive_many takes nothing
            cancelled.cancel()
            await server_side[0].receive_many()
        got: list[bytes] = []
        while len(got) < sent:
            got += await server_side[0].receive_many()
        assert got == messages[:sent]
        with trio.move_on_after(1):
            got += await server_side[0].receive_many()
        assert got == messages[:sent]  # and nothing after the prefix
        nursery.cancel_scope.cancel()


async def _cancel_after(scope: trio.CancelScope, seconds: float) -> None:
    await trio.sleep(seconds)
    scope.cancel()


@pytest.mark.parametrize("reader", ["reads", "stops reading"])
async def test_a_links_aclose_waits_for_its_last_bytes_or_says_it_gave_up(
        reader: str, autojump_clock: trio.testing.MockClock) -> None:
    """``ReconnectingLink.aclose`` returns True once every byte sent (the goodbye too) has
    left; a peer that stops reading holds the last bytes, and after ``timeout`` seconds
    it returns False instead of waiting for ever."""
    from brokermgr import ReconnectingLink
    from channels import ChannelManager, MessageQueue, StreamLink
    from pump import Pump

    pump = Pump()
    async with trio.open_nursery() as nursery:
        await nursery.start(pump.serve)
        ours, theirs = trio.testing.lockstep_stream_pair()
        channel = ChannelManager(pump, capacity=1024).open_end("me", "peer", 1)
        nursery.start_soon(StreamLink(channel, ours).run)
        link = ReconnectingLink(pump, lambda link: link.connected(MessageQueue(channel)),
                                name="peer")
        link.connect()
        link.send({"say": "x" * 3000})  # more than the ring and the stream hold at once
        received = bytearray()

        async def read() -> None:
            while data := await theirs.receive_some(500):
                received.extend(data)

        if reader == "reads":
            nursery.start_soon(read)
        start = trio.current_time()
        sent = await link.aclose(timeout=5)
        assert sent is (reader == "reads")
        assert trio.current_time() - start == (pytest.approx(5) if reader == "stops reading"
                                              else pytest.approx(0, abs=0.5))
        if reader == "reads":
            assert b"x" * 3000 in received and channel.sent_out
        else:
            assert not channel.sent_out
        nursery.cancel_scope.cancel()


async def test_an_async_call_on_a_pump_nothing_runs_fails_with_the_reason() -> None:
    """A BrokerManager built by hand whose pump nobody serves: a connect says so within
    a second instead of waiting for ever."""
    from brokermgr import BrokerManager
    from pump import ConfigError

    manager = BrokerManager("hand")
    manager.add_broker("server")
    with trio.fail_after(10), pytest.raises(ConfigError, match="nothing runs the pump of "
                                                               "universe 'hand'"):
        await manager.add_broker("client").connect_queue("server", 80)
    manager.close()


async def test_joining_managers_that_do_not_answer_is_an_os_error_naming_them() -> None:
    import socket

    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    with trio.fail_after(10), pytest.raises(OSError, match=f"no manager of universe 'far' "
                                                           f"accepted this process within "
                                                           f"0.5 s \\(dialled: 127.0.0.1:{port}"):
        async with open_universe("far", managers=[f"127.0.0.1:{port}"], connect_timeout=0.5):
            raise AssertionError("the block runs only once a manager accepted it")
