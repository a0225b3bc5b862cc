"""MessageQueue: whole messages in order, bounded memory, and bad input closing only its link."""

from __future__ import annotations

import contextlib
import tracemalloc

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from channels import (
    PROCESS_FRAME_BUDGET,
    ChannelManager,
    CloseCause,
    FrameBudget,
    MessageQueue,
    MessageTooLargeError,
    QueueFullError,
    QueueListener,
)
from pump import ListSink, Pump

from .helpers import Recorder, queue_pair

RING_SIZES = [1, 4, 64, 65536]  # 1 is the smallest ring the C code allows


class BatchRecorder(Recorder):
    """A listener with ``received_many``: the queue hands it lists, never one message."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[list[bytes]] = []

    def received(self, message: bytes) -> None:
        raise AssertionError("received() called on a listener with received_many()")

    def received_many(self, messages: list[bytes]) -> None:
        assert type(messages) is list and messages
        assert all(type(m) is bytes for m in messages)
        self.calls.append(messages)
        self.messages.extend(messages)


@pytest.mark.parametrize("batch", [False, True], ids=["received", "received_many"])
@pytest.mark.parametrize("capacity", RING_SIZES)
@given(messages=st.lists(st.binary(max_size=300), max_size=30),
       big=st.booleans())
def test_messages_arrive_whole_in_order_for_every_ring_size(
        capacity: int, batch: bool, messages: list[bytes], big: bool) -> None:
    if big:  # between small ones, a frame that is bigger than the ring, 1,000 times over
        # for the small rings (each byte its own pass through a 1-byte ring)
        size = min(70_000, 1_000 * capacity + 1_000)
        messages = [b"first", bytes(range(256)) * (size // 256 + 1), *messages]
    pump = Pump()
    qa, qb = queue_pair(pump, capacity)
    rec = BatchRecorder() if batch else Recorder()
    qb.set_listener(rec)
    qa.set_listener(QueueListener())
    for m in messages:
        qa.send(m)
    pump.run_until_idle()
    assert rec.messages == messages
    assert qb.statistics().messages_received == len(messages)
    assert qa.statistics().messages_sent == len(messages)
    if isinstance(rec, BatchRecorder) and messages and capacity == 65536 and not big:
        assert len(rec.calls) == 1  # what one read found: one call


def test_a_batch_listener_gets_the_whole_messages_before_a_bad_frame_then_the_close() -> None:
    pump = Pump()
    raw, side = ChannelManager(pump, capacity=4096).open_pair("evil", "victim", 1)
    queue = MessageQueue(side, max_message_size=1000, high_water=1000)
    rec = BatchRecorder()
    queue.set_listener(rec)
    good = b"".join(len(m).to_bytes(4, "big") + m for m in (b"one", b"two", b""))
    raw.write(good + (5000).to_bytes(4, "big") + b"junk")  # one read: good, then bad
    pump.run_until_idle()
    assert rec.calls == [[b"one", b"two", b""]]
    assert rec.reasons == ["protocol error: frame of 5000 bytes exceeds max_message_size 1000"]


@given(messages=st.lists(st.binary(max_size=200), min_size=1, max_size=20),
       cuts=st.lists(st.integers(1, 50), min_size=1, max_size=40),
       capacity=st.sampled_from([4, 16, 256, 4096]))
def test_frame_codec_survives_any_split_of_the_byte_stream(
        messages: list[bytes], cuts: list[int], capacity: int) -> None:
    """A raw channel writes the framed stream in random pieces; the queue rebuilds it."""
    pump = Pump()
    raw, side = ChannelManager(pump, capacity=capacity).open_pair("raw", "q", 1)
    queue = MessageQueue(side)
    rec = Recorder()
    queue.set_listener(rec)
    stream = b"".join(len(m).to_bytes(4, "big") + m for m in messages)
    pos = 0
    i = 0

    class Writer:
        def writable(self) -> None:
            push()

        def readable(self) -> None: ...
        def closed(self, reason: str) -> None: ...

    def push() -> None:
        nonlocal pos, i
        while pos < len(stream):
            piece = stream[pos:pos + cuts[i % len(cuts)]]
            i += 1
            n = raw.write(piece)
            pos += n
            if n < len(piece):
                return

    raw.set_listener(Writer())
    push()
    pump.run_until_idle()
    assert rec.messages == messages


def test_send_past_the_high_water_mark_raises_and_queues_nothing() -> None:
    pump = Pump()
    qa, qb = queue_pair(pump, 64, high_water=100, low_water=10)
    rec_a, rec_b = Recorder(), Recorder()
    qa.set_listener(rec_a)
    qb.set_listener(rec_b)
    qa.send(b"x" * 60)
    qa.send(b"y" * 40)
    with pytest.raises(QueueFullError, match="high-water mark of 100"):
        qa.send(b"z")
    assert isinstance(QueueFullError("x"), trio.WouldBlock)
    assert qa.statistics().bytes_queued == 100
    pump.run_until_idle()
    assert rec_a.drains == 1  # told once the backlog fell to the low-water mark
    qa.send(b"z")
    pump.run_until_idle()
    assert rec_b.messages == [b"x" * 60, b"y" * 40, b"z"]


def test_one_message_above_the_mark_may_go_when_nothing_is_queued() -> None:
    pump = Pump()
    qa, qb = queue_pair(pump, 64, high_water=100, max_message_size=1000)
    rec = Recorder()
    qb.set_listener(rec)
    qa.send(b"b" * 500)  # bigger than the mark, but the queue was empty
    with pytest.raises(QueueFullError):
        qa.send(b"c")
    pump.run_until_idle()
    assert rec.messages == [b"b" * 500]


def test_memory_stays_bounded_behind_a_slow_reader() -> None:
    pump = Pump()
    qa, qb = queue_pair(pump, 256, high_water=4096)
    qb.pause_reading()
    qb.set_listener(Recorder())
    sent = 0
    with pytest.raises(QueueFullError):
        for _ in range(100_000):
            qa.send(b"m" * 64)
            sent += 1
    pump.run_until_idle()
    assert sent < 100  # bounded by the mark, not by the number of attempts
    stats = qa.statistics()
    assert stats.bytes_queued <= 4096


def test_a_queue_kept_topped_up_lets_go_of_what_it_wrote() -> None:
    # The receiver's side sends the next message as each one arrives, so the sender's
    # queue never empties; every message written into the ring must still be let go,
    # or the process holds all it ever sent (measured: 800 MiB in an MQ producer).
    pump = Pump()
    size, total = 64 << 10, 400
    qa, qb = queue_pair(pump, 256 << 10, high_water=1 << 20)
    sent = [0]

    def send_one() -> None:
        qa.send(bytes(size))  # a fresh 64 KiB each time
        sent[0] += 1

    class Feeder(QueueListener):
        def __init__(self) -> None:
            self.got = 0

        def received(self, message: bytes) -> None:
            self.got += 1
            if sent[0] < total:
                send_one()

        def closed(self, reason: str) -> None:
            pass

    feeder = Feeder()
    qb.set_listener(feeder)
    qa.set_listener(Recorder())
    tracemalloc.start()
    try:
        for _ in range(16):  # the high-water mark's worth
            send_one()
        pump.run_until_idle()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert feeder.got == total
    # the mark (1 MiB) queued, as much written and held at most, a message being read:
    # a few MiB, where holding every message written would be 25 MiB
    assert peak < 6 << 20, f"peak {peak >> 20} MiB"


def test_oversized_and_non_bytes_messages_are_refused_before_queueing() -> None:
    pump = Pump()
    qa, _ = queue_pair(pump, 64, max_message_size=10, high_water=10)
    with pytest.raises(MessageTooLargeError, match="exceeds max_message_size 10"):
        qa.send(b"x" * 11)
    for bad in ("text", 42, None, [b"x"]):
        with pytest.raises(TypeError, match="message must be bytes"):
            qa.send(bad)  # type: ignore[arg-type]
    assert qa.statistics().messages_queued == 0


def test_bytearray_is_copied_when_sent() -> None:
    pump = Pump()
    qa, qb = queue_pair(pump, 64)
    rec = Recorder()
    qb.set_listener(rec)
    buf = bytearray(b"before")
    qa.send(buf)  # type: ignore[arg-type]  # bytes-like: accepted, copied
    qa.send(memoryview(b"view"))  # type: ignore[arg-type]
    buf[:] = b"AFTER!"
    pump.run_until_idle()
    assert rec.messages == [b"before", b"view"]


def test_a_received_length_above_the_maximum_closes_only_that_link() -> None:
    pump = Pump()
    cm = ChannelManager(pump, capacity=64)
    raw, side = cm.open_pair("evil", "victim", 1)
    bad_queue = MessageQueue(side, max_message_size=1000, high_water=1000)
    bad_rec = Recorder()
    bad_queue.set_listener(bad_rec)
    good_a, good_b = (MessageQueue(c) for c in cm.open_pair("a", "b", 2))
    good_rec = Recorder()
    good_b.set_listener(good_rec)
    raw.write((5000).to_bytes(4, "big") + b"junk")
    for i in range(50):
        good_a.send(b"ok %d" % i)
    pump.run_until_idle()
    assert bad_queue.closed
    assert bad_rec.reasons == ["protocol error: frame of 5000 bytes exceeds max_message_size 1000"]
    assert bad_rec.messages == []
    assert good_rec.messages == [b"ok %d" % i for i in range(50)]
    assert not good_a.closed and not good_b.closed
    with pytest.raises(trio.BrokenResourceError):
        raw.write(b"more")  # the bad peer sees its link gone


@pytest.mark.parametrize("capacity", [4, 64])
def test_a_stream_cut_mid_frame_is_a_protocol_error(capacity: int) -> None:
    pump = Pump()
    raw, side = ChannelManager(pump, capacity=capacity).open_pair("raw", "q", 1)
    queue = MessageQueue(side)
    rec = Recorder()
    queue.set_listener(rec)

    def feed(data: bytes) -> None:
        while data:
            data = data[raw.write(data):]
            pump.run_ready()  # no time passes: the peer is not stalling

    feed((3).to_bytes(4, "big") + b"one")
    feed((10).to_bytes(4, "big") + b"ab")  # 6 of the promised 14 bytes
    raw.disconnect("crashed")
    pump.run_until_idle()
    assert rec.messages == [b"one"]
    assert len(rec.reasons) == 1
    assert "stream cut mid-frame" in rec.reasons[0]


def test_close_flushes_what_was_sent_first_even_through_a_tiny_ring() -> None:
    pump = Pump()
    qa, qb = queue_pair(pump, 4)
    rec_a, rec_b = Recorder(), Recorder()
    qa.set_listener(rec_a)
    qb.set_listener(rec_b)
    msgs = [b"a" * 10, b"", b"c" * 33]
    for m in msgs:
        qa.send(m)
    qa.close()
    with pytest.raises(trio.ClosedResourceError):
        qa.send(b"late")
    pump.run_until_idle()
    assert rec_b.messages == msgs
    assert rec_b.reasons == ["peer disconnected (closed)"]
    assert rec_a.reasons == ["closed"]
    with pytest.raises(trio.BrokenResourceError):
        qb.send(b"to nobody")


def test_abort_reports_what_it_dropped() -> None:
    pump = Pump()
    qa, qb = queue_pair(pump, 64)
    rec_a = Recorder()
    qa.set_listener(rec_a)
    qb.set_listener(Recorder())
    for _ in range(3):
        qa.send(b"x")
    qa.abort("shutting down")
    pump.run_until_idle()
    assert rec_a.reasons == ["shutting down; 3 queued messages not sent"]


def test_messages_wait_in_the_ring_until_a_listener_is_set() -> None:
    pump = Pump()
    qa, qb = queue_pair(pump, 64)
    for i in range(20):
        qa.send(b"early %d" % i)
    pump.run_until_idle()
    rec = Recorder()
    qb.set_listener(rec)
    pump.run_until_idle()
    assert rec.messages == [b"early %d" % i for i in range(20)]


def test_listener_needs_received_and_closed() -> None:
    _, qb = queue_pair(Pump(), 64)

    class Half:
        def received(self, message: bytes) -> None: ...

    with pytest.raises(TypeError, match="lacks closed"):
        qb.set_listener(Half())


def test_a_raising_listener_closes_only_its_own_link() -> None:
    pump = Pump()
    cm = ChannelManager(pump, capacity=64)
    qa, qb = (MessageQueue(c) for c in cm.open_pair("a", "b", 1))
    qc, qd = (MessageQueue(c) for c in cm.open_pair("c", "d", 2))
    rec_a, rec_d = Recorder(), Recorder()
    qa.set_listener(rec_a)

    class Boom(Recorder):
        def received(self, message: bytes) -> None:
            raise RuntimeError("listener bug")

    boom = Boom()
    qb.set_listener(boom)
    qd.set_listener(rec_d)
    qa.send(b"trigger")
    qc.send(b"fine")
    pump.run_until_idle()
    assert qb.closed and boom.reasons == ["listener error: RuntimeError('listener bug')"]
    assert rec_a.reasons == ["peer disconnected (listener error: RuntimeError('listener bug'))"]
    assert rec_d.messages == [b"fine"] and not qd.closed
    assert pump.failures == 1


def test_pause_and_resume_reading() -> None:
    pump = Pump()
    qa, qb = queue_pair(pump, 65536)
    rec = Recorder()

    class Pausing(Recorder):
        def received(self, message: bytes) -> None:
            super().received(message)
            qb.pause_reading()

    p = Pausing()
    qb.set_listener(p)
    for i in range(5):
        qa.send(b"%d" % i)
    pump.run_until_idle()
    assert qb.statistics().reading_paused
    assert len(p.messages) == 5  # a pause takes effect after the current batch
    qa.send(b"later")
    pump.run_until_idle()
    assert len(p.messages) == 5
    qb.set_listener(rec)
    qb.resume_reading()
    pump.run_until_idle()
    assert rec.messages == [b"later"]


def test_send_and_deliver_are_traced_with_per_link_sequence_numbers() -> None:
    sink = ListSink()
    pump = Pump(trace=sink)
    qa, qb = queue_pair(pump, 64)
    qb.set_listener(Recorder())
    for m in (b"one", b"two", b"x" * 100):
        qa.send(m)
    pump.run_until_idle()
    sends = [(e.seq, e.size) for e in sink.events if e.kind == "send"]
    delivers = [(e.seq, e.size) for e in sink.events if e.kind == "deliver"]
    assert sends == delivers == [(1, 3), (2, 3), (3, 100)]
    # the link is named by its accepting end, the direction is connector -> acceptor
    assert {(e.link, e.dir) for e in sink.events if e.kind in ("send", "deliver")} == {
        ("b/1", "ca")}


def test_limits_are_validated() -> None:
    pump = Pump()
    a, _ = ChannelManager(pump, capacity=64).open_pair("a", "b", 1)
    with pytest.raises(ValueError, match="must not exceed max_message_size"):
        MessageQueue(a, max_message_size=10, high_water=100)
    with pytest.raises(ValueError, match="low_water"):
        MessageQueue(a, high_water=100, low_water=200)


def test_send_many_queues_in_order_and_stops_at_the_mark() -> None:
    pump = Pump()
    qa, qb = queue_pair(pump, 64, high_water=100, low_water=0)
    rec_a, rec_b = Recorder(), Recorder()
    qa.set_listener(rec_a)
    qb.set_listener(rec_b)
    batch = [b"%02d" % i + b"." * 8 for i in range(25)]  # 10 bytes each
    assert qa.send_many(batch) == 10  # the mark is 100 bytes
    with pytest.raises(QueueFullError):
        qa.send_many(batch[10:])
    pump.run_until_idle()
    assert rec_a.drains == 1
    assert qa.send_many(batch[10:20]) == 10
    pump.run_until_idle()
    assert qa.send_many(iter(batch[20:])) == 5
    assert qa.send_many([]) == 0
    pump.run_until_idle()
    assert rec_b.messages == batch


def test_send_many_checks_every_message() -> None:
    pump = Pump()
    qa, qb = queue_pair(pump, 64)
    rec = Recorder()
    qb.set_listener(rec)
    qa.send(b"first")
    with pytest.raises(TypeError):
        qa.send_many([b"ok", "not bytes"])  # type: ignore[list-item]
    assert qa.send_many([bytearray(b"ba"), b"b"]) == 2  # type: ignore[list-item]
    pump.run_until_idle()
    assert rec.messages == [b"first", b"ok", b"ba", b"b"]  # what passed the checks, in order


def test_both_sides_closing_at_once_with_full_rings_both_finish() -> None:
    pump = Pump()
    qa, qb = queue_pair(pump, 16)
    rec_a, rec_b = Recorder(), Recorder()
    qa.set_listener(rec_a)
    qb.set_listener(rec_b)
    for i in range(10):
        qa.send(b"a%d" % i * 5)
        qb.send(b"b%d" % i * 5)
    qa.close()
    qb.close()
    pump.run_until_idle()
    assert qa.closed and qb.closed
    assert len(rec_a.reasons) == len(rec_b.reasons) == 1


def test_a_closing_side_whose_peer_leaves_is_told_what_was_not_sent() -> None:
    pump = Pump()
    qa, qb = queue_pair(pump, 16)
    rec_a = Recorder()
    qa.set_listener(rec_a)
    qb.set_listener(Recorder())
    qb.pause_reading()
    for _i in range(10):
        qa.send(b"x" * 10)
    pump.run_until_idle()  # the ring is full; the rest waits in the queue
    qa.close()
    qb.abort("gone")
    pump.run_until_idle()
    assert qa.closed
    assert len(rec_a.reasons) == 1
    assert rec_a.reasons[0].startswith("peer disconnected (gone)")
    assert "queued messages not sent" in rec_a.reasons[0]


def test_errors_after_close_name_who_ended_the_link() -> None:
    pump = Pump()
    qa, qb = queue_pair(pump, 64)
    qa.set_listener(Recorder())
    qb.set_listener(Recorder())
    qa.close("bye now")
    pump.run_until_idle()
    with pytest.raises(trio.ClosedResourceError):
        qa.send(b"x")  # we closed it, whatever reason we gave
    with pytest.raises(trio.BrokenResourceError, match="bye now"):
        qb.send(b"x")  # the peer closed it


def _raw_pair(capacity: int, **options: object) -> tuple[Pump, object, MessageQueue, Recorder]:
    pump = Pump()
    raw, side = ChannelManager(pump, capacity=capacity).open_pair("raw", "q", 1)
    queue = MessageQueue(side, **options)  # type: ignore[arg-type]
    rec = Recorder()
    queue.set_listener(rec)
    return pump, raw, queue, rec


def test_a_peer_that_stalls_mid_frame_is_closed_after_the_stall_timeout() -> None:
    pump, raw, queue, rec = _raw_pair(64, stall_timeout=5.0)
    before = PROCESS_FRAME_BUDGET.held
    raw.write((1000).to_bytes(4, "big") + b"x" * 60)  # type: ignore[attr-defined]
    pump.run_for(4.0)
    raw.write(b"y" * 60)  # type: ignore[attr-defined]  # progress: the clock starts again
    pump.run_for(4.0)
    assert not queue.closed
    pump.run_for(1.5)
    assert queue.closed and queue.close_cause is CloseCause.PROTOCOL_ERROR
    assert rec.reasons == ["stalled mid-frame: 124 bytes of a frame, then nothing for 5 s"]
    assert PROCESS_FRAME_BUDGET.held == before  # its buffer left the budget


def test_a_paused_reader_is_not_a_stalled_peer() -> None:
    pump, raw, queue, rec = _raw_pair(64, stall_timeout=5.0)
    raw.write((1000).to_bytes(4, "big") + b"x" * 60)  # type: ignore[attr-defined]
    pump.run_ready()
    queue.pause_reading()
    pump.run_for(20.0)
    assert not queue.closed
    queue.resume_reading()
    rest = b"y" * 940
    while rest:
        rest = rest[raw.write(rest):]  # type: ignore[attr-defined]
        pump.run_ready()
    assert rec.messages == [b"x" * 60 + b"y" * 940] and not queue.closed


def test_a_frame_buffer_grows_with_the_bytes_that_arrive_not_the_declared_length() -> None:
    pump, raw, queue, rec = _raw_pair(64)
    before = PROCESS_FRAME_BUDGET.held
    raw.write((16 << 20).to_bytes(4, "big") + b"x" * 60)  # type: ignore[attr-defined]
    pump.run_ready()
    assert PROCESS_FRAME_BUDGET.held - before == 60  # not 16 MiB
    queue.close("bye")
    pump.run_ready()
    assert PROCESS_FRAME_BUDGET.held == before


def test_the_process_budget_closes_only_the_link_that_would_pass_it() -> None:
    budget = FrameBudget(limit=1000)
    pump = Pump()
    manager = ChannelManager(pump, capacity=64)
    links = []
    for n in range(3):
        raw, side = manager.open_pair(f"raw{n}", "q", n + 1)
        queue = MessageQueue(side)
        queue._decoder.budget = budget  # noqa: SLF001  # a small budget for this test
        rec = Recorder()
        queue.set_listener(rec)
        links.append((raw, queue, rec))
    for raw, _, _ in links:  # each declares 10,000 bytes and sends 400 of them
        with contextlib.suppress(trio.BrokenResourceError):  # the link closed meanwhile
            raw.write((10_000).to_bytes(4, "big") + b"x" * 60)
            pump.run_ready()
            for _ in range(5):
                raw.write(b"x" * 68)
                pump.run_ready()
    closed = [q for _, q, _ in links if q.closed]
    assert len(closed) == 1 and links[2][1].closed
    assert "budget of 1000 bytes for unfinished frames" in links[2][2].reasons[0]
    assert not links[0][1].closed and not links[1][1].closed


@pytest.mark.parametrize("how", ["peer disconnects", "close", "abort", "stall"])
def test_a_closed_queue_is_freed_without_the_cycle_collector(how: str) -> None:
    import gc
    import weakref

    gc.collect()
    gc.disable()
    try:
        pump, raw, queue, rec = _raw_pair(64, stall_timeout=1.0)
        raw.write((1 << 20).to_bytes(4, "big") + b"x" * 60)  # type: ignore[attr-defined]
        pump.run_ready()
        if how == "peer disconnects":
            raw.disconnect("bye")  # type: ignore[attr-defined]
        elif how == "close":
            queue.close()
        elif how == "abort":
            queue.abort()
        pump.run_until_idle()
        assert queue.closed and len(rec.reasons) == 1
        gone = weakref.ref(queue)
        del queue
        assert gone() is None, "the queue is kept by a reference cycle"
    finally:
        gc.enable()
