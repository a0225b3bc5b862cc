"""The trio face: connect_queue / accept_queue / serve_queues and awaitable queues."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from functools import partial

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

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
        # the refusal a program meets when it connects before its accept has run
        assert "a connect is never queued: bind first" in str(info.value)
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


async def test_accept_queue_binds_as_it_is_called_so_start_soon_then_connect_works(
        autojump_clock: object) -> None:
    """The embedding order a user writes first: ``start_soon(accept_queue)`` and at once
    ``connect_queue``, with no wait between: the port is bound when ``start_soon``
    returns, so the connect is not refused ``not bound``."""
    async with open_universe("u") as u, trio.open_nursery() as nursery:
        server, client = u.add_broker("server"), u.add_broker("client")
        got, accepted = trio.open_memory_channel[AsyncMessageQueue](1)

        async def accept(queue: Awaitable[AsyncMessageQueue]) -> None:
            await got.send(await queue)

        nursery.start_soon(accept, server.accept_queue(80))
        assert server.ports == [80]
        q = await client.connect_queue("server", 80)
        await q.send(b"ping")
        assert await (await accepted.receive()).receive() == b"ping"
        assert server.ports == []
        nursery.start_soon(server.accept_queue, 81)  # the coroutine is made by start_soon
        assert server.ports == [81]
        await client.connect_queue("server", 81)
        with trio.fail_after(1):
            while server.ports:
                await trio.sleep(0.01)


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
        # what the ring (three of these frames) could not hold, the receiver took ahead
        # into its buffer (four) while it did not ask, so the writer went on that far
        assert server_side[0].statistics().messages_received == 4
        assert sent == 4 + 3 + q.statistics().bytes_queued // 64
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


# -- the async face takes messages from the link as receive asks for them ---------------

_SIZES = st.sampled_from([0, 1, 60, 700, 5000, 9000, 20_000])
_SEND = st.one_of(st.tuples(st.just("send"), _SIZES),
                  st.tuples(st.just("send_many"), st.lists(_SIZES, min_size=1, max_size=5)),
                  st.tuples(st.just("send_nowait"), _SIZES),
                  st.tuples(st.just("sleep"), st.just(0)))
_RECEIVE = st.one_of(st.tuples(st.just("receive"), st.just(1)),
                     st.tuples(st.just("receive_many"), st.integers(1, 7)),
                     st.tuples(st.just("receive_nowait"), st.just(1)),
                     st.tuples(st.just("receive_many_nowait"), st.integers(1, 7)),
                     st.tuples(st.just("sleep"), st.just(0)))


@given(ring=st.sampled_from([64, 256, 4096, 1 << 16]), buffer=st.integers(1, 8),
       sends=st.lists(_SEND, min_size=1, max_size=30),
       receives=st.lists(_RECEIVE, min_size=1, max_size=10),
       traced=st.booleans())
def test_any_mix_of_sends_and_receives_delivers_each_message_once_in_order(
        ring: int, buffer: int, sends: list[tuple[str, object]],
        receives: list[tuple[str, int]], traced: bool) -> None:
    """One await per message, batches, the calls that do not wait and pauses, on both
    sides at once, with rings from 64 B (messages longer than the ring) to 64 KiB and
    receive buffers from one message: every message arrives once, in order, then the
    clean end.  Untraced, the receiving face takes messages from the link when it asks;
    traced, a read task delivers every arrival: both must give the same."""
    receives = [*receives, ("receive", 1)]  # one that waits: the end is seen
    sent: list[bytes] = []
    got: list[bytes] = []

    def message(size: int) -> bytes:
        n = len(sent)
        sent.append((b"%06d" % n + bytes([n % 251]) * size)[:max(size, 6)])
        return sent[-1]

    async def main(trace_dir: str | None) -> None:
        async with open_universe("u", ring_capacity=ring, high_water=1 << 15,
                                 trace_dir=trace_dir) as u, \
                trio.open_nursery() as nursery:
            server, client = u.add_broker("server"), u.add_broker("client")
            ended = trio.Event()

            async def consume(q: AsyncMessageQueue) -> None:
                try:
                    i = 0
                    while True:
                        what, n = receives[i % len(receives)]
                        i += 1
                        if what == "receive":
                            got.append(await q.receive())
                        elif what == "receive_many":
                            got.extend(await q.receive_many(n))
                        elif what == "receive_nowait":
                            with contextlib.suppress(trio.WouldBlock):
                                got.append(q.receive_nowait())
                            await trio.sleep(0)
                        elif what == "receive_many_nowait":
                            got.extend(q.receive_many_nowait(n))
                            await trio.sleep(0)
                        else:
                            await trio.sleep(0)
                except trio.EndOfChannel:
                    ended.set()

            await nursery.start(partial(server.serve_queues, 80, consume,
                                        receive_buffer=buffer))
            q = await client.connect_queue("server", 80)
            for what, arg in sends:
                if what == "send":
                    await q.send(message(arg))  # type: ignore[arg-type]
                elif what == "send_many":
                    await q.send_many([message(n) for n in arg])  # type: ignore[attr-defined]
                elif what == "send_nowait":
                    with contextlib.suppress(QueueFullError):
                        q.send_nowait(message(arg))  # type: ignore[arg-type]
                        continue
                    sent.pop()  # refused: not sent
                else:
                    await trio.sleep(0)
            await q.aclose()
            with trio.fail_after(60):
                await ended.wait()
            nursery.cancel_scope.cancel()

    with tempfile.TemporaryDirectory() as traces:
        trio.run(main, traces if traced else None,
                 clock=trio.testing.MockClock(autojump_threshold=0))
    assert got == sent


async def test_a_receiver_that_stops_inside_a_long_message_is_not_a_stalled_peer(
        autojump_clock: object) -> None:
    """A message longer than the ring arrives in pieces; the receiver took the first and
    stopped asking, so the rest waits in the ring: that is this side not reading, not the
    peer stalling mid-frame, and the link stays open past the stall timeout (30 s)."""
    async with slow_receiver() as (q, server_side, nursery):
        long = bytes(range(256)) * 8  # 2 KiB through a 256 B ring
        await q.send(long)
        await trio.testing.wait_all_tasks_blocked()
        receiver = server_side[0]
        with pytest.raises(trio.WouldBlock):
            receiver.receive_nowait()  # takes the first piece only
        await trio.sleep(100)
        assert receiver.close_reason is None
        assert await receiver.receive() == long
        await q.send(b"after")
        assert await receiver.receive() == b"after"
        nursery.cancel_scope.cancel()
