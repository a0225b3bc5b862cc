"""Who is a cluster's root, by OpenAMQ's rule (sans-I/O).

The root is the most senior primary server (the first primary of the cluster file) among
those that are active.  Each server works the election out itself from its own id and the
ids of the peers it is linked to, so that servers that see the same peers reach the same
result, and votes for the primary it finds.  A primary takes over as root only

* with the unanimous vote of the active primaries (each votes for the most senior
  primary it sees), and
* when the active primaries, itself included, are more than half of the primaries the
  cluster file lists, and
* when it holds the newest cluster state any active server said it has (a primary that
  comes back fetches it first): a root never starts from an older state than one the
  cluster had.

Backup and fanout servers do not vote, and are never root.  A primary cut off with a
minority of the primaries cannot become root: at most one side of a partition has a
root.  The epoch of each new root is one more than the newest it knew, and a root
announcement of an older epoch is refused (:class:`~brokermgr.EpochFence`, the fence the
replicated groups use too).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._cluster_file import ClusterConfig

__all__ = ["candidate", "may_take_over"]


def candidate(config: ClusterConfig, active: Collection[str]) -> str | None:
    """The most senior primary among ``active`` (server ids), or None."""
    return next((s.id for s in config.servers if s.type == "primary" and s.id in active),
                None)


def may_take_over(config: ClusterConfig, me: str, active: Collection[str],
                  votes: Mapping[str, str | None], version: int = 0,
                  versions: Mapping[str, int] | None = None) -> bool:
    """Whether ``me`` takes over as root: ``active`` are the servers it sees (itself
    included), ``votes`` each active primary's vote as it last said it (its own is
    worked out here), ``version`` the version of its cluster state and ``versions``
    those the active servers said."""
    primaries = [s.id for s in config.servers if s.type == "primary"]
    voters = [p for p in primaries if p in active]
    if me not in voters or candidate(config, active) != me:
        return False
    if not len(voters) * 2 > len(primaries):
        return False
    if any(v > version for p, v in (versions or {}).items() if p in active):
        return False
    return all(votes.get(p) == me for p in voters if p != me)
