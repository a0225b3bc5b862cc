"""A fault link: an in-memory link whose two ends keep their own rings, with the bytes
moved between them, where a simulation's faults act.

An ordinary in-memory link shares its two rings between its ends: a write is
readable at once.  A *fault link* gives each end its own pair of rings; the
link moves bytes from one end's tx ring into the other end's rx ring as pump
tasks, and that is where a simulation acts on a link (see :mod:`rdvpump.testing`):
each direction can be **held** (nothing moves, nothing is lost), **delayed**
(bytes wait a time, in order, with seeded jitter), and the whole link can be
**cut** (both ends see it lost, with a reason).  Nothing here decides *when*:
that is the caller's policy.

Memory stays bounded: a direction takes at most one ring's capacity out of the
writer's ring into its delay line, so a held or delayed link pushes back on its
writer through the usual "ring full" path.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from ._cause import CloseCause

if TYPE_CHECKING:
    from pump import Pump, Timer

    from ._channel import Channel


class FaultLink:
    """The mover between two channels of one link (connector ``a``, acceptor ``b``).

    :attr:`ab` and :attr:`ba` are its two directions; :meth:`cut` ends it.
    """

    def __init__(self, pump: Pump, a: Channel, b: Channel) -> None:
        self.pump = pump
        self.a = a
        self.b = b
        #: What ``a`` writes, on its way to ``b``; and the other way.
        self.ab = Direction(self, a, b)
        self.ba = Direction(self, b, a)
        #: Why the link was cut, once it was.
        self.cut_reason: str | None = None
        a.attach_peer(_End(self.ab, self.ba))
        b.attach_peer(_End(self.ba, self.ab))

    def __repr__(self) -> str:
        return f"<FaultLink {self.a.trace_link} {self.a.local}<->{self.b.local}:{self.a.port}>"

    @property
    def link_id(self) -> int:
        return self.a.link_id

    @property
    def brokers(self) -> tuple[str, str]:
        """(connecting broker, accepting broker)."""
        return self.a.local, self.b.local

    @property
    def ended(self) -> bool:
        """Cut, or both directions ended by their writers."""
        return self.cut_reason is not None or (self.ab.finished and self.ba.finished)

    # -- pump owner protocol -----------------------------------------------------------

    def trace_ids(self) -> tuple[str | None, str | None, int | None, str | None]:
        return self.a.local, self.b.local, self.a.port, self.a.trace_link

    def task_failed(self, exc: BaseException) -> None:
        self.cut(f"relay failed: {exc!r}")

    # -- faults ------------------------------------------------------------------------

    def hold(self) -> None:
        """Stop both directions: bytes wait (in order) until :meth:`release`."""
        self.ab.held = self.ba.held = True

    def release(self) -> None:
        self.ab.release()
        self.ba.release()

    def cut(self, reason: str, cause: CloseCause = CloseCause.LOST) -> None:
        """End the link at once, as a broken connection does: what is in flight is lost,
        both ends read what already reached them and then see it closed with ``reason``."""
        if self.cut_reason is not None:
            return
        self.cut_reason = reason
        for way in (self.ab, self.ba):
            way.drop_staged()
        # each end: told only if it has not ended itself (Channel.peer_ended checks)
        self.a.peer_ended(reason, cause)
        self.b.peer_ended(reason, cause)


class Direction:
    """One way of a fault link: ``src``'s tx ring -> a delay line -> ``dst``'s rx ring."""

    def __init__(self, link: FaultLink, src: Channel, dst: Channel) -> None:
        self.link = link
        self.src = src
        self.dst = dst
        #: Nothing moves while held.
        self.held = False
        #: Seconds every byte waits, and the most that is added at random (seeded).
        self.delay = 0.0
        self.jitter = 0.0
        #: Chance that bytes taken from the writer are lost, which breaks the link (a
        #: lossy link: the message queue above never loses or reorders by itself).
        self.loss = 0.0
        self._line: deque[tuple[float, bytes]] = deque()  # (due, bytes), due non-decreasing
        self._line_bytes = 0
        self._last_due = 0.0
        self._posted = False
        self._timer: Timer | None = None
        self._src_end: tuple[str, CloseCause] | None = None
        #: Every byte written was moved and the end passed on (or the reader left).
        self.finished = False

    def release(self) -> None:
        if self.held:
            self.held = False
            self.schedule()

    # -- the mover's end of the channels' peer interface ------------------------------

    def schedule(self) -> None:
        if not self._posted and not self.finished:
            self._posted = True
            self.link.pump.post("relay", self._move, owner=self.link)

    def src_ended(self, reason: str, cause: CloseCause) -> None:
        self._src_end = (reason, cause)
        self.schedule()

    def dst_ended(self) -> None:
        """The reader left: what it did not read is gone (as when a process closes a
        socket with unread bytes)."""
        self.drop_staged()
        self.finished = True

    def drop_staged(self) -> None:
        self._line.clear()
        self._line_bytes = 0
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # -- moving ------------------------------------------------------------------------

    def _move(self) -> None:
        self._posted = False
        link = self.link
        if self.finished or self.held or link.cut_reason is not None:
            return
        pump = link.pump
        now = pump.now()
        src_ring, dst_ring, line = self.src.tx_ring, self.dst.rx_ring, self._line
        capacity = dst_ring.capacity
        while True:
            progress = False
            room = capacity - self._line_bytes
            if room > 0 and src_ring.used:
                data = src_ring.read(room)
                if self.loss and pump.random.random() < self.loss:
                    link.cut(f"dropped: the link lost {len(data)} bytes")
                    return
                due = now
                if self.delay or self.jitter:
                    due = now + self.delay + self.jitter * pump.random.random()
                due = self._last_due = max(due, self._last_due)  # never reorder
                line.append((due, data))
                self._line_bytes += len(data)
                self.src.room_freed()  # a writer waiting for room goes on
                progress = True
            while line and line[0][0] <= now:
                due, data = line[0]
                n = dst_ring.write(data)
                if not n:
                    break
                self._line_bytes -= n
                if n < len(data):
                    line[0] = (due, data[n:])
                else:
                    line.popleft()
                self.dst.data_arrived()
                progress = True
            if not progress:
                break
        if line and line[0][0] > now and self._timer is None:
            self._timer = pump.call_at(line[0][0], self._due, owner=link, kind="relay")
        if self._src_end is not None and not line and not src_ring.used:
            self.finished = True
            self.dst.peer_ended(*self._src_end)

    def _due(self) -> None:
        self._timer = None
        self.schedule()


class _End:
    """What one channel of a fault link sees as its peer."""

    __slots__ = ("out", "into")

    def __init__(self, out: Direction, into: Direction) -> None:
        self.out = out    # what this channel writes
        self.into = into  # what this channel reads

    def data_arrived(self) -> None:
        self.out.schedule()

    def room_freed(self) -> None:
        self.into.schedule()

    def peer_ended(self, reason: str, cause: CloseCause) -> None:
        self.out.src_ended(reason, cause)
        self.into.dst_ended()
