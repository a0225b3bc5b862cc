"""How a link ended is a type, on both ends: clean, aborted, lost, protocol error."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio
import trio.testing

from channels import (
    AsyncMessageQueue,
    Channel,
    ChannelManager,
    CloseCause,
    MessageQueue,
    QueueListener,
    StreamLink,
    close_frame,
)
from pump import Pump

from .helpers import Recorder, queue_pair


def test_a_clean_close_is_clean_on_both_ends() -> None:
    pump = Pump()
    qa, qb = queue_pair(pump, 64)
    ra, rb = Recorder(), Recorder()
    qa.set_listener(ra)
    qb.set_listener(rb)
    assert qa.close_cause is None
    qa.send(b"last words")
    qa.close("done")
    pump.run_until_idle()
    assert rb.messages == [b"last words"]
    assert qa.close_cause is CloseCause.CLEAN and qb.close_cause is CloseCause.CLEAN
    assert qa.closed_here and not qb.closed_here


def test_an_abort_is_aborted_on_both_ends() -> None:
    pump = Pump()
    qa, qb = queue_pair(pump, 64)
    qa.set_listener(Recorder())
    qb.set_listener(Recorder())
    qa.abort("stop")
    pump.run_until_idle()
    assert qa.close_cause is CloseCause.ABORTED and qb.close_cause is CloseCause.ABORTED


def test_a_listener_that_raises_aborts_its_link_only() -> None:
    pump = Pump()
    qa, qb = queue_pair(pump, 64)

    class Faulty(QueueListener):
        def received(self, message: bytes) -> None:
            raise RuntimeError("boom")

    qb.set_listener(Faulty())
    qa.set_listener(Recorder())
    qa.send(b"x")
    pump.run_until_idle()
    assert qb.close_cause is CloseCause.ABORTED and "boom" in (qb.close_reason or "")
    assert qa.close_cause is CloseCause.ABORTED


def test_a_frame_above_the_limit_is_a_protocol_error_even_when_small() -> None:
    pump = Pump()
    raw, side = ChannelManager(pump, capacity=4096).open_pair("raw", "q", 1)
    queue = MessageQueue(side, max_message_size=100, high_water=100)
    rec = Recorder()
    queue.set_listener(rec)
    raw.write((101).to_bytes(4, "big") + b"x" * 101)
    pump.run_until_idle()
    assert rec.messages == []
    assert queue.close_cause is CloseCause.PROTOCOL_ERROR
    assert "frame of 101 bytes exceeds max_message_size 100" in rec.reasons[0]
    assert raw.peer_cause is CloseCause.PROTOCOL_ERROR


async def test_the_async_face_tells_a_clean_end_from_a_broken_one() -> None:
    pump = Pump()
    async with trio.open_nursery() as nursery:
        await nursery.start(pump.serve)
        qa, qb = queue_pair(pump, 64)
        a, b = AsyncMessageQueue(qa), AsyncMessageQueue(qb)
        await a.send(b"one")
        await a.aclose()
        assert [m async for m in b] == [b"one"]  # EndOfChannel ends the loop
        assert b.close_cause is CloseCause.CLEAN
        qc, qd = queue_pair(pump, 64)
        c, d = AsyncMessageQueue(qc), AsyncMessageQueue(qd)
        qc.abort("gone")
        with pytest.raises(trio.BrokenResourceError, match="gone"):
            await d.receive()
        assert d.close_cause is CloseCause.ABORTED
        with pytest.raises(trio.ClosedResourceError):
            await a.receive()
        del c
        nursery.cancel_scope.cancel()


async def test_aclose_says_when_messages_sent_never_went_into_a_link_that_ended() -> None:
    """Messages ``send`` queued behind a full ring are lost when the peer goes: the first
    ``aclose`` raises ``BrokenResourceError`` counting them (a sender that only awaited
    ``send`` would not know), a second returns quietly; ``async with`` lets the block's
    own exception through instead; after this side's own abort nothing is raised."""
    pump = Pump()
    async with trio.open_nursery() as nursery:
        await nursery.start(pump.serve)

        async def stuck() -> tuple[AsyncMessageQueue, MessageQueue, MessageQueue]:
            """A sender with messages queued behind a 64-byte ring its peer stopped
            reading (it holds one message for ``receive``)."""
            qa, qb = queue_pair(pump, 64)
            a, b = AsyncMessageQueue(qa), AsyncMessageQueue(qb, receive_buffer=1)
            for i in range(20):
                a.send_nowait(b"%02d" % i * 8)
            await trio.testing.wait_all_tasks_blocked()
            assert qa.statistics().messages_queued > 0 and b.receive_nowait() == b"00" * 8
            return a, qa, qb

        a, qa, qb = await stuck()
        qb.abort("peer crashed")
        with pytest.raises(trio.BrokenResourceError) as raised:
            await a.aclose()
        assert qa.unsent > 0 and str(raised.value) == (
            f"peer disconnected (peer crashed); {qa.unsent} queued messages not sent")
        await a.aclose()  # said once
        a, qa, qb = await stuck()
        with pytest.raises(KeyError):
            async with a:
                qb.abort("peer crashed")
                raise KeyError("the block's own")
        a, qa, qb = await stuck()
        qa.abort("given up")
        await a.aclose()
        assert qa.unsent == 0 and "queued messages not sent" in (qa.close_reason or "")
        nursery.cancel_scope.cancel()


def _over_a_stream(pump: Pump, nursery: trio.Nursery
                   ) -> tuple[AsyncMessageQueue, Channel, trio.StapledStream[Any, Any]]:
    """A queue whose link runs over a lockstep stream (1 KiB rings): the queue, its
    channel and the stream's far end."""
    ours, theirs = trio.testing.lockstep_stream_pair()
    channel = ChannelManager(pump, capacity=1024).open_end("me", "peer", 1)
    nursery.start_soon(StreamLink(channel, ours).run)
    return AsyncMessageQueue(MessageQueue(channel)), channel, theirs


async def test_aclose_and_wait_sent_return_only_once_the_transport_sent_every_byte() -> None:
    """Over a stream, a queue's close completes when its last bytes reach the ring; the
    process may end only once the transport has sent them: ``wait_sent`` (and the async
    face's ``aclose``) wait for that.  A lockstep stream moves bytes only as the test
    reads them, so nothing here depends on timing."""
    pump = Pump()
    async with trio.open_nursery() as nursery:
        await nursery.start(pump.serve)
        queue, channel, theirs = _over_a_stream(pump, nursery)
        for i in range(4):
            await queue.send(bytes([i]) * 300)  # 1,216 bytes: more than the ring holds
        closed = trio.Event()

        async def close() -> None:
            await queue.aclose()
            closed.set()

        nursery.start_soon(close)
        received = b""
        while not channel.disconnected:  # the queue's close completes (bytes in the ring)
            received += await theirs.receive_some(100)
        await trio.testing.wait_all_tasks_blocked()
        assert not channel.sent_out and not closed.is_set()  # the ring still holds some
        while not closed.is_set():
            received += await theirs.receive_some(100)
            await trio.testing.wait_all_tasks_blocked()
        assert channel.sent_out
        await queue._queue.wait_sent()  # noqa: SLF001 (the listener face's twin returns too)
        frames = [received[i * 304 + 4:(i + 1) * 304] for i in range(4)]
        assert frames == [bytes([i]) * 300 for i in range(4)]
        assert received[4 * 304:].startswith(close_frame("closed", "clean")[:4])
        nursery.cancel_scope.cancel()


async def _returns_at_once(nursery: trio.Nursery, wait: Callable[[], Awaitable[None]]
                           ) -> bool:
    """Whether ``wait()`` has returned once every task is blocked."""
    returned = trio.Event()

    async def run() -> None:
        await wait()
        returned.set()

    nursery.start_soon(run)
    await trio.testing.wait_all_tasks_blocked()
    return returned.is_set()


async def test_wait_sent_returns_at_once_once_the_peer_ended_the_link() -> None:
    """A queue whose peer ended the link (its connection lost, or a clean close in memory)
    has nothing left to send: closing it and waiting for what it sent returns at once,
    where it used to wait out the caller's whole timeout (a manager stopping after one
    of its brokers was killed)."""
    pump = Pump()
    async with trio.open_nursery() as nursery:
        await nursery.start(pump.serve)
        queue, channel, theirs = _over_a_stream(pump, nursery)
        await theirs.aclose()  # the connection is gone: no close frame ever came
        with pytest.raises(trio.BrokenResourceError):
            await queue.receive()
        assert queue.close_cause is CloseCause.LOST
        assert await _returns_at_once(nursery, queue.aclose)
        assert channel.sent_out
        nursery.cancel_scope.cancel()

    pump = Pump()
    qa, qb = queue_pair(pump, 64)
    qa.set_listener(Recorder())
    qb.set_listener(Recorder())
    async with trio.open_nursery() as nursery:
        await nursery.start(pump.serve)
        qb.close("done")
        assert await _returns_at_once(nursery, qa.wait_sent)
        assert qa.close_cause is CloseCause.CLEAN and not qa.closed_here
        nursery.cancel_scope.cancel()


#: A link over real TCP whose peer is gone, in a process with SIGPIPE at its default
#: action: the link must end as lost, and the process live on.
_SIGPIPE_DFL = """if True:
    import signal, socket
    import trio
    from channels import ChannelManager, MessageQueue, StreamLink
    from pump import Pump

    signal.signal(signal.SIGPIPE, signal.SIG_DFL)

    class Ends:
        reason = None

        def received(self, message): pass
        def drained(self): pass
        def closed(self, reason): self.reason = reason

    async def main():
        pump = Pump()
        listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
        ours = await trio.open_tcp_stream("127.0.0.1", listener.socket.getsockname()[1])
        theirs = await listener.accept()
        theirs.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\\1\\0\\0\\0\\0\\0\\0\\0")
        await theirs.aclose()  # a reset: the peer is gone
        async with trio.open_nursery() as nursery:
            await nursery.start(pump.serve)
            channel = ChannelManager(pump).open_end("me", "peer", 1)
            queue = MessageQueue(channel)
            ends = Ends()
            queue.set_listener(ends)
            link = StreamLink(channel, ours)
            nursery.start_soon(link.run)
            with trio.fail_after(10):
                while ends.reason is None:
                    try:
                        queue.send(b"x" * 1000)
                    except Exception:
                        pass
                    await trio.sleep(0.001)
            print("connection lost" in ends.reason)
            nursery.cancel_scope.cancel()

    trio.run(main)
"""


def test_a_lost_peer_is_a_lost_link_not_a_signal_even_with_sigpipe_at_its_default() -> None:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _SIGPIPE_DFL], capture_output=True,
                          text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, "True\n"), done.stderr
