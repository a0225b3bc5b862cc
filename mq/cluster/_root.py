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

Backup and fanout servers do not vote, and are never root.  A root stays root while
the active primaries are a majority and its own ballot is for itself (at its epoch or,
while the others come to it, a newer one); otherwise it steps down.

A vote is a ballot: a primary and the epoch it would lead (:func:`ballot`).  A server
changes the primary it votes for only together with a higher epoch, so no server votes
for two primaries in one epoch; a primary takes over at epoch E only when every active
primary's ballot is itself at E.  Two primaries that each saw a majority would share a
voter, which voted for one of them at E: no epoch has two roots, whatever each server
saw when (a partition, a server coming back, votes heard late), as long as a server that
restarts remembers its epoch and its ballot (:class:`~mq.ClusterNode`'s ``store``).
A primary cut off with a minority of the primaries cannot become root.  A root
announcement under an older epoch, or under the same epoch by another server, is refused
(:func:`brokermgr.fenced`, the fence the replicated groups use too).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING

from brokermgr import EpochError, next_epoch

if TYPE_CHECKING:
    from ._file import ClusterConfig

__all__ = ["Ballot", "ballot", "candidate", "has_majority", "may_take_over"]

#: A vote: the primary voted for (None: none) and the epoch it would lead.
Ballot = tuple[str | None, int]


def candidate(config: ClusterConfig, active: Collection[str]) -> str | None:
    """The most senior primary among ``active`` (server ids), or None."""
    return next((s.id for s in config.servers if s.type == "primary" and s.id in active),
                None)


def ballot(config: ClusterConfig, active: Collection[str], mine: Ballot, epoch: int,
           root: str | None, heard: Collection[Ballot]) -> Ballot:
    """A primary's next ballot: for the most senior primary among ``active``; at a new
    epoch, above ``epoch`` (the newest it knows, led by ``root``) and every epoch
    ``heard``, when that primary is another than ``mine``'s or ``mine`` is an epoch
    already led by another; else ``mine``, or the same primary at a higher epoch another
    voter gave it (so that the voters come to one epoch)."""
    chosen = candidate(config, active)
    if chosen != mine[0] or mine[1] < epoch or (mine[1] == epoch and root != chosen):
        try:
            return chosen, next_epoch(max(epoch, mine[1], *(e for _, e in heard)))
        except EpochError:  # no epoch left below the bound: the vote stays as it was
            return mine
    higher = max((e for c, e in heard if c == chosen), default=mine[1])
    return chosen, max(mine[1], higher)


def has_majority(config: ClusterConfig, active: Collection[str]) -> bool:
    """Whether the primaries among ``active`` are more than half of those listed."""
    primaries = [s.id for s in config.servers if s.type == "primary"]
    return sum(p in active for p in primaries) * 2 > len(primaries)


def may_take_over(config: ClusterConfig, me: str, active: Collection[str],
                  votes: Mapping[str, Ballot], mine: Ballot,
                  version: tuple[int, int] = (0, 0),
                  versions: Mapping[str, tuple[int, int]] | None = None) -> bool:
    """Whether ``me`` takes over as root at ``mine``'s epoch: ``active`` are the servers
    it sees (itself included), ``votes`` each active primary's ballot as it last said
    it, ``mine`` its own, ``version`` the mark of its cluster state (epoch, version) and
    ``versions`` those the active servers said."""
    voters = [s.id for s in config.servers if s.type == "primary" and s.id in active]
    if me not in voters or mine[0] != me:
        return False
    if not has_majority(config, active):
        return False
    if any(v > version for p, v in (versions or {}).items() if p in active):
        return False
    return all(votes.get(p) == mine for p in voters if p != me)


def senior(config: ClusterConfig, me: str, other: str) -> bool:
    """Whether ``me`` comes before ``other`` in the cluster file's order."""
    ids = [s.id for s in config.servers]
    return other in ids and ids.index(me) < ids.index(other)


def unruly(config: ClusterConfig, me: str, mine: Ballot, claimer: str, epoch: int
           ) -> str | None:
    """Why the rule forbids ``claimer`` to be root at ``epoch``, as server ``me`` (whose
    ballot is ``mine``) knows it (None: it allows it): only a primary of the cluster file
    is ever root; and the root needs the vote of every active primary, so a primary that
    voted for another at that very epoch (a voter holds one ballot an epoch) knows the
    claim is false."""
    server = config.server(claimer)
    if server is None or server.type != "primary":
        kind = "no server of the cluster" if server is None else f"a {server.type} server"
        return f"{claimer} is {kind}: only a primary is ever root"
    voted, at = mine
    me_server = config.server(me)
    if (me_server is not None and me_server.type == "primary" and at == epoch
            and voted not in (None, claimer)):
        return (f"this server voted for {voted} at epoch {epoch}: {claimer} lacks its "
                f"vote there")
    return None


def unvoted(config: ClusterConfig, me: str, mine: Ballot, known: Mapping[str, Ballot],
            claimer: str, epoch: int) -> str | None:
    """Why ``claimer`` cannot have the votes of most primaries at ``epoch``, as server
    ``me`` knows them (None: it may have): a primary whose ballot (``mine``, or the one
    ``known`` of an active peer) is at an older epoch, or for another at that one, has
    not voted for it there, since a ballot only moves up.  A claim made before its
    voters' new ballots reached ``me`` is refused until they do (the claimer's beats name
    it root again); a claim no majority made is refused for good."""
    primaries = [s.id for s in config.servers if s.type == "primary"]
    against = []
    for p in primaries:
        held = mine if p == me else known.get(p)
        if held is not None and (held[1] < epoch or (held[1] == epoch
                                                      and held[0] != claimer)):
            against.append(p)
    if (len(primaries) - len(against)) * 2 > len(primaries):
        return None
    return (f"{', '.join(against)} of the {len(primaries)} primaries did not vote for "
            f"{claimer} at epoch {epoch}, as this server last heard them: it cannot "
            f"hold a majority")
