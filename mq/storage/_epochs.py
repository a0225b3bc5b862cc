"""A topic's master epochs: the offset at which each master epoch began writing it, and
the rule that finds where a replica's copy parts from its master's.

Kept beside a topic's log in ``epochs.json`` (Kafka keeps the same list as its
leader-epoch checkpoint): ``[[epoch, first offset], ...]``, both increasing.  A log
without the file was written under epoch 0 from its first offset.  A master adds its
epoch at its log's next offset when it takes over (:meth:`Epochs.begin`); a replica
takes its master's whole list once the master agreed to ship to it (its records up to
there are the master's).

Where a replica's copy ends, the rule (:func:`kept`): a replica whose last record was
written under epoch ``E`` asks its master; the master answers with the newest epoch
``E' <= E`` of its own list and the offset where the epoch after ``E'`` begins in its
log (its next offset if ``E'`` is its current epoch) (:meth:`Epochs.end_of`).  The
replica keeps its records below that offset, and below the offset where its own epoch
after ``E'`` began when ``E' < E`` (the master never wrote under ``E``); it cuts the
rest and asks again from there, until the master's answer is its own last epoch with an
end at or past the replica's next offset.  What is cut was written by a former master
after its successor's epoch began: under ``sync`` replication that was never
acknowledged, since the member promoted held every acknowledged record.  A replica whose
records are of an epoch newer than the master's is not cut: the master refuses it.
"""

from __future__ import annotations

import bisect
import json
from pathlib import Path
from typing import Any

from brokermgr import check_epoch

from ._record import FormatError

EPOCHS = "epochs.json"
EPOCHS_VERSION = 1


class Epochs:
    """A log's master epochs and their first offsets."""

    def __init__(self, entries: list[tuple[int, int]] | None = None) -> None:
        self.entries: list[tuple[int, int]] = entries or [(0, 0)]

    @classmethod
    def parse(cls, value: Any, where: str) -> Epochs:
        """The list as JSON gave it (``[[epoch, offset], ...]``), checked: epochs and
        offsets non-negative integers, both increasing; ValueError naming ``where``."""
        if not isinstance(value, list) or not value:
            raise ValueError(f"{where}: epochs must be a non-empty list of [epoch, offset]")
        entries: list[tuple[int, int]] = []
        for item in value:
            if not (isinstance(item, list) and len(item) == 2
                    and all(type(v) is int and v >= 0 for v in item)):
                raise ValueError(f"{where}: {item!r} is not [epoch, offset] (non-negative "
                                 f"integers)")
            check_epoch(item[0], f"{where}: the epoch of {item!r}")
            if entries and not (item[0] > entries[-1][0] and item[1] >= entries[-1][1]):
                raise ValueError(f"{where}: {item!r} after {list(entries[-1])!r}: epochs "
                                 f"and offsets must increase")
            entries.append((item[0], item[1]))
        return cls(entries)

    @classmethod
    def read(cls, directory: Path) -> Epochs:
        """The list kept in ``directory`` (epoch 0 from offset 0 if there is none);
        :class:`~._record.FormatError` naming the file if it is damaged."""
        path = directory / EPOCHS
        try:
            data = json.loads(path.read_bytes())
        except FileNotFoundError:
            return cls()
        except (ValueError, UnicodeDecodeError) as exc:
            raise FormatError(f"{path}: not JSON: {exc}") from None
        if not isinstance(data, dict) or data.get("version") != EPOCHS_VERSION:
            raise FormatError(f"{path}: not an epochs file of version {EPOCHS_VERSION}")
        try:
            return cls.parse(data.get("epochs"), str(path))
        except ValueError as exc:
            raise FormatError(str(exc)) from None

    def encode(self) -> bytes:
        return json.dumps({"version": EPOCHS_VERSION,
                           "epochs": [list(e) for e in self.entries]}).encode()

    def to_json(self) -> list[list[int]]:
        return [list(e) for e in self.entries]

    @property
    def last(self) -> int:
        """The newest epoch."""
        return self.entries[-1][0]

    def epoch_at(self, offset: int) -> int:
        """The epoch the record at ``offset`` was written under."""
        i = bisect.bisect_right([start for _, start in self.entries], offset) - 1
        return self.entries[max(i, 0)][0]

    def end_of(self, epoch: int, next_offset: int) -> tuple[int | None, int]:
        """The newest epoch of this list at or before ``epoch`` (None if every epoch here
        is newer), and the offset where the epoch after it begins (``next_offset``, the
        log's, if it is the newest; the first entry's offset if there is none)."""
        i = bisect.bisect_right([e for e, _ in self.entries], epoch) - 1
        if i < 0:
            return None, self.entries[0][1]
        end = self.entries[i + 1][1] if i + 1 < len(self.entries) else next_offset
        return self.entries[i][0], end

    def begin(self, epoch: int, offset: int) -> bool:
        """Epoch ``epoch`` writes from ``offset`` on (a master took over); False if the
        list has it already (or a newer one)."""
        last, start = self.entries[-1]
        if epoch <= last:
            return False
        if start >= offset:
            self.entries[-1] = (epoch, start)  # the epoch before wrote nothing
        else:
            self.entries.append((epoch, offset))
        return True

    def cut(self, offset: int) -> None:
        """The records from ``offset`` on are gone: the epochs that began there go too
        (the first stays)."""
        self.entries[1:] = [e for e in self.entries[1:] if e[1] < offset]


def diverged(master: Epochs, master_next: int, current: int, asked: int, start: int
             ) -> tuple[int | None, int] | None:
    """The master's side of the rule: a replica asks from ``start`` with its last record
    written under epoch ``asked``; this master's log has ``master`` epochs and ends at
    ``master_next``, and its epoch is ``current``.  None if the replica's records are
    this log's; else the answer (the newest epoch here at or before ``asked``, and where
    the epoch after it begins here).  ValueError with the reason for a replica whose
    records must not be cut: of an epoch newer than this master's, or more than this log
    holds of its own newest epoch (under ``sync`` those may be acknowledged)."""
    newest = max(current, master.last)
    if asked > newest:
        raise ValueError(f"the replica's records up to offset {start - 1} were written "
                         f"under epoch {asked}, newer than this master's {newest}")
    epoch, end = master.end_of(asked, master_next)
    if epoch == asked and start <= end:
        return None
    if epoch == asked == master.last:
        raise ValueError(f"the replica holds offsets up to {start - 1} of epoch {asked}, "
                         f"this master's last is {master_next - 1}: it holds records this "
                         f"one does not")
    return epoch, end


def kept(replica: Epochs, replica_next: int, master_epoch: int | None,
         master_end: int) -> int:
    """Where a replica's copy must end (the module's rule): the master answered
    ``master_epoch`` and ``master_end`` for the epoch of the replica's last record."""
    keep = min(replica_next, master_end)
    asked = replica.epoch_at(replica_next - 1)
    if master_epoch is not None and master_epoch < asked:
        keep = min(keep, replica.end_of(master_epoch, replica_next)[1])
    return keep
