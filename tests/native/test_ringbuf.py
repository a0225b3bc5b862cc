"""The C ring buffer against the pure-Python reference, plus its contract at the edges."""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from channels import HEADER_SIZE, MAX_CAPACITY, MIN_CAPACITY, RingBuffer
from channels._ring import BATCH_BYTES, BATCH_FRAMES, FRAME_COMPLETE, FRAME_NONE, FRAME_PARTIAL
from pump import ConfigError

from .refring import RefRing

CAPACITIES = [1, 2, 4, 8, 64, 1024]


class RingVsReference(RuleBasedStateMachine):
    """Random interleavings of every operation give the reference's results."""

    def __init__(self) -> None:
        super().__init__()
        self.ring: RingBuffer | None = None
        self.ref: RefRing | None = None

    @initialize(cap=st.sampled_from(CAPACITIES))
    def new(self, cap: int) -> None:
        self.ring = RingBuffer(cap)
        self.ref = RefRing(cap)

    @rule(data=st.binary(max_size=300))
    def write(self, data: bytes) -> None:
        if self.ring is not None and self.ref is not None:
            assert self.ring.write(data) == self.ref.write(data)

    @rule(data=st.binary(max_size=300))
    def write_bytearray(self, data: bytes) -> None:
        if self.ring is not None and self.ref is not None:
            assert self.ring.write(bytearray(data)) == self.ref.write(data)

    @rule(n=st.integers(0, 400))
    def read(self, n: int) -> None:
        if self.ring is not None and self.ref is not None:
            assert self.ring.read(n) == self.ref.read(n)

    @rule(n=st.integers(0, 400))
    def readinto(self, n: int) -> None:
        if self.ring is not None and self.ref is not None:
            buf = bytearray(n)
            got = self.ring.readinto(buf)
            assert bytes(buf[:got]) == self.ref.read(n)

    @rule(n=st.integers(0, 400))
    def skip(self, n: int) -> None:
        if self.ring is not None and self.ref is not None:
            assert self.ring.skip(n) == self.ref.skip(n)

    @rule(data=st.binary(max_size=300))
    def write_through_region(self, data: bytes) -> None:
        """recv_into-style: fill the writable view, then commit."""
        if self.ring is not None and self.ref is not None:
            view = self.ring.writable_view()
            n = min(len(view), len(data))
            view[:n] = data[:n]
            view.release()
            assert self.ring.commit(n) == n
            assert self.ref.write(data[:n]) == n

    @rule(n=st.integers(0, 400))
    def read_through_region(self, n: int) -> None:
        """send-style: read the readable view, then skip what was used."""
        if self.ring is not None and self.ref is not None:
            view = self.ring.readable_view()
            k = min(len(view), n)
            got = bytes(view[:k])
            view.release()
            self.ring.skip(k)
            assert got == self.ref.read(k)

    @rule(bodies=st.lists(st.binary(max_size=60), min_size=1, max_size=10),
          max_bytes=st.integers(0, 200), max_count=st.integers(1, 12))
    def put_batch(self, bodies: list[bytes], max_bytes: int, max_count: int) -> None:
        """What the codec sends with: frames whole, in order, as many as fit."""
        if self.ring is not None and self.ref is not None:
            assert self.ring.put_batch(bodies, 0, max_bytes, max_count) == (
                self.ref.put_batch(bodies, 0, max_bytes, max_count))

    @rule(bodies=st.lists(st.binary(max_size=60), max_size=6), min_body=st.integers(0, 40))
    def put_each(self, bodies: list[bytes], min_body: int) -> None:
        """What the codec sends large bodies with: one frame per call."""
        if self.ring is not None and self.ref is not None:
            assert self.ring.put_each(bodies, 0, min_body) == (
                self.ref.put_each(bodies, 0, min_body))

    @rule(batch_body=st.integers(0, 120), max_body=st.integers(0, 120))
    def take_next(self, batch_body: int, max_body: int) -> None:
        """What the codec receives with: a batch of complete frames of at most
        ``batch_body`` bytes each, else one complete frame of at most ``max_body`` bytes
        lying in one run of the ring, else what the head frame is (nothing taken)."""
        if self.ring is not None and self.ref is not None:
            got = self.ring.take_next(batch_body, max_body)
            batch = self.ref.take_frames(BATCH_FRAMES, BATCH_BYTES, batch_body)
            if batch:
                assert got[0] is not None and (list(got[0]), got[1]) == (
                    batch, [len(b) for b in batch])
                return
            state, length = self.ref.head()
            if state == "complete" and length <= max_body and (
                    self.ref.contiguous() >= length + HEADER_SIZE):
                assert got[0] is not None
                assert (list(got[0]), got[1]) == (
                    self.ref.take_frames(1, length, max_body), [length])
                return
            status = {"none": FRAME_NONE, "partial": FRAME_PARTIAL,
                      "complete": FRAME_COMPLETE}[state]
            assert got == (None, status, length)

    @rule(max_frames=st.integers(1, 5), max_body=st.integers(0, 120))
    def take_whole(self, max_frames: int, max_body: int) -> None:
        """What a reader that pulls receives with: the complete frames at the head, each
        of at most ``max_body`` bytes, wherever they lie in the ring (the first alone
        takes one C call)."""
        if self.ring is not None and self.ref is not None:
            into: deque[bytes] = deque([b"before"])
            count = self.ring.take_whole(into, max_frames, max_body)
            assert list(into) == [b"before", *self.ref.take_frames(max_frames, BATCH_BYTES,
                                                                  max_body)]
            assert count == len(into) - 1

    @rule(body=st.binary(max_size=120))
    def put_frame(self, body: bytes) -> None:
        """What the async face sends a lone message with: one frame, whole or not at all."""
        if self.ring is not None and self.ref is not None:
            assert bool(self.ring.put_frame(body)) == self.ref.put_frame(body)

    @rule(times=st.integers(1, 3))
    def grow(self, times: int) -> None:
        """A receive ring that grows keeps its bytes, in order, and their counters."""
        if self.ring is not None and self.ref is not None and self.ring.capacity < 1 << 14:
            written, taken = self.ring.total_written, self.ring.total_read
            self.ring.grow(self.ring.capacity << times)
            self.ref.capacity <<= times
            assert self.ring.capacity == self.ref.capacity
            assert (self.ring.total_written, self.ring.total_read) == (written, taken)

    @invariant()
    def counts_agree(self) -> None:
        if self.ring is not None and self.ref is not None:
            assert self.ring.used == self.ref.used == len(self.ring)
            assert self.ring.free == self.ref.free


TestRingVsReference = RingVsReference.TestCase
TestRingVsReference.settings = settings(stateful_step_count=40,
                                        deadline=None)


@given(st.lists(st.binary(max_size=2000), max_size=40), st.sampled_from([4096, 1 << 16]))
def test_frames_round_trip_in_order(bodies: list[bytes], cap: int) -> None:
    """The codec's calls carry any bodies through the ring whole and in order."""
    ring = RingBuffer(cap)
    out: list[bytes] = []
    start = 0

    def drain() -> None:
        while (got := ring.take_next(cap, cap))[0] is not None:
            out.extend(got[0])

    for _ in range(10 * len(bodies) + 2):
        if start == len(bodies):
            break
        put, _ = ring.put_batch(bodies, start, 1 << 16, 64)
        start += put
        drain()
    drain()
    assert out == bodies


@given(st.integers(0, 300), st.integers(2, 50), st.sampled_from([None, 0, 1, 299]),
       st.sampled_from([0, 1, 17, 50]))
def test_a_batch_of_one_size_or_all_but_one_is_cut_as_it_was_put(
        size: int, count: int, last: int | None, odd_at: int) -> None:
    """Bodies of one size are cut in one unpack; one body of another size, anywhere in
    the batch (first, inside, last), sends it the general way: either way each take
    gives the bodies and their lengths as they were put."""
    bodies = [bytes([i % 251]) * size for i in range(count)]
    if last is not None:
        bodies[min(odd_at, count - 1)] = b"\xff" * last
    for taker in ("take_next", "take_whole"):
        ring = RingBuffer(1 << 16)
        assert ring.put_batch(bodies, 0, 1 << 16, 64)[0] == count
        if taker == "take_next":
            got = ring.take_next(1 << 16, 1 << 16)
            assert list(got[0] or []) == bodies and got[1] == [len(b) for b in bodies]
        else:
            into: deque[bytes] = deque()
            assert ring.take_whole(into, 64, 1 << 16) == count
            assert list(into) == bodies
        assert ring.used == 0


@pytest.mark.parametrize("cap", [0, 3, 6, 100, MAX_CAPACITY * 2, -4])
def test_capacity_must_be_a_power_of_two_in_range(cap: int) -> None:
    with pytest.raises(ValueError, match="power of two"):
        RingBuffer(cap)


@pytest.mark.parametrize("bad", [64, 32, 96, MAX_CAPACITY * 2, 128.0, True])
def test_a_ring_grows_only_to_a_larger_power_of_two_in_range(bad: object) -> None:
    ring = RingBuffer(64)
    ring.write(b"abc")
    with pytest.raises(ConfigError, match="grows to a power of two above 64"):
        ring.grow(bad)  # type: ignore[arg-type]
    assert ring.capacity == 64 and ring.read() == b"abc"


def test_capacity_limits_come_from_c() -> None:
    assert MIN_CAPACITY == 1
    assert RingBuffer(MIN_CAPACITY).capacity == 1
    with pytest.raises(TypeError):
        RingBuffer("64")  # type: ignore[arg-type]


def test_full_capacity_is_usable_and_wraps() -> None:
    ring = RingBuffer(8)
    assert ring.write(b"abcdefghij") == 8  # a ring of 8 holds 8 bytes, not 7
    assert ring.read(5) == b"abcde"
    assert ring.write(b"12345") == 5  # wraps round the end
    assert ring.readable_view().tobytes() == b"fgh"  # first contiguous run only
    assert ring.read() == b"fgh12345"


def test_writable_view_is_zero_copy_into_the_ring() -> None:
    ring = RingBuffer(16)
    view = ring.writable_view()
    assert len(view) == 16
    view[:3] = b"xyz"
    assert ring.used == 0  # nothing is visible until committed
    ring.commit(3)
    assert ring.read() == b"xyz"


def test_negative_counts_are_errors() -> None:
    ring = RingBuffer(8)
    with pytest.raises(ValueError):
        ring.skip(-1)
    with pytest.raises(ValueError):
        ring.commit(-1)


def test_frame_that_can_never_fit_is_refused_whole() -> None:
    ring = RingBuffer(8)
    assert ring.put_batch([b"12345"], 0, 1 << 16, 64) == (0, 0)  # 4 + 5 > 8
    assert ring.put_batch([b"12345", b"1"], 0, 1 << 16, 64) == (0, 0)
    assert ring.used == 0
    assert ring.put_batch([b"1234"], 0, 1 << 16, 64) == (1, 4)
    assert ring.take_next(0, 0) == (None, FRAME_COMPLETE, 4)  # too long to take here
    assert ring.take_next(4, 4) == ([b"1234"], [4])


def test_a_socket_is_read_and_written_across_the_wrap_in_one_call() -> None:
    import errno
    import socket

    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    try:
        ring = RingBuffer(8)
        assert ring.recv_from(a.fileno()) == -errno.EAGAIN  # nothing ready
        ring.write(b"xxxxx")
        ring.skip(5)  # the free space now wraps: 3 bytes at the end, 5 at the start
        b.send(b"abcdefghij")
        assert ring.recv_from(a.fileno()) == 8  # both runs, one call
        assert ring.recv_from(a.fileno()) == -errno.ENOBUFS  # full: nothing read
        assert ring.read(2) == b"ab"
        assert ring.recv_from(a.fileno()) == 2
        assert ring.send_to(a.fileno()) == 8  # both runs again
        assert ring.used == 0 and ring.send_to(a.fileno()) == 0
        assert b.recv(100) == b"cdefghij"
        b.close()
        assert ring.recv_from(a.fileno()) == 0  # end of stream
        ring.write(b"z")
        assert ring.send_to(a.fileno()) in (-errno.EPIPE, -errno.ECONNRESET)
        assert ring.used == 1  # nothing left, nothing dropped
    finally:
        a.close()
        b.close()


def test_writing_to_a_socket_whose_peer_is_gone_is_epipe_not_a_signal() -> None:
    # A process that restored SIGPIPE's default action (many CLI tools do) would die of
    # a plain write to a socket whose peer is gone; send_to reports -EPIPE instead.
    import subprocess
    import sys

    code = """if True:
        import errno, signal, socket
        from channels import RingBuffer
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        a, b = socket.socketpair()
        b.close()
        ring = RingBuffer(64)
        ring.write(b"x" * 10)
        first = ring.send_to(a.fileno())  # may still be taken, or already refused
        ring.write(b"y")
        second = ring.send_to(a.fileno())
        print(first in (10, -errno.EPIPE), second == -errno.EPIPE)
    """
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert (done.returncode, done.stdout) == (0, "True True\n"), done.stderr


def test_a_batch_always_takes_its_first_frame_and_then_keeps_to_the_byte_limit() -> None:
    ring = RingBuffer(64)
    assert ring.put_batch([b"a" * 10, b"b" * 10], 0, 15, 5) == (1, 10)  # 10 + 10 > 15
    assert ring.put_batch([b"c" * 20, b"d"], 0, 5, 5) == (1, 20)  # the first: over 5
    assert ring.put_batch([b"e", b"f", b"g"], 0, 1 << 16, 2) == (2, 2)  # max_count
    assert ring.take_next(64, 64) == ([b"a" * 10, b"c" * 20, b"e", b"f"], [10, 20, 1, 1])


def test_a_frame_that_ends_at_the_rings_end_is_taken_in_one_run() -> None:
    ring = RingBuffer(16)
    ring.write(b"x" * 8)
    ring.skip(8)  # the read position is 8: a frame of 4 + 4 bytes ends at the end
    assert ring.put_batch([b"abcd"], 0, 1 << 16, 64) == (1, 4)
    assert ring.take_next(0, 4) == ([b"abcd"], [4])  # one run: taken as it lies
    ring.write(b"y" * 9)
    ring.skip(9)  # now at 9 (mod 16): the same frame would wrap
    assert ring.put_batch([b"abcd"], 0, 1 << 16, 64) == (1, 4)
    assert ring.take_next(0, 4) == (None, FRAME_COMPLETE, 4)  # wraps: not taken here
    assert ring.take_next(4, 4) == ([b"abcd"], [4])  # the batch path copies across


def test_take_exact_copies_a_run_round_the_end_into_one_bytes() -> None:
    ring = RingBuffer(16)
    ring.write(b"x" * 12)
    ring.skip(12)  # the read position is 12: four bytes to the end, then the start
    assert ring.write(b"abcdefghij") == 10
    assert ring.take_exact(3) == b"abc"  # within the first run
    assert ring.take_exact(6) == b"defghi"  # one byte before the end, five after it
    with pytest.raises(ValueError, match="2 bytes asked of a ring holding 1"):
        ring.take_exact(2)
    assert ring.take_exact(1) == b"j" and ring.used == 0
    assert ring.take_exact(0) == b""
