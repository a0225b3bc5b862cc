"""The C ring buffer against the pure-Python reference, plus its contract at the edges."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from channels import HEADER_SIZE, MAX_CAPACITY, MIN_CAPACITY, RingBuffer
from channels._ring import FRAME_COMPLETE, FRAME_NONE, FRAME_PARTIAL

from .refring import RefRing

CAPACITIES = [1, 2, 4, 8, 64, 1024]


class RingVsReference(RuleBasedStateMachine):
    """Random interleavings of every operation give the reference's results."""

    def __init__(self) -> None:
        super().__init__()
        self.ring: RingBuffer | None = None
        self.ref: RefRing | None = None

    @rule(cap=st.sampled_from(CAPACITIES))
    def new(self, cap: int) -> None:
        if self.ring is None:
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
    def peek(self, n: int) -> None:
        if self.ring is not None and self.ref is not None:
            assert self.ring.peek(n) == self.ref.peek(n)

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

    @rule(body=st.binary(max_size=100))
    def put_frame(self, body: bytes) -> None:
        if self.ring is not None and self.ref is not None:
            assert self.ring.put_frame(body) == self.ref.put_frame(body)

    @rule(bodies=st.lists(st.binary(max_size=40), max_size=10))
    def put_frames(self, bodies: list[bytes]) -> None:
        if self.ring is not None and self.ref is not None:
            k = self.ring.put_frames(bodies)
            expected = 0
            for body in bodies:
                if not self.ref.put_frame(body):
                    break
                expected += 1
            assert k == expected

    @rule(max_count=st.integers(1, 5), max_bytes=st.integers(0, 200),
          max_body=st.integers(0, 120))
    def take_frames(self, max_count: int, max_bytes: int, max_body: int) -> None:
        if self.ring is not None and self.ref is not None:
            assert self.ring.take_frames(max_count, max_bytes, max_body) == (
                self.ref.take_frames(max_count, max_bytes, max_body))

    @invariant()
    def counts_agree(self) -> None:
        if self.ring is not None and self.ref is not None:
            assert self.ring.used == self.ref.used == len(self.ring)
            assert self.ring.free == self.ref.free
            status, length = self.ring.frame_status()
            data = self.ref.data
            if len(data) < HEADER_SIZE:
                assert (status, length) == (FRAME_NONE, -1)
            else:
                n = int.from_bytes(data[:4], "big")
                assert length == n
                complete = len(data) - HEADER_SIZE >= n
                assert status == (FRAME_COMPLETE if complete else FRAME_PARTIAL)


TestRingVsReference = RingVsReference.TestCase
TestRingVsReference.settings = settings(stateful_step_count=40,
                                        deadline=None)


@given(st.lists(st.binary(max_size=2000), max_size=40), st.sampled_from([4096, 1 << 16]))
def test_frames_round_trip_in_order(bodies: list[bytes], cap: int) -> None:
    ring = RingBuffer(cap)
    out: list[bytes] = []
    pending = list(bodies)
    for _ in range(10 * len(bodies) + 2):
        k = ring.put_frames(pending)
        pending = pending[k:]
        out += ring.take_frames()
        if not pending:
            break
    out += ring.take_frames()
    assert out == bodies


@pytest.mark.parametrize("cap", [0, 3, 6, 100, MAX_CAPACITY * 2, -4])
def test_capacity_must_be_a_power_of_two_in_range(cap: int) -> None:
    with pytest.raises(ValueError, match="power of two"):
        RingBuffer(cap)


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
    assert not ring.put_frame(b"12345")  # 4 + 5 > 8
    assert ring.used == 0
    assert ring.put_frame(b"1234")
    assert ring.frame_status() == (FRAME_COMPLETE, 4)


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
