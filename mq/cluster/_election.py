"""A cluster server's side of the election of its root (the rule is :mod:`._root`'s):
which peers are active, its ballot, taking over and stepping down, following a root,
and refusing claims the rule or the votes forbid.  A part of
:class:`~._node.ClusterNode`, which holds the links these read."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from brokermgr import ServiceError, Status

from ._root import Ballot, ballot, has_majority, may_take_over, senior, unruly, unvoted
from ._state import ClusterState
from ._votes import keep_votes

if TYPE_CHECKING:
    from brokermgr import Broker

    from ._changes import Changes
    from ._file import ClusterConfig, ClusterServer
    from ._links import Peer

__all__ = ["Election"]

log = logging.getLogger("rdvpump.mq.cluster")


class Election:
    """The election's part of a cluster server (a base of :class:`~._node.ClusterNode`,
    which sets these attributes)."""

    broker: Broker
    config: ClusterConfig
    me: ClusterServer
    peers: dict[str, Peer]
    state: ClusterState
    versions: dict[str, tuple[int, int]]
    changes: Changes
    store: Path | None
    #: The root this server follows (None: none yet) and its epoch; each peer's vote as
    #: it last said it; this server's own.
    root: str | None
    epoch: int
    votes: dict[str, Ballot]
    ballot: Ballot
    silent: set[str]
    _live: float
    _closed: bool

    if TYPE_CHECKING:
        def changed(self) -> None: ...

        def links_changed(self) -> None: ...

        def send_state(self) -> None: ...

        def _say(self, why: str, *, key: str, peer: Peer | None = None,
                 level: int = logging.ERROR) -> None: ...

    def _unvoted(self, claimer: str, epoch: int) -> str | None:
        """:func:`._root.unvoted` over the ballots this server knows: its own, and what
        each active peer said last."""
        active = set(self.active())
        known = {p: v for p, v in self.votes.items() if p in active}
        return unvoted(self.config, self.me.id, self.ballot, known, claimer, epoch)

    def _refuse_unruly(self, claimer: str, epoch: int, what: str) -> None:
        """:func:`._root.unruly`'s refusal (409, logged once); nothing changes.  A claim the
        claimer makes itself, on its own link to this server, is also refused by a
        primary more senior than it: the claimer reaches this server, so this server was
        active to it, and the rule would have made this one its candidate; and a claim
        the primaries' votes, as this server heard them, cannot carry
        (:meth:`_unvoted`, the link kept: those votes may be on their way)."""
        why = unruly(self.config, self.me.id, self.ballot, claimer, epoch)
        if why is None and self.me.type == "primary" and senior(self.config, self.me.id,
                                                                 claimer):
            why = (f"{self.me.id}, a primary more senior than {claimer}, is active: the "
                   f"rule makes it the candidate, not {claimer}")
        kind = "rule"
        if why is None:
            why, kind = self._unvoted(claimer, epoch), "votes"
        if why is not None:
            said = f"{claimer} {what} at epoch {epoch}: refused: {why}"
            self._say(said, key=claimer, level=logging.INFO if kind == "votes"
                      else logging.ERROR)
            raise ServiceError(Status.CONFLICT, said, refused=kind)

    def active(self) -> list[str]:
        """This server and the peers linked to it both ways and heard within the silence
        timeout."""
        return [self.me.id, *(p.server.id for p in self.peers.values()
                              if p.outgoing is not None and p.outgoing.agreed
                              and p.incoming is not None and p.server.id not in self.silent)]

    def _silences(self) -> None:
        """Count out the peers whose link in has been silent too long, and in again those
        heard since; an election when that changes who counts."""
        now = self.broker.pump.now()
        silent = {p.server.id for p in self.peers.values()
                  if p.incoming is not None
                  and now - max(p.heard_at, p.answered_at) > self._live}
        if silent == self.silent:
            return
        for peer_id in sorted(silent - self.silent):
            peer = self.peers[peer_id]
            log.warning("cluster %s: %s: %s silent for %.1f s: counted out until it is "
                        "heard again", self.config.name, self.me.id, peer_id,
                        now - max(peer.heard_at, peer.answered_at))
        for peer_id in sorted(self.silent - silent):
            log.warning("cluster %s: %s: %s heard again", self.config.name, self.me.id,
                        peer_id)
        self.silent = silent
        self.links_changed()

    def vote(self) -> Ballot:
        """This server's ballot now (:func:`._root.ballot`); (None, 0) from a backup or
        fanout server."""
        if self.me.type != "primary":
            return None, 0
        active = self.active()
        heard = [v for p, v in self.votes.items() if p in active]
        new = ballot(self.config, active, self.ballot, self.epoch, self.root, heard)
        if new != self.ballot:
            self.ballot = new
            self._keep()  # on disk before any peer hears it
        return self.ballot

    def _keep(self) -> None:
        """The epoch, ballot and cluster state to disk (:func:`._votes.keep_votes`)."""
        if self.store is not None:
            keep_votes(self.store, self.epoch, self.ballot, self.state)

    def elect(self) -> None:
        """Take over as root when the rule of :mod:`._root` says so (announced to every
        peer at its ballot's epoch); step down when it no longer holds (a minority left,
        or its own ballot is for another)."""
        if self._closed:
            return
        active = self.active()
        mine = self.vote()
        if mine[1] > self.epoch and may_take_over(self.config, self.me.id, active,
                                                  self.votes, mine, self.state.mark,
                                                  self.versions):
            self._follow(self.me.id, mine[1])
            log.warning("cluster %s: %s is root at epoch %d (active: %s)",
                        self.config.name, self.me.id, self.epoch, ", ".join(active))
            for peer in self.peers.values():
                if peer.outgoing is not None and peer.outgoing.agreed:
                    peer.outgoing.say("root")
            # the new root's state, marked after any before
            self.state.version += 1
            self.state.epoch = self.epoch
            self._keep()
            self.send_state()
        elif self.root == self.me.id and (mine[0] != self.me.id
                                          or not has_majority(self.config, active)):
            log.warning("cluster %s: %s steps down as root at epoch %d: it sees %s",
                        self.config.name, self.me.id, self.epoch, ", ".join(active))
            self.root = None
            self.changes.drop("the root stepped down")
            self.changed()
        elif self.root is not None and self.root not in active:
            self.root = None  # its root is out of reach: not ready until one is known
            self.changed()

    def _follow(self, root: str | None, epoch: int) -> None:
        """Follow ``root`` at ``epoch``; None: a root this server does not reach (named by
        another), whose epoch is taken (kept on disk: it fences every root before it)
        while this server has no root until it reaches one.  Following such a root would
        have had :meth:`elect` drop it at once as out of reach: a server cut off from the
        root switched between it and none at every beat it heard naming it."""
        if self.root == self.me.id and root != self.me.id:
            log.warning("cluster %s: %s steps down: %s is root at epoch %d",
                        self.config.name, self.me.id, root or "a root it does not reach",
                        epoch)
        if self.root == self.me.id and (root != self.me.id or epoch != self.epoch):
            self.changes.drop(f"{root or 'a root out of reach'} became root at epoch {epoch}")
        if epoch != self.epoch:
            self.epoch = epoch
            self._keep()
        self.root = root
        self.changed()

    def _held(self) -> tuple[int, str] | None:
        return None if self.root is None else (self.epoch, self.root)
