"""How a link ended is a type, on both ends: clean, aborted, lost, protocol error."""

from __future__ import annotations

import pytest
import trio

from channels import AsyncMessageQueue, ChannelManager, CloseCause, MessageQueue, QueueListener
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
