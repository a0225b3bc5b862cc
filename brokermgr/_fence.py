"""The epoch fence that the replicated groups' masters and the clusters' roots share
(sans-I/O).

One server at a time leads (a group's master, a cluster's root), each leadership under an
epoch that only grows.  A claim to lead is fenced when it is under an older epoch than
the one held, or under the same epoch by another server: a former leader that comes
back, or one on the other side of a partition, cannot act as the leader again, and no
epoch has two leaders.  Who may lead next is each mechanism's own rule (the name
service's promotion for a group, the primaries' vote for a cluster).
"""

from __future__ import annotations

from pump import RdvpumpError

__all__ = ["EPOCHS_EXHAUSTED", "MAX_EPOCH", "STALE_EPOCH", "EpochError", "Held",
           "check_epoch", "fenced", "next_epoch"]

#: The reason of a fenced claim, as refusals carry it.
STALE_EPOCH = "stale epoch"
#: The reason of a refused step to a new epoch once the last one below the bound is held.
EPOCHS_EXHAUSTED = "epochs exhausted"

#: The bound of every epoch, in groups, clusters, requests and files alike: the largest
#: integer that every JSON reader holds exactly (JavaScript's ``Number.MAX_SAFE_INTEGER``,
#: 2^53 - 1).  An epoch is an integer from 0 up to, not including, the bound: a claim,
#: an announcement or a file at the bound or past it is refused, and no step to a new
#: epoch reaches it (:func:`next_epoch`), so nothing ever wraps or overflows.
MAX_EPOCH = (1 << 53) - 1


class EpochError(RdvpumpError, ValueError):
    """An epoch out of range, or no next epoch below the bound."""


def check_epoch(value: object, what: str = "an epoch") -> int:
    """``value`` as an epoch (an int, not a bool, ``0 <= value < MAX_EPOCH``), or
    :class:`EpochError` saying what it must be."""
    if type(value) is not int or not 0 <= value < MAX_EPOCH:
        raise EpochError(f"{what} must be an integer from 0 below {MAX_EPOCH}, got "
                         f"{value!r}")
    return value


def next_epoch(epoch: int) -> int:
    """The epoch after ``epoch``; :class:`EpochError` (:data:`EPOCHS_EXHAUSTED`) when it
    would reach the bound: the epoch held stays, and its leader may go on leading."""
    check_epoch(epoch)
    if epoch + 1 >= MAX_EPOCH:
        raise EpochError(f"{EPOCHS_EXHAUSTED}: epoch {epoch} is the last below the bound "
                         f"{MAX_EPOCH}; no later one can be taken")
    return epoch + 1

#: The leadership held: its epoch and its holder.
Held = tuple[int, str]


def fenced(held: Held | None, holder: str, epoch: int) -> bool:
    """Whether ``holder``'s claim to lead at ``epoch`` is fenced by ``held``."""
    if held is None:
        return False
    held_epoch, held_by = held
    return epoch < held_epoch or (epoch == held_epoch and held_by != holder)
