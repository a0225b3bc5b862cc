"""The bodies a cluster's root sent a relaying server last, which it names again rather
than send again (:class:`Stretch`).

A root hands each consume group its messages as the group's credits allow.  The groups
a relaying server serves share a frame while they are handed the same messages at once;
once one of them waits for credits (its consumers are slower), it is handed its
messages later, on its own, and each such group would cost the root the same bodies
again, and the relaying server as much to take them in.  So both ends of the link keep,
for each topic, the last consecutive stretch of messages the root sent with their
bodies (at most :data:`STRETCH_BYTES` of bodies); a run the stretch holds goes as a
``messages`` frame that names its first offset and count and says ``cached``, without
columns or bodies, and the relaying server takes them from what it kept.

Each end decides from the frames alone, by one rule (:meth:`Stretch.add`), so the two
agree without a word between them: a frame *extends* the stretch when it carries its
bodies, its offsets are consecutive (the ``offsets`` column is one integer) and every
message in it is a first delivery (the ``deliveries`` column is the integer 1); it
extends it when it starts where the stretch ends, starts it afresh when it starts past
the end, and leaves it as it is when it starts inside (a message sent again).  Whole
frames leave from the front once the stretch holds more than its budget.  The link's
frames keep their order, so what the root knows it sent is what the server has; a link
that closes takes its stretches with it, at both ends.

A link's stretches also share one budget, :data:`LINK_STRETCH_BYTES` (:class:`Stretches`):
past it, the stretches of the topics whose frames came least recently are let go,
whole.  Both ends see the link's frames in one order, so they let go of the same ones
at the same frame, again without a word: a relaying server's memory for stretches is
bounded however many shared topics it serves.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Generic, TypeVar

__all__ = ["LINK_STRETCH_BYTES", "STRETCH_BYTES", "Stretch", "Stretches", "extends"]

#: Bytes of bodies a stretch holds at most (its last frame may take it past this): a
#: relaying server keeps this much of each shared topic for the groups behind.
STRETCH_BYTES = 8 << 20
#: Bytes of bodies the stretches of one link hold together at most (each one's last
#: frame may take them past this): a relaying server's memory for them.
LINK_STRETCH_BYTES = 64 << 20

T = TypeVar("T")


def extends(header: dict[str, Any]) -> bool:
    """Whether a ``messages`` frame with ``header`` (its columns) may extend a stretch:
    consecutive offsets, all first deliveries (see the module)."""
    deliveries = header["deliveries"]
    return type(header["offsets"]) is int and type(deliveries) is int and deliveries == 1


class Stretch(Generic[T]):
    """The last consecutive stretch of a topic's messages sent on one link with their
    bodies: a list of frames, each ``(first, count, bytes, item)`` (``item``: what an
    end keeps of the frame; the root keeps nothing, the relaying server the frame)."""

    __slots__ = ("budget", "frames", "size")

    def __init__(self, budget: int | None = None) -> None:
        self.budget = STRETCH_BYTES if budget is None else budget
        self.frames: deque[tuple[int, int, int, T]] = deque()
        self.size = 0

    @property
    def end(self) -> int:
        """The offset after the stretch (0 when empty)."""
        if not self.frames:
            return 0
        first, count, _, _ = self.frames[-1]
        return first + count

    def add(self, first: int, count: int, size: int, item: T) -> None:
        """A frame of ``count`` consecutive offsets from ``first`` and ``size`` bytes of
        bodies went on the link (one that :func:`extends` a stretch)."""
        frames = self.frames
        if frames:
            end = self.end
            if first < end:
                return  # sent again (a redelivery, a group behind): not kept twice
            if first > end:
                frames.clear()
                self.size = 0
        frames.append((first, count, size, item))
        self.size += size
        while self.size > self.budget and len(frames) > 1:
            self.size -= frames.popleft()[2]

    def held(self, first: int, count: int) -> int:
        """How many of ``count`` offsets from ``first`` the stretch holds, from ``first``
        on (0 if it does not hold ``first``)."""
        frames = self.frames
        if not frames or first < frames[0][0]:
            return 0
        return max(0, min(count, self.end - first))

    def pieces(self, first: int, count: int) -> list[tuple[T, int, int]]:
        """The frames that hold ``count`` offsets from ``first``: ``(item, index of
        first in it, how many)`` each, in order; ValueError if the stretch does not hold
        them all."""
        if count < 1 or self.held(first, count) != count:
            raise ValueError(f"offsets {first}..{first + count - 1} are not held "
                             f"(held: {self.describe()})")
        pieces = []
        at, left = first, count
        for start, n, _, item in self.frames:
            if start + n <= at:
                continue
            take = min(left, start + n - at)
            pieces.append((item, at - start, take))
            at += take
            left -= take
            if not left:
                break
        return pieces

    def describe(self) -> str:
        if not self.frames:
            return "none"
        return f"{self.frames[0][0]}..{self.end - 1}"

    def clear(self) -> None:
        self.frames.clear()
        self.size = 0


class Stretches(Generic[T]):
    """The stretches of one link, by topic, within the link's budget (see the module):
    each end of the link keeps one, and calls :meth:`add` for the same frames in the
    same order."""

    __slots__ = ("_by_topic", "budget", "size")

    def __init__(self, budget: int | None = None) -> None:
        self.budget = LINK_STRETCH_BYTES if budget is None else budget
        #: by topic, the one a frame extended least recently first
        self._by_topic: dict[str, Stretch[T]] = {}
        #: bytes of bodies of them all
        self.size = 0

    def add(self, topic: str, first: int, count: int, size: int, item: T) -> None:
        """:meth:`Stretch.add` to ``topic``'s stretch (made the first time), which is
        then the one added to last; then, past the budget, the others let go, those
        added to least recently first."""
        by_topic = self._by_topic
        stretch = by_topic.pop(topic, None)
        if stretch is None:
            stretch = Stretch(min(STRETCH_BYTES, self.budget))
        by_topic[topic] = stretch
        before = stretch.size
        stretch.add(first, count, size, item)
        self.size += stretch.size - before
        while self.size > self.budget and len(by_topic) > 1:
            oldest = next(iter(by_topic))
            self.size -= by_topic.pop(oldest).size

    def held(self, topic: str, first: int, count: int) -> int:
        """:meth:`Stretch.held` of ``topic``'s stretch (0 when it has none)."""
        stretch = self._by_topic.get(topic)
        return 0 if stretch is None else stretch.held(first, count)

    def pieces(self, topic: str, first: int, count: int) -> list[tuple[T, int, int]]:
        """:meth:`Stretch.pieces` of ``topic``'s stretch; ValueError if it does not hold
        them all (or there is none)."""
        stretch = self._by_topic.get(topic)
        if stretch is None:
            raise ValueError(f"offsets {first}..{first + count - 1} are not held "
                             f"(held: none)")
        return stretch.pieces(first, count)

    def get(self, topic: str) -> Stretch[T] | None:
        return self._by_topic.get(topic)

    def describe(self) -> dict[str, str]:
        """Each topic's stretch described, the one added to least recently first."""
        return {topic: stretch.describe() for topic, stretch in self._by_topic.items()}

    def clear(self) -> None:
        self._by_topic.clear()
        self.size = 0
