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

__all__ = ["STALE_EPOCH", "Held", "fenced"]

#: The reason of a fenced claim, as refusals carry it.
STALE_EPOCH = "stale epoch"

#: The leadership held: its epoch and its holder.
Held = tuple[int, str]


def fenced(held: Held | None, holder: str, epoch: int) -> bool:
    """Whether ``holder``'s claim to lead at ``epoch`` is fenced by ``held``."""
    if held is None:
        return False
    held_epoch, held_by = held
    return epoch < held_epoch or (epoch == held_epoch and held_by != holder)
