"""Channels: partial non-blocking writes, notifications, and the disconnect rule."""

from __future__ import annotations

import pytest
import trio

from channels import Channel, ChannelManager
from pump import Pump

from .helpers import ChanRecorder


def pair(capacity: int) -> tuple[Pump, Channel, Channel, ChanRecorder, ChanRecorder]:
    pump = Pump()
    a, b = ChannelManager(pump, capacity=capacity).open_pair("a", "b", 80)
    ra, rb = ChanRecorder(), ChanRecorder()
    a.set_listener(ra)
    b.set_listener(rb)
    return pump, a, b, ra, rb


@pytest.mark.parametrize("capacity", [1, 4, 64, 65536])
def test_partial_writes_and_room_notifications_move_every_byte(capacity: int) -> None:
    pump, a, b, _, _ = pair(capacity)
    payload = bytes(range(256)) * 40
    received = bytearray()
    sent = 0

    class Writer:
        def writable(self) -> None:
            nonlocal sent
            sent += a.write(payload[sent:])

        def readable(self) -> None: ...
        def closed(self, reason: str) -> None: ...

    class Reader:
        def readable(self) -> None:
            # edge-triggered: drain, in small reads to exercise partial reads
            while chunk := b.read(7):
                received.extend(chunk)

        def writable(self) -> None: ...
        def closed(self, reason: str) -> None: ...

    a.set_listener(Writer())
    b.set_listener(Reader())
    sent = a.write(payload)
    assert sent == min(capacity, len(payload))  # never blocks, may be partial
    pump.run_until_idle()
    assert bytes(received) == payload


def test_write_tells_the_reader_once_per_batch() -> None:
    pump, a, b, _, rb = pair(64)
    a.write(b"abc")
    a.write(b"def")
    pump.run_until_idle()
    assert rb.events == ["readable"]
    assert b.read() == b"abcdef"
    assert b.read() == b""


def test_writer_hears_writable_only_after_a_short_write() -> None:
    pump, a, b, ra, _ = pair(4)
    assert a.write(b"12") == 2
    b.read()
    pump.run_until_idle()
    assert "writable" not in ra.events
    assert a.write(b"123456") == 4
    b.read(1)
    pump.run_until_idle()
    assert ra.events.count("writable") == 1


def test_peer_reads_everything_written_before_a_disconnect_then_sees_the_close() -> None:
    pump, a, b, ra, rb = pair(64)
    a.write(b"last words")
    a.disconnect("bye")
    assert b.read(4) == b"last"
    assert not b.at_eof
    assert b.read() == b" words"
    assert b.at_eof
    assert b.read() == b""
    pump.run_until_idle()
    assert rb.events[-1] == "closed: peer disconnected (bye)"
    assert ra.events == ["closed: bye"]


def test_disconnected_side_fails_its_own_reads_and_writes() -> None:
    _, a, _, _, _ = pair(64)
    a.disconnect()
    a.disconnect()  # idempotent
    with pytest.raises(trio.ClosedResourceError):
        a.write(b"x")
    with pytest.raises(trio.ClosedResourceError):
        a.read()


def test_writing_to_a_disconnected_peer_raises_instead_of_dropping() -> None:
    _, a, b, _, _ = pair(64)
    a.disconnect("gone")
    with pytest.raises(trio.BrokenResourceError, match="gone"):
        b.write(b"into the void")


def test_close_waits_until_the_peer_has_drained() -> None:
    pump, a, b, _, rb = pair(64)
    b.set_listener(None)  # nobody reads yet
    a.write(b"pending")
    a.disconnect()
    pump.run_until_idle()
    assert rb.events == []
    b.set_listener(rb)
    pump.run_until_idle()
    assert rb.events == ["readable"]  # the bytes first
    assert b.read() == b"pending"
    pump.run_until_idle()
    assert rb.events[-1].startswith("closed: peer disconnected")


def test_close_reaches_a_listener_installed_late() -> None:
    pump, a, b, _, rb = pair(64)
    b.set_listener(None)
    a.disconnect("early")
    pump.run_until_idle()
    b.set_listener(rb)
    pump.run_until_idle()
    assert rb.events == ["closed: peer disconnected (early)"]


def test_bad_capacity_fails_when_the_manager_is_made() -> None:
    with pytest.raises(ValueError, match="power of two"):
        ChannelManager(Pump(), capacity=1000)
