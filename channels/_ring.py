"""The C ring buffer behind a small Python class; the only module that touches cffi.

Return codes become exceptions here and nowhere else; sizes come from C.  The
batched calls (:meth:`RingBuffer.take_next`, :meth:`RingBuffer.put_batch`)
move many small frames per C call for the frame codec.
"""

from __future__ import annotations

import os
import struct
import threading
from array import array
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial
from itertools import accumulate, pairwise
from typing import Any

from pump import ConfigError

from ._ringbuf import ffi, lib

MIN_CAPACITY: int = lib.RB_MIN_CAPACITY
MAX_CAPACITY: int = lib.RB_MAX_CAPACITY
HEADER_SIZE: int = lib.RB_HEADER_SIZE
FRAME_NONE: int = lib.RB_FRAME_NONE
FRAME_PARTIAL: int = lib.RB_FRAME_PARTIAL
FRAME_COMPLETE: int = lib.RB_FRAME_COMPLETE
_TAKE_MORE: int = lib.RB_TAKE_MORE  # added to a lone take's length when bytes follow it
#: Frames :meth:`RingBuffer.take_whole` takes one C call each before it batches the rest.
_LONE_TAKES = 2

#: Most frames moved by one batched C call.
BATCH_FRAMES = 1024
#: Scratch size of one batched take.
BATCH_BYTES = 1 << 17

_ffi_from_buffer = ffi.from_buffer
_ffi_buffer = ffi.buffer
_unpack = ffi.unpack
_take_frames = lib.rb_take_frames
_take_frame = lib.rb_take_frame
_frames_fit = lib.rb_frames_fit
_put_frames = lib.rb_put_frames
_frame_status = lib.rb_frame_status
_rb_used = lib.rb_used
_rb_free_space = lib.rb_free_space
_rb_put_frame = lib.rb_put_frame
_rb_readable_region = lib.rb_readable_region
_rb_skip = lib.rb_skip
_rb_recv_fd = lib.rb_recv_fd
_rb_send_fd = lib.rb_send_fd
_rb_send_frame = lib.rb_send_frame
#: Pieces of a body :func:`send_frame` sends in one call, at most.
SEND_PIECES = int(lib.RB_SEND_PIECES)
_lens_uniform = lib.rb_lens_uniform


#: Bytes, or a cffi buffer (``ffi.buffer``): sliced, either gives bytes.
Buffer = Any

#: Unpackers that split a batch of equal-sized bodies, by (size, count); cleared when
#: full (a Struct costs about a microsecond to make).
_SPLITTERS: dict[tuple[int, int], Callable[[bytes], tuple[bytes, ...]]] = {}
_MAX_SPLITTERS = 256


def split_bodies(data: Buffer, lens: list[int]) -> Sequence[bytes]:
    """``data`` (bodies joined: bytes, a memoryview or a cffi buffer) cut into bytes of the
    lengths ``lens``, in order.  Bodies of one size are cut by one ``struct`` unpack in C
    (faster than slicing in Python); others are slices (of one copy of a memoryview,
    whose own slices would be views)."""
    first, count = lens[0], len(lens)
    if lens.count(first) == count:
        return _split_uniform(data, first, count)
    if type(data) is memoryview:
        data = data.tobytes()
    return [data[a:b] for a, b in pairwise(accumulate(lens, initial=0))]


def _split_uniform(data: Buffer, size: int, count: int) -> tuple[bytes, ...]:
    """``data`` cut into ``count`` bytes of ``size`` each, by one ``struct`` unpack."""
    unpack = _SPLITTERS.get((size, count))
    if unpack is None:
        if len(_SPLITTERS) >= _MAX_SPLITTERS:
            _SPLITTERS.clear()
        unpack = _SPLITTERS[size, count] = struct.Struct(f"{size}s" * count).unpack
    return unpack(data)


def _taken(count: int) -> tuple[Sequence[bytes], list[int]]:
    """The bodies and lengths of ``count`` (at least two) frames just taken into the
    scratch buffer: when they are of one size (found in C), cut with no list of their
    lengths made from the C array first."""
    s = _scratch
    data = _ffi_buffer(s.out, s.used[0])
    if _lens_uniform(s.lens, count):
        size = s.lens[0]
        return _split_uniform(data, size, count), [size] * count
    lens: list[int] = _unpack(s.lens, count)
    return split_bodies(data, lens), lens


class _Scratch(threading.local):
    """Per-thread buffers for batched takes (a pump is single-threaded)."""

    def __init__(self) -> None:
        self.out = ffi.new("char[]", BATCH_BYTES)
        self.lens = ffi.new("uint32_t[]", BATCH_FRAMES)
        self.used = ffi.new("size_t *")
        self.len32 = ffi.new("uint32_t *")
        self.ptr = ffi.new("char **")


_scratch = _Scratch()


def _as_input(data: bytes | bytearray | memoryview) -> object:
    """What a ``const char *`` parameter accepts: bytes as they are, else a buffer view."""
    if type(data) is bytes:
        return data
    return _ffi_from_buffer(data)


class JoinedBodies:
    """Bodies joined once, with their lengths in C: frames of any run of them go into a
    ring in one C call (:meth:`RingBuffer.put_joined`), on as many rings as wanted.
    ``offsets[i]`` is where body ``i`` starts (``offsets[-1]``: every byte)."""

    __slots__ = ("data", "lens", "offsets")

    def __init__(self, bodies: Sequence[bytes]) -> None:
        lens = array("I", map(len, bodies))
        #: The joined bodies and their lengths, as cffi views (which hold them).
        self.data = _ffi_from_buffer(b"".join(bodies))
        self.lens = _ffi_from_buffer("uint32_t[]", lens)
        self.offsets = list(accumulate(lens, initial=0))

    def longest(self) -> int:
        """The longest body's length."""
        return max(self.lens, default=0)


class RingBuffer:
    """A single-producer single-consumer byte ring with power-of-two capacity.

    ``write`` and ``read`` move as much as fits and return counts; the region
    methods give zero-copy ``memoryview``s of the first contiguous run so a
    socket can ``send`` from or ``recv_into`` the ring; the frame methods (the
    calls of the channel's codec: ``put_batch``, ``put_each``, ``take_next``) move
    4-byte big-endian length-prefixed frames, whole or not at all.
    """

    __slots__ = ("_rb", "_capacity", "_ptr", "_base", "__weakref__")

    def __init__(self, capacity: int) -> None:
        if not isinstance(capacity, int) or isinstance(capacity, bool):
            raise TypeError(f"capacity must be an int, not {type(capacity).__name__}")
        rb = lib.rb_new(capacity) if MIN_CAPACITY <= capacity <= MAX_CAPACITY else ffi.NULL
        if rb == ffi.NULL:
            raise ConfigError(
                f"ring capacity must be a power of two from {MIN_CAPACITY} to {MAX_CAPACITY},"
                f" got {capacity}"
            )
        self._rb = ffi.gc(rb, lib.rb_free)
        self._capacity = capacity
        self._ptr = ffi.new("char **")
        lib.rb_writable_region(rb, self._ptr)  # empty: the run starts at the ring's start
        self._base = self._ptr[0]  # where a run that wraps round the end goes on

    @property
    def capacity(self) -> int:
        return self._capacity

    def grow(self, capacity: int) -> None:
        """Hold up to ``capacity`` bytes from now on (a power of two above the current
        capacity), keeping what the ring holds and its counters.  Only between reads and
        writes: a view of the ring taken before is not valid after.  ``ConfigError`` for
        a capacity that is not such a power of two; ``MemoryError`` if none is left
        (the ring is then as it was)."""
        if not isinstance(capacity, int) or not (
                self._capacity < capacity <= MAX_CAPACITY and capacity & (capacity - 1) == 0):
            raise ConfigError(f"a ring grows to a power of two above {self._capacity} and "
                              f"at most {MAX_CAPACITY}, not {capacity!r}")
        if lib.rb_grow(self._rb, capacity) != 0:
            raise MemoryError(f"no memory for a ring of {capacity} bytes")
        self._capacity = capacity
        self._base = lib.rb_base(self._rb)

    @property
    def used(self) -> int:
        """Bytes readable now."""
        return int(_rb_used(self._rb))

    def used_counter(self) -> Callable[[], int]:
        """A call that returns :attr:`used`, for a hot path: the C function bound to
        this ring, with no Python frame between."""
        return partial(_rb_used, self._rb)

    @property
    def free(self) -> int:
        """Bytes writable now."""
        return int(_rb_free_space(self._rb))

    @property
    def total_written(self) -> int:
        """Bytes ever written to the ring."""
        return int(lib.rb_total_written(self._rb))

    @property
    def total_read(self) -> int:
        """Bytes ever read from the ring."""
        return int(lib.rb_total_read(self._rb))

    def __len__(self) -> int:
        return int(lib.rb_used(self._rb))

    def __repr__(self) -> str:
        return f"<RingBuffer used={self.used}/{self._capacity}>"

    # -- byte stream -------------------------------------------------------------------

    def write(self, data: bytes | bytearray | memoryview) -> int:
        """Copy in as much of ``data`` as fits; return the count (0 when full)."""
        return int(lib.rb_write(self._rb, _as_input(data), len(data)))

    def read(self, n: int = -1) -> bytes:
        """Take up to ``n`` bytes (all readable bytes when ``n < 0``)."""
        avail = lib.rb_used(self._rb)
        if n < 0 or n > avail:
            n = avail
        if n == 0:
            return b""
        out = bytearray(n)
        lib.rb_read(self._rb, _ffi_from_buffer(out, require_writable=True), n)
        return bytes(out)

    def readinto(self, buf: bytearray | memoryview) -> int:
        """Take bytes into ``buf``; return the count."""
        n = len(buf) if not isinstance(buf, memoryview) else buf.nbytes
        if n == 0:
            return 0
        return int(lib.rb_read(self._rb, _ffi_from_buffer(buf, require_writable=True), n))

    def skip(self, n: int) -> int:
        """Drop up to ``n`` readable bytes; return the count dropped."""
        if n < 0:
            raise ValueError("cannot skip a negative count")
        return int(lib.rb_skip(self._rb, n))

    # -- zero-copy regions -------------------------------------------------------------

    def readable_view(self) -> memoryview:
        """The first contiguous readable run, as a view into the ring (no copy).

        Consume what you used with :meth:`skip`.  The view is only valid until
        the next write, read or skip.
        """
        n = lib.rb_readable_region(self._rb, self._ptr)
        return memoryview(_ffi_buffer(self._ptr[0], n))

    def take_run(self, n: int) -> bytes:
        """Up to ``n`` bytes of the first contiguous readable run, taken as ``bytes`` (one
        copy, no zeroed buffer first)."""
        avail = lib.rb_readable_region(self._rb, self._ptr)
        if n > avail:
            n = avail
        if n <= 0:
            return b""
        data: bytes = _ffi_buffer(self._ptr[0], n)[:]
        lib.rb_skip(self._rb, n)
        return data

    def take_exact(self, n: int) -> bytes:
        """Take exactly ``n`` readable bytes as one ``bytes``, copied once even where they
        wrap round the ring's end (``ValueError`` if fewer are readable)."""
        rb = self._rb
        first = lib.rb_readable_region(rb, self._ptr)
        if n <= first:
            data: bytes = _ffi_buffer(self._ptr[0], n)[:]
        else:
            if n > lib.rb_used(rb):
                raise ValueError(f"{n} bytes asked of a ring holding {lib.rb_used(rb)}")
            data = b"".join((_ffi_buffer(self._ptr[0], first),
                             _ffi_buffer(self._base, n - first)))
        lib.rb_skip(rb, n)
        return data

    def writable_view(self) -> memoryview:
        """The first contiguous free run, as a writable view into the ring (no copy).

        Fill it (``sock.recv_into(view)``), then publish with :meth:`commit`.
        """
        n = lib.rb_writable_region(self._rb, self._ptr)
        return memoryview(_ffi_buffer(self._ptr[0], n))

    def commit(self, n: int) -> int:
        """Publish ``n`` bytes written through :meth:`writable_view`."""
        if n < 0:
            raise ValueError("cannot commit a negative count")
        return int(lib.rb_commit(self._rb, n))

    # -- a descriptor ------------------------------------------------------------------

    def recv_from(self, fd: int) -> int:
        """Read from ``fd`` (a non-blocking socket) into the free space, both runs in one
        ``readv``, and publish what came: the count (> 0), 0 at end of stream, or a
        negative errno (``-EAGAIN``: nothing ready; ``-ENOBUFS``: the ring is full)."""
        return int(_rb_recv_fd(self._rb, fd))

    def send_to(self, fd: int) -> int:
        """Write the readable bytes to ``fd`` (a non-blocking socket), both runs in one
        ``sendmsg`` (``MSG_NOSIGNAL``; ``writev`` for other descriptors), and drop what
        left: the count (0 when empty), or a negative errno (``-EAGAIN``: the descriptor
        takes nothing now; ``-EPIPE``, not SIGPIPE, when a socket's peer is gone)."""
        return int(_rb_send_fd(self._rb, fd))

    # -- batches, for the frame codec --------------------------------------------------

    def take_next(self, batch_body: int, max_body: int
                  ) -> tuple[Sequence[bytes], list[int]] | tuple[None, int, int]:
        """The codec's hot path, one call per batch or big frame: the bodies and lengths of
        the complete frames at the head of at most ``batch_body`` bytes each, else the next
        frame if it is complete, at most ``max_body`` long and in one run (taken), else
        ``(None, status, body_length)`` of the frame at the head (nothing taken)."""
        s = _scratch
        rb = self._rb
        count = _take_frames(rb, s.out, BATCH_BYTES, s.lens, BATCH_FRAMES, batch_body, s.used)
        if count:  # cut straight out of the scratch buffer: one copy per body
            if count == 1:
                size = s.lens[0]
                return [_ffi_buffer(s.out, size)[:]], [size]
            return _taken(count)
        status = _frame_status(rb, s.len32)
        if status == FRAME_NONE:
            return None, status, -1
        length = int(s.len32[0])
        if (status == FRAME_COMPLETE and length <= max_body
                and _rb_readable_region(rb, s.ptr) >= length + HEADER_SIZE):
            body: bytes = _ffi_buffer(s.ptr[0] + HEADER_SIZE, length)[:]
            _rb_skip(rb, length + HEADER_SIZE)
            return [body], [length]
        return None, status, length

    def take_whole(self, into: deque[bytes], max_frames: int, max_body: int) -> int:
        """Append to ``into`` the bodies of the complete frames at the head, in order, while
        each is at most ``max_body`` long (at most ``max_frames`` of them): how many, 0
        when the head is not such a frame.  One copy per body; the first few frames cost
        one C call and the cut each (a lone frame: the call says nothing follows it), the
        rest go :data:`BATCH_FRAMES` (or :data:`BATCH_BYTES`) a call."""
        rb = self._rb
        out = _scratch.out
        if max_body > BATCH_BYTES:
            max_body = BATCH_BYTES  # what the scratch buffer holds
        n = _take_frame(rb, out, max_body)
        if n < 0:
            return 0
        taken = 1
        while n >= _TAKE_MORE and taken < max_frames:  # bytes follow this one
            into.append(_unpack(out, n - _TAKE_MORE))
            if taken == _LONE_TAKES:
                return taken + self._take_batched(into, max_frames - taken, max_body)
            n = _take_frame(rb, out, max_body)
            if n < 0:
                return taken
            taken += 1
        into.append(_unpack(out, n - _TAKE_MORE if n >= _TAKE_MORE else n))
        return taken

    def _take_batched(self, into: deque[bytes], max_frames: int, max_body: int) -> int:
        rb = self._rb
        s = _scratch
        taken = 0
        while taken < max_frames and _rb_used(rb):
            want = max_frames - taken
            count: int = _take_frames(rb, s.out, BATCH_BYTES, s.lens,
                                      want if want < BATCH_FRAMES else BATCH_FRAMES,
                                      max_body, s.used)
            if count == 1:
                into.append(_unpack(s.out, s.used[0]))
            elif count:
                into.extend(_taken(count)[0])
            else:
                break
            taken += count
        return taken

    def put_frame(self, body: bytes) -> int:
        """Put one frame of ``body`` if it fits whole: 1 if it did, else 0 (one C call)."""
        return _rb_put_frame(self._rb, body, len(body))  # type: ignore[no-any-return]

    def frame_putter(self) -> Callable[[bytes, int], int]:
        """:meth:`put_frame` as the C call itself, bound to this ring: ``put(body,
        len(body))`` (no Python frame between: the async face's send of one message)."""
        return partial(_rb_put_frame, self._rb)

    def put_each(self, bodies: Sequence[Any], start: int, min_body: int) -> tuple[int, int]:
        """Put ``bodies[start:]`` one frame per C call while each is a ``bytes`` longer
        than ``min_body`` that fits whole: ``(index of the first not put, body bytes
        put)``."""
        rb = self._rb
        i = start
        n = len(bodies)
        done = 0
        while i < n:
            body = bodies[i]
            ln = len(body)
            if ln <= min_body or type(body) is not bytes or not _rb_put_frame(rb, body, ln):
                break  # a small one, a Gather (moved in pieces), or no room
            done += ln
            i += 1
        return i, done

    def put_joined(self, joined: JoinedBodies, first: int, count: int) -> tuple[int, int]:
        """Put frames of ``count`` bodies of ``joined`` from body ``first``, in order,
        while they fit whole, in one C call: ``(frames put, body bytes put)``."""
        offsets = joined.offsets
        at = offsets[first]
        k = int(_put_frames(self._rb, joined.data + at, joined.lens + first, count))
        return k, offsets[first + k] - at

    def put_batch(self, bodies: Sequence[Any], start: int, max_bytes: int,
                  max_count: int) -> tuple[int, int]:
        """Put frames of ``bodies[start:]`` in order while they fit whole (at most
        ``max_bytes`` of bodies, ``max_count`` frames), in one C call: ``(frames put, body
        bytes put)``.  Only as many lengths are measured as could fit, judged by the first
        body's size: measuring a thousand lengths to move sixty costs more than the move.
        A :class:`~channels.Gather` is never among the frames put: it is longer than the
        codec's ``max_bytes``."""
        if len(bodies) - start == 1:  # one message (a request, a reply): one C call
            body = bodies[start]
            n = len(body)
            return (1, n) if _rb_put_frame(self._rb, body, n) else (0, 0)
        room = _rb_free_space(self._rb)
        first = len(bodies[start]) + HEADER_SIZE
        if first > room:
            return 0, 0  # not even the first frame fits whole
        fit = (room if room < max_bytes else max_bytes) // first + 1
        bodies = bodies[start:start + (fit if fit < max_count else max_count)]
        lens = _ffi_from_buffer("uint32_t[]", array("I", map(len, bodies)))
        k = _frames_fit(self._rb, lens, len(bodies), max_bytes)
        if k == 0:
            return 0, 0
        data = b"".join(bodies if k == len(bodies) else bodies[:k])
        _put_frames(self._rb, data, lens, k)
        return k, len(data)


def send_frame(fd: int, size: int, pieces: Sequence[Any]) -> int:
    """Send one frame straight to ``fd`` (a non-blocking socket), past any ring: its
    header (``size``) and its body's ``pieces`` (at most :data:`SEND_PIECES`), in one
    ``sendmsg`` (``MSG_NOSIGNAL``).  The bytes that left, the header's included (the rest
    is the caller's to send), or a negative errno (``-EAGAIN``: it takes nothing now)."""
    return int(_rb_send_frame(fd, size, [_ffi_from_buffer(p) for p in pieces],
                              [len(p) for p in pieces], len(pieces)))


#: Free memory the C library keeps at the top of its heap for the next large frame.
KEEP_FREED = 32 << 20
#: Blocks at least this long still get pages of their own, handed back when freed.
MAP_ABOVE = 4 << 20
#: Settings of the C library's allocator a user may have made: left as they are.
_ALLOCATOR_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_")


def keep_freed_memory(keep: int = KEEP_FREED, map_above: int = MAP_ABOVE) -> bool:
    """Have the C library reuse the memory large frames free, rather than give it back.

    A frame of a few hundred KiB (a produce of four 64 KiB messages, a delivery of
    as many) is copied out of its ring into a new ``bytes``.  glibc maps a block of
    128 KiB or more fresh and unmaps it when freed, and hands the top of its heap back
    to the kernel once more than twice that is free: every such frame then costs a
    page fault and a zeroed page every 4 KiB (measured: 46,000 faults a second in an MQ
    consumer at 64 KiB).  After this call up to ``keep`` bytes of freed memory stay
    mapped for the next frame, and only blocks of ``map_above`` bytes or more are
    mapped apart.  It is a setting of the whole process, so the library does not make
    it on its own: the ``rdvpump`` commands that run brokers make it, and an embedding
    process that moves large messages can.

    Returns whether it was set: not where the C library has no such setting, nor when
    the environment already sets glibc's allocator (``MALLOC_TRIM_THRESHOLD_`` and the
    like, or ``glibc.malloc`` tunables), which is left as the user made it.
    """
    if keep < 0 or map_above < 0:
        raise ConfigError("keep_freed_memory takes sizes of 0 bytes or more")
    if any(name in os.environ for name in _ALLOCATOR_SETTINGS) or (
            "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", "")):
        return False
    return bool(lib.rb_keep_freed(keep, map_above))
