"""The newest records of a log, kept in memory for readers that keep up.

A consumer that is not behind is served from here, without reading the segment back
and checking each record's checksum again.  What every reader has read goes
(:meth:`Tail.release`), so a topic whose consumers keep up holds little; the budget,
in body bytes, bounds what readers behind keep (the newest record is kept whatever its
size).

On the produce path (one :meth:`Tail.keep` per batch, one :meth:`Tail.read` per
delivery): a list read from ``start`` on, with the running total of body bytes after
each record, so that trimming and reading by bytes are bisections, and the list is
compacted only once more than half of it is dropped.

Readers behind the tail read the files, and several of them (the groups of a topic,
their consumers slower than its producers) read the same stretch one after the other:
:class:`ReadBack` keeps what the last reads from the files gave, so that the stretch is
read and checked once for them all.

Each tail and read-back has a budget of its own; together, the logs of one MQ server
keep at most :data:`KEPT_BYTES` of bodies in them (:class:`Kept`): past that, those that
grew least recently let go of what they keep (a tail its newest record aside), and their
readers read the files.  A server of many topics whose consumers are behind holds a
bounded amount, not the sum of every topic's budget.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Sequence
from itertools import accumulate, repeat
from operator import attrgetter

from channels import split_bodies

from ._files import VIEW_BODY
from ._record import Entry, Produced, Record

__all__ = ["KEPT_BYTES", "Kept", "ReadBack", "Tail"]

#: Bytes of bodies the tails and read-backs of an MQ server's logs keep at most, together.
KEPT_BYTES = 256 << 20


class Kept:
    """What the tails and read-backs of some logs keep, against one budget (``limit``
    bytes of bodies): a holder that grows goes last in line; past the budget, the first
    in line let go of theirs (:meth:`Tail.shed`, :meth:`ReadBack.clear`)."""

    __slots__ = ("limit", "total", "line", "shed")

    def __init__(self, limit: int | None = None) -> None:
        self.limit = KEPT_BYTES if limit is None else limit
        self.total = 0
        #: the holders keeping anything, the one that grew least recently first
        self.line: dict[Tail | ReadBack, None] = {}
        #: how many times a holder let go of what it kept for the budget
        self.shed = 0

    def grew(self, holder: Tail | ReadBack, size: int) -> None:
        """``holder`` keeps ``size`` bytes now, having grown: last in line, and the first
        in line let go of theirs while the budget is passed."""
        self.total += size - holder.charged
        holder.charged = size
        line = self.line
        line.pop(holder, None)
        line[holder] = None
        while self.total > self.limit:
            first = next(iter(line))
            if first is holder:
                break  # the one that grew is all there is: its own budget bounds it
            del line[first]
            self.shed += 1
            first.shed()

    def shrank(self, holder: Tail | ReadBack, size: int) -> None:
        """``holder`` keeps ``size`` bytes now, fewer than before (its place in line
        stays; it leaves the line when it keeps nothing)."""
        self.total += size - holder.charged
        holder.charged = size
        if not size:
            self.line.pop(holder, None)



class Tail:
    """The newest records, offsets consecutive, about ``limit`` bytes of bodies."""

    __slots__ = ("charged", "ends", "floor", "kept", "limit", "records", "start")

    def __init__(self, limit: int, kept: Kept | None = None) -> None:
        self.limit = limit
        self.kept = Kept() if kept is None else kept
        #: the bytes counted in :attr:`kept` for this tail
        self.charged = 0
        #: The records kept are ``records[start:]``; ``ends[i]`` counts body bytes up to
        #: record i, and ``floor`` those before the first one kept.
        self.records: list[Record] = []
        self.ends: list[int] = []
        self.start = 0
        self.floor = 0

    def held(self) -> list[Record]:
        """The records kept, oldest first."""
        return self.records[self.start:]

    def clear(self) -> None:
        self.records, self.ends, self.start, self.floor = [], [], 0, 0
        if self.charged:
            self.kept.shrank(self, 0)

    @property
    def size(self) -> int:
        """Bytes of the bodies kept."""
        return self.ends[-1] - self.floor if len(self.records) > self.start else 0

    def shed(self) -> None:
        """Let go of every record but the newest (the budget of every log, :class:`Kept`):
        readers behind read the files."""
        if len(self.records) - self.start > 1:
            self.start = len(self.records) - 1
            self.floor = self.ends[-2]
            self._compact()
        self.kept.shrank(self, self.size)

    def keep(self, first: int, now: int, messages: Sequence[Entry] | Produced) -> None:
        """The records just appended from ``messages``, ``first`` the offset of the
        first, all with timestamp ``now``."""
        if isinstance(messages, Produced):  # one producer's: each record made in C's loops
            count = len(messages)
            self.keep_records(list(map(
                Record, range(first, first + count), repeat(now, count),
                range(messages.sequence, messages.sequence + count),
                repeat(messages.tag or None, count), repeat(messages.producer, count),
                split_bodies(messages.body, list(messages.sizes)))))
            return
        total = self._total(first)
        tail, ends = self.records, self.ends
        offset = first
        for tag, producer, sequence, body in messages:
            # A large body is kept as given, a view of the produce request, not copied (it
            # holds that request, one batch, beyond the budget); a small one is bytes (the
            # produce command cuts small ones so) or copied, which costs less than the
            # view object and frees the request.
            kept = body if type(body) is bytes or len(body) >= VIEW_BODY else bytes(body)
            tail.append(Record(offset, now, sequence, tag or None, producer, kept))
            total += len(kept)
            ends.append(total)
            offset += 1
        self._trim(total)
        self.kept.grew(self, total - self.floor)

    def keep_records(self, records: Sequence[Record]) -> None:
        """:meth:`keep` for records made already (copied from another log)."""
        total = self._total(records[0].offset)
        self.records += records
        ends = self.ends
        ends += accumulate(map(len, map(_body, records)), initial=total)
        del ends[-len(records) - 1]  # the running total before them, which it started from
        total = ends[-1]
        self._trim(total)
        self.kept.grew(self, total - self.floor)

    def read(self, offset: int, max_count: int, max_bytes: int) -> list[Record] | None:
        """Records from ``offset`` on, at most ``max_count`` and about ``max_bytes`` of
        bodies (at least one); ``[]`` past the newest; None if ``offset`` is older than
        what is kept (the file has it)."""
        tail, start = self.records, self.start
        if len(tail) <= start or tail[start].offset > offset:
            return None
        first = start + offset - tail[start].offset
        if first >= len(tail):
            return []
        ends = self.ends
        before = ends[first - 1] if first > 0 else self.floor
        return tail[first:_end(ends, before, first, min(first + max_count, len(tail)),
                               max_bytes)]

    def _total(self, first: int) -> int:
        """The running total before a record at ``first``; a record that does not follow
        the newest (cannot happen) starts the list afresh."""
        tail, ends = self.records, self.ends
        if len(tail) > self.start and tail[-1].offset + 1 != first:
            self.start = len(tail)
            self.floor = ends[-1]
        return ends[-1] if ends else 0

    def _trim(self, total: int) -> None:
        """Drop the oldest records kept whose bodies add up to what is over the budget
        (``total``: the running total after the newest), keeping one."""
        tail, ends = self.records, self.ends
        excess = total - self.floor - self.limit
        if excess > 0:
            cut = min(bisect.bisect_left(ends, self.floor + excess) + 1, len(tail) - 1)
            if cut > self.start:
                self.start = cut
                self.floor = ends[cut - 1]
        self._compact()

    def release(self, offset: int) -> None:
        """Let go of the records below ``offset``: every reader is past them (one that
        wants them again reads the file)."""
        tail, start = self.records, self.start
        if len(tail) <= start:
            return
        first = tail[start].offset
        if offset <= first:
            return
        cut = min(start + offset - first, len(tail))
        self.start = cut
        self.floor = self.ends[cut - 1]
        self._compact()
        self.kept.shrank(self, self.size)

    def _compact(self) -> None:
        """The list without the records let go, once they are more than half of it
        (amortized, each record kept is moved a bounded number of times)."""
        tail, ends = self.records, self.ends
        if self.start * 2 > len(tail):
            del tail[:self.start]
            del ends[:self.start]
            self.start = 0


_offset = attrgetter("offset")
_body = attrgetter("body")


def _end(ends: list[int], before: int, first: int, last: int, max_bytes: int) -> int:
    """Where a read from ``first`` stops, before ``last``: past the record whose body
    brings it to ``max_bytes`` (``ends``: running totals of body bytes, ``before`` the
    one before ``first``), and past one record at least."""
    return max(first + 1, min(last, bisect.bisect_left(ends, before + max_bytes) + 1))


class ReadBack:
    """What the latest reads from a log's files gave (runs of records, ascending, with
    the offsets that damage lost left out), about ``limit`` bytes of bodies, the oldest
    run dropped first; a run once every reader is past it."""

    __slots__ = ("charged", "kept", "limit", "runs", "size")

    def __init__(self, limit: int, kept: Kept | None = None) -> None:
        self.limit = limit
        self.kept = Kept() if kept is None else kept
        #: the bytes counted in :attr:`kept` for this read-back
        self.charged = 0
        #: (records, running total of their body bytes), oldest first
        self.runs: deque[tuple[list[Record], list[int]]] = deque()
        self.size = 0

    def keep(self, records: list[Record]) -> None:
        """``records``, just read from the files (offsets ascending)."""
        if not records or self.limit <= 0:
            return
        ends = list(accumulate(map(len, map(_body, records))))
        self.runs.append((records, ends))
        self.size += ends[-1]
        while self.size > self.limit and len(self.runs) > 1:
            self.size -= self.runs.popleft()[1][-1]
        self.kept.grew(self, self.size)

    def read(self, offset: int, max_count: int, max_bytes: int
             ) -> tuple[list[Record], int] | None:
        """:meth:`Tail.read`'s, from a run that holds ``offset`` (or the first record
        after it, where damage lost it), up to that run's end, with the bytes of their
        bodies; None if none holds it."""
        for records, ends in reversed(self.runs):
            if not records[0].offset <= offset <= records[-1].offset:
                continue
            first = offset - records[0].offset
            if first >= len(records) or records[first].offset != offset:
                first = bisect.bisect_left(records, offset, key=_offset)
            before = ends[first - 1] if first > 0 else 0
            last = _end(ends, before, first, min(first + max_count, len(records)), max_bytes)
            return records[first:last], ends[last - 1] - before
        return None

    def release(self, offset: int) -> None:
        """Let go of the runs wholly below ``offset``."""
        runs = self.runs
        if runs and runs[0][0][-1].offset < offset:
            while runs and runs[0][0][-1].offset < offset:
                self.size -= runs.popleft()[1][-1]
            self.kept.shrank(self, self.size)

    def clear(self) -> None:
        self.runs.clear()
        self.size = 0
        if self.charged:
            self.kept.shrank(self, 0)

    def shed(self) -> None:
        """Let go of everything (the budget of every log, :class:`Kept`)."""
        self.clear()
