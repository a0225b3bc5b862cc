"""Offsets held for a consumer: delivered and not acknowledged yet (:class:`Held`), by a
client's subscription (on its current link) and by a relaying server (for each of its
local consumers, with what it delivered under each offset).

A frame of consecutive offsets is held as one range, with no entry per offset: an ack
of exactly such ranges (a batch's, as it came) takes each in one step.  Anything else
(a frame of scattered offsets, a frame that overlaps what is held, an offset acked
alone out of a range) is held one offset at a time; a range is split into its offsets
the first time one of them is taken alone.
"""

from __future__ import annotations

import itertools
from bisect import bisect_left, bisect_right, insort
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Generic, TypeVar

__all__ = ["Held"]

V = TypeVar("V")


class Held(Generic[V]):
    """Offsets held, each with a value (what was delivered under it; None for a client):
    single ones, in the order they came, and runs of two or more with one value each.
    No offset is both single and in a run."""

    __slots__ = ("one", "runs", "_values", "_starts", "_size")

    def __init__(self) -> None:
        self.one: dict[int, V] = {}
        #: runs by their first offset, in the order they came, and each run's value
        self.runs: dict[int, range] = {}
        self._values: dict[int, V] = {}
        self._starts: list[int] = []  # the runs' first offsets, sorted
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[int]:
        return itertools.chain(self.one, *self.runs.values())

    def __contains__(self, offset: object) -> bool:
        return offset in self.one or (type(offset) is int and self._run_of(offset) is not None)

    def items(self) -> Iterator[tuple[int, V]]:
        """Every offset held and its value."""
        values = self._values
        return itertools.chain(self.one.items(), *(zip(run, itertools.repeat(values[first]))
                                                   for first, run in self.runs.items()))

    def values(self) -> Iterator[V]:
        return (value for _, value in self.items())

    def add(self, offsets: Sequence[int], value: V) -> None:
        """Hold ``offsets`` (a frame's, as it came), each with ``value``."""
        if (type(offsets) is range and len(offsets) > 1 and offsets.step == 1
                and not self._overlaps(offsets)):
            self.runs[offsets.start] = offsets
            self._values[offsets.start] = value
            insort(self._starts, offsets.start)
            self._size += len(offsets)
            return
        if self.runs:
            for offset in offsets:
                if (run := self._run_of(offset)) is not None:
                    self._split(run)  # held already, inside a run: one at a time now
        one = self.one
        before = len(one)
        one.update(dict.fromkeys(offsets, value))
        self._size += len(one) - before

    def put(self, offset: int, value: V) -> None:
        """Hold ``offset`` alone with ``value``."""
        self.add((offset,), value)

    def take_run(self, offsets: range) -> bool:
        """Take ``offsets`` (consecutive) if they are exactly runs held one after the
        other, in a step each; False (nothing taken) otherwise."""
        runs = self.runs
        found = 0
        start = offsets.start
        while start < offsets.stop:
            run = runs.get(start)
            if run is None or run.stop > offsets.stop:
                return False
            found += 1
            start = run.stop
        at = bisect_left(self._starts, offsets.start)
        for first in self._starts[at:at + found]:
            del runs[first]
            del self._values[first]
        del self._starts[at:at + found]
        self._size -= len(offsets)
        return True

    def take_each(self, offsets: Sequence[int]) -> bool:
        """Take ``offsets`` if they are single offsets held (none inside a run), each
        named once (in C); False (nothing taken) otherwise."""
        named = set(offsets)
        one = self.one
        if len(named) != len(offsets) or not one.keys() >= named:
            return False
        deque(map(one.__delitem__, offsets), 0)
        self._size -= len(named)
        return True

    def discard(self, offset: int) -> bool:
        """Take ``offset`` if it is held: whether it was."""
        if not self._single(offset):
            return False
        del self.one[offset]
        self._size -= 1
        return True

    def pop(self, offset: int) -> V | None:
        """Take ``offset``: its value, or None if it is not held."""
        if not self._single(offset):
            return None
        self._size -= 1
        return self.one.pop(offset)

    def _single(self, offset: int) -> bool:
        """Whether ``offset`` is held; if so, held alone from now on (its run split)."""
        if offset in self.one:
            return True
        run = self._run_of(offset)
        if run is None:
            return False
        self._split(run)
        return True

    def drain(self) -> dict[int, V]:
        """Every offset held and its value, taken (single ones first, then the runs,
        each in the order it came)."""
        out = dict(self.items())
        self.clear()
        return out

    def clear(self) -> None:
        self.one, self.runs, self._values, self._starts, self._size = {}, {}, {}, [], 0

    def trim(self, keep: int) -> None:
        """Forget the oldest offsets held beyond ``keep``: whole runs first, oldest
        first, then single offsets."""
        runs = self.runs
        while self._size > keep and runs:
            first = next(iter(runs))
            self._size -= len(runs.pop(first))
            del self._values[first]
            self._starts.remove(first)
        one = self.one
        if self._size > keep:
            for offset in list(itertools.islice(one, self._size - keep)):
                del one[offset]
            self._size = len(one)

    def _run_of(self, offset: int) -> range | None:
        at = bisect_right(self._starts, offset) - 1
        if at < 0:
            return None
        run = self.runs[self._starts[at]]
        return run if offset < run.stop else None

    def _overlaps(self, offsets: range) -> bool:
        """Whether any of ``offsets`` (consecutive) is held already."""
        starts = self._starts
        at = bisect_right(starts, offsets.start) - 1
        if at >= 0 and self.runs[starts[at]].stop > offsets.start:
            return True
        if at + 1 < len(starts) and starts[at + 1] < offsets.stop:
            return True
        return bool(self.one) and any(map(self.one.__contains__, offsets))

    def _split(self, run: range) -> None:
        """``run``'s offsets held one at a time from now on."""
        del self.runs[run.start]
        self._starts.remove(run.start)
        self.one.update(dict.fromkeys(run, self._values.pop(run.start)))
