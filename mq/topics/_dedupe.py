"""A topic's recent publishes by producer id and sequence, so that a publish tried again
(its answer was lost: the server died, or the link) is not stored twice.

A client numbers its messages (``producer``, ``sequence``, one more per message) and a
retry sends the same numbers.  The server keeps, for each topic, the first
``(producer, sequence)`` of its newest :data:`WINDOW` publishes with where they went;
a publish whose messages are all there, at consecutive offsets, is a duplicate: it is
answered with the original offsets (``"duplicate": true``) once they are durable (and
replicated, under ``sync``) as a new publish would be, and nothing is stored.  A publish
of which only some messages are there (a master died while shipping it) is stored whole:
those messages are then held twice, which at-least-once delivery allows, and none is
lost.

After a restart, a promotion or a cut the list is built again from the
:data:`REBUILT` newest records of the log (each record carries its producer and
sequence): a member promoted drops the
retries of publishes it copied from the master it succeeds.  So is the list of a topic
that stored nothing for :data:`QUIET` seconds, which its server let go of: a topic's
list is about 1 MB once full, and a server of many topics published to once keeps only
the lists of those published to now.  Only publishes that name
their producer are checked (every ``MqClient`` does).
"""

from __future__ import annotations

from collections import OrderedDict
from sys import intern

from ._topic import Log

#: Publishes remembered per topic.
WINDOW = 4096
#: Records read back from the log's end when the list is built from it.
REBUILT = 1024
#: Seconds a topic stores nothing before its server lets go of its list (built again
#: at its next publish).
QUIET = 60.0


class Recent:
    """The newest publishes of a topic: first ``(producer, sequence)`` -> (offset,
    count), oldest first, at most ``limit`` of them.

    Every topic published to keeps one, full once it has seen ``limit`` publishes, so an
    entry is kept small: the producer id is the one string of its name (interned: a
    request's parse makes a new one each time), and the offset and count are one int.
    About 230 bytes a publish where ``(offset, count)`` tuples and a string a publish
    held about 380 (1.5 MB a topic at 4,096)."""

    def __init__(self, limit: int = WINDOW) -> None:
        self.limit = limit
        #: An OrderedDict: a dict's oldest entry, dropped at every publish, is found by
        #: a scan over the slots its earlier drops left (a microsecond at 4,096 entries).
        #: Its values are ``offset << 32 | count``.
        self.publishes: OrderedDict[tuple[str, int], int] = OrderedDict()

    def __len__(self) -> int:
        return len(self.publishes)

    def add(self, producer: str, sequence: int, offset: int, count: int) -> None:
        if not 0 <= count < 1 << 32:  # more than a frame could hold: never
            raise ValueError(f"a publish of {count} messages")
        publishes = self.publishes
        publishes[(intern(producer), sequence)] = offset << 32 | count
        if len(publishes) > self.limit:
            publishes.popitem(last=False)

    def _where(self, producer: str, sequence: int) -> tuple[int, int] | None:
        found = self.publishes.get((producer, sequence))
        return None if found is None else (found >> 32, found & 0xFFFFFFFF)

    @classmethod
    def of(cls, log: Log) -> Recent:
        """The list built from the :data:`REBUILT` newest records of ``log``, remembered
        one by one."""
        recent = cls()
        offset = max(log.start_offset, log.next_offset - REBUILT)
        while offset < log.next_offset:
            records = log.read(offset, max_count=REBUILT)
            if not records:
                break
            for record in records:
                recent.add(record.producer, record.sequence, record.offset, 1)
            offset = records[-1].offset + 1
        return recent

    def original(self, producer: str, sequence: int, count: int) -> int | None:
        """The first offset of ``count`` messages numbered from ``sequence`` if every one
        of them is stored already, at consecutive offsets; None otherwise."""
        found = self._where(producer, sequence)
        if found is None:
            return None
        offset, stored = found
        if stored == count:
            return offset
        for i in range(1, count):  # remembered record by record: each must be there
            if self._where(producer, sequence + i) != (offset + i, 1):
                return None
        return offset
