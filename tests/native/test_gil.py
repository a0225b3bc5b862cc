"""The native modules keep the GIL across their calls: each is short and never waits,
and a release per call let another thread of the process (an MQ server's fsync thread)
take the GIL and the pump's thread wait to get it back."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from channels._ringbuf import ffi as ring_ffi
from channels._ringbuf import lib as ring_lib
from mq.storage._records import ffi as records_ffi
from mq.storage._records import lib as records_lib

#: Bytes each call goes over: tens of milliseconds of copying or checksumming.
BIG = 128 << 20


@pytest.fixture
def other_thread() -> Iterator[Callable[[], int]]:
    """A thread that counts while it holds the GIL, giving it up at every step; the
    switch interval so long that this thread keeps the GIL unless a call gives it up."""
    count = [0]
    started, stop = threading.Event(), threading.Event()

    def counter() -> None:
        started.set()
        while not stop.is_set():
            count[0] += 1
            time.sleep(0)  # gives the GIL up: the test's thread takes it

    interval = sys.getswitchinterval()
    thread = threading.Thread(target=counter)
    thread.start()
    assert started.wait(10)
    sys.setswitchinterval(60.0)
    try:
        yield lambda: count[0]
    finally:
        sys.setswitchinterval(interval)
        stop.set()
        thread.join()


def _counts_during(read: Callable[[], int], call: Callable[[], object]) -> int:
    before = read()
    call()
    return read() - before


def test_a_ring_call_keeps_the_gil(other_thread: Callable[[], int]) -> None:
    ring = ring_lib.rb_new(BIG)
    data = ring_ffi.new("char[]", BIG)
    try:
        assert _counts_during(other_thread, lambda: ring_lib.rb_write(ring, data, BIG)) == 0
        assert _counts_during(other_thread, lambda: ring_lib.rb_read(ring, data, BIG)) == 0
    finally:
        ring_lib.rb_free(ring)


def test_a_records_call_keeps_the_gil(other_thread: Callable[[], int]) -> None:
    data = records_ffi.new("unsigned char[]", BIG)
    for _ in range(4):
        assert _counts_during(other_thread, lambda: records_lib.rs_crc32(0, data, BIG)) == 0
