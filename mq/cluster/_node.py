"""A cluster of MQ servers: its configuration, and the links that make its membership.

Every server of a cluster reads the same configuration, a cluster file
(:mod:`._file`: its servers in seniority order, and a checksum of it all).

Membership: each server dials every other on :data:`CLUSTER_PORT` and accepts every
other's link there, so that a pair has one link each way, fully interconnected.  A link
opens with ``hello`` ``{cluster, id, checksum}``: the side that accepts it checks that
the cluster name and the checksum are its own, and that the id is a server of the
configuration and the broker that dialled, and refuses it otherwise (409, with the
reason; it closes the link).  The same check runs on every heartbeat (``beat``, each
:data:`HEARTBEAT` seconds).  Each side logs a refusal once per peer and reason, however
often the peer dials again.  A second link from one peer replaces the first (the older
one is closed): never two live links one way for one pair.

The root: every message also carries the sender's ballot, the root it follows with its
epoch, and the mark of its cluster state; each server works out the election itself
(:mod:`._root`), keeps its epoch and ballot on disk before a peer hears them, and the
root announces itself (``root``).  Cluster state (:mod:`._state`): changed only
by the root (``change``, asked of it by the others, held with a bounded wait while there
is no root: the cluster is not ready), sent whole to every server (``state``), fetched
by a server that is behind (``fetch``).  A change is acknowledged once a majority of the
primaries hold it, and a primary that voted in a newer epoch takes no older root's
state: a root of a newer epoch, which a majority voted for, never lacks a change that
was acknowledged.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from brokermgr import (
    STALE_EPOCH,
    Broker,
    Call,
    Command,
    CommandTable,
    ReplyObject,
    ReplyOrError,
    ServiceError,
    Status,
    fenced,
    send,
)
from channels import MessageQueue
from pump import ConfigError, Future, Repeating
from rdv import Identity, Right

from ._changes import Changes
from ._election import Election
from ._file import HEARTBEAT, SILENCE, ClusterConfig
from ._links import Inbound, Peer, PeerLink, Said, change_fields, hello_fields, state_fields
from ._root import Ballot, unruly
from ._state import ClusterState, StateError
from ._votes import load_votes

__all__ = ["CLUSTER_PORT", "HEARTBEAT", "NOT_READY_WAIT", "SILENCE", "ClusterNode"]

log = logging.getLogger("rdvpump.mq.cluster")

#: The rendezvous port of the links between a cluster's servers.
CLUSTER_PORT = 15556
#: Longest back-off between dials of a peer that cannot be reached or refused us.
RETRY = 1.0
#: Seconds a change waits for a root before it is refused: the cluster is not ready (less
#: than a client's default timeout, so that the client hears why).
NOT_READY_WAIT = 5.0


def _timing(config: ClusterConfig, heartbeat: float | None, silence: float | None
            ) -> tuple[float, float]:
    """The heartbeat and silence a server uses: by default the cluster file's (every
    server of a cluster reads the same)."""
    heartbeat = config.heartbeat if heartbeat is None else heartbeat
    silence = config.silence if silence is None else silence
    if not 0 < heartbeat < silence:
        raise ConfigError(f"a cluster's heartbeat ({heartbeat:g} s) must be above 0 and "
                          f"below its silence timeout ({silence:g} s)")
    return heartbeat, silence


class ClusterNode(Election):
    """One server's side of its cluster: it serves :data:`CLUSTER_PORT` on ``broker``
    (whose id must be one of ``config``'s servers) and dials every other server."""

    def __init__(self, broker: Broker, config: ClusterConfig, *,
                 heartbeat: float | None = None, silence: float | None = None,
                 retry: float = RETRY,
                 on_change: Callable[[], object] | None = None,
                 on_state: Callable[[ClusterState, ClusterState], object] | None = None,
                 not_ready_wait: float = NOT_READY_WAIT,
                 store: str | os.PathLike[str] | None = None) -> None:
        me = config.server(broker.id)
        if me is None:
            raise ConfigError(f"broker {broker.id!r} is not a server of cluster "
                              f"{config.name!r} ({', '.join(s.id for s in config.servers)})")
        self.broker = broker
        self.config = config
        self.me = me
        self.checksum = config.checksum
        self.port = CLUSTER_PORT
        self.peers = {s.id: Peer(s) for s in config.peers(broker.id)}
        self.table = CommandTable("cluster", {"hello": Command(hello_fields, self._hello),
                                              "beat": Command(hello_fields, self._beat),
                                              "root": Command(hello_fields, self._root),
                                              "state": Command(state_fields, self._state),
                                              "change": Command(change_fields, self._change),
                                              "fetch": Command(hello_fields, self._fetch)})
        heartbeat, silence = _timing(config, heartbeat, silence)
        #: The shared topics and groups (:mod:`._state`); ``on_state(old, new)``
        #: is told each new state this server takes (its MQ server declares and removes).
        self.state = ClusterState()
        self.on_state = on_state
        self.not_ready_wait = not_ready_wait
        #: The state version each peer said last: a primary behind one of them fetches
        #: that peer's state before it may take over.
        self.versions: dict[str, tuple[int, int]] = {}
        #: The fetches under way: when each peer was asked.
        self._fetching: dict[str, float] = {}
        #: The root this server follows (None: none yet, the cluster is not ready) and its
        #: epoch; each peer's vote as it last said it (:mod:`._root`).
        self.root: str | None = None
        self.epoch = 0
        self.votes: dict[str, Ballot] = {}
        #: This server's vote: a primary and the epoch it would lead (a primary's; (None,
        #: 0) from the others).
        self.ballot: Ballot = (None, 0)
        #: Where this server keeps its epoch and ballot across restarts (None: nowhere;
        #: then a server that restarts may vote twice in one epoch).
        self.store = None if store is None else Path(store) / f"cluster-{broker.id}.json"
        if self.store is not None:
            self.epoch, self.ballot, self.state = load_votes(self.store)
        self._closed = False
        #: The changes to the shared topics, made by the root once a majority hold them.
        self.changes = Changes(self)
        self._said: set[str] = set()  # refusals of brokers that are not peers, logged
        #: Called when a peer's links come up or go down, or the root changes; and the
        #: same for each of ``watchers`` (this server's MQ relay: :mod:`._relay`).
        self.on_change = on_change
        self.watchers: list[Callable[[], object]] = []
        #: Peers counted out for their silence (:data:`SILENCE`), while they are.
        self.silent: set[str] = set()
        self._live = silence
        self._beats = self._start(retry, heartbeat)

    def _start(self, retry: float, heartbeat: float) -> Repeating:
        """Listen on :data:`CLUSTER_PORT`, dial every peer, beat."""
        self.broker.listen(CLUSTER_PORT, self)
        for peer in self.peers.values():
            peer.outgoing = PeerLink(self, peer, retry=retry)
            peer.outgoing.connect()
        return self.broker.pump.call_every(heartbeat, self._beat_all)

    # -- links in ----------------------------------------------------------------------

    def accepted(self, queue: MessageQueue) -> None:
        queue.set_listener(Inbound(self, queue))

    def _hello(self, request: Said, call: Call) -> ReplyObject:
        """A peer's link in: taken, unless that peer has a live link in already (a hello
        or beat on it within the silence timeout, :data:`SILENCE`): a second link that says it
        is that peer is refused and changes nothing; a silent one (its peer restarted
        behind a connection left open) is replaced."""
        peer = self._check(request, call)
        assert call.queue is not None
        now = self.broker.pump.now()
        if peer.incoming is not None and peer.incoming is not call.queue:
            if now - peer.heard_at < self._live:
                why = (f"a second link that says it is {peer.server.id}: its link is live "
                       f"(heard {now - peer.heard_at:.1f} s ago), and is kept")
                self._say(why, key=peer.server.id)
                queue = call.queue
                self.broker.pump.post("cluster refusal", lambda: queue.close(
                    f"refused by {self.me.id}: {why}"), owner=self.broker)
                raise ServiceError(Status.CONFLICT, why, refused="live")
            old, peer.incoming = peer.incoming, None
            old.close(f"a newer link from {peer.server.id} replaces this one, silent for "
                      f"{now - peer.heard_at:.1f} s")
        peer.incoming = call.queue
        peer.heard_at = now
        self._heard(request)
        self.links_changed()
        return self._agreed()

    def _beat(self, request: Said, call: Call) -> ReplyObject:
        peer = self._check(request, call)
        if peer.incoming is not call.queue:
            raise ServiceError(Status.CONFLICT, f"{peer.server.id}: a beat on a link that "
                                                f"did not say hello", refused="cluster")
        peer.heard_at = self.broker.pump.now()
        self._heard(request)
        if peer.server.id in self.silent:
            self._silences()
        self.elect()
        return self._agreed()

    def _root(self, request: Said, call: Call) -> ReplyObject:
        """A root's announcement: followed unless the rule forbids it
        (:func:`._root.unruly`) or an epoch this server holds fences it."""
        self._check(request, call)
        if request.root != request.id or fenced(self._held(), request.id, request.epoch):
            raise ServiceError(Status.CONFLICT, f"{STALE_EPOCH}: {request.id} announced "
                               f"itself root at epoch {request.epoch}; this server follows "
                               f"{self.root} at epoch {self.epoch}", refused=STALE_EPOCH)
        self.votes[request.id] = (request.vote, request.vote_epoch)
        self._refuse_unruly(request.id, request.epoch, "announced itself root")
        self._follow(request.id, request.epoch)
        return self._agreed()

    def _state(self, request: Said, call: Call) -> ReplyObject:
        """The root's state: taken under a newer epoch whatever its version, under this
        epoch when newer; from any other server, refused."""
        self._check(request, call)
        if request.root != request.id or fenced(self._held(), request.id, request.epoch):
            raise ServiceError(Status.CONFLICT, f"{STALE_EPOCH}: state from {request.id} "
                               f"at epoch {request.epoch}; this server follows {self.root} "
                               f"at epoch {self.epoch}", refused=STALE_EPOCH)
        if request.epoch < self.ballot[1]:
            # this primary voted in a newer epoch: whoever is root there may have taken
            # over without this state, so it must not count towards a change's majority
            raise ServiceError(Status.CONFLICT, f"{STALE_EPOCH}: state from {request.id} "
                               f"at epoch {request.epoch}; this server voted for "
                               f"{self.ballot[0]} at epoch {self.ballot[1]}",
                               refused=STALE_EPOCH)
        self._refuse_unruly(request.id, request.epoch, "sent its state as root")
        try:  # a state that cannot be taken changes nothing, the root followed included
            state = ClusterState.of(request.version, request.topics, request.state_epoch,
                                    request.removed)
        except StateError as exc:
            raise ServiceError(Status.BAD_REQUEST, f"state from {request.id}: {exc}") from None
        if request.epoch > self.epoch or self.root is None:
            self._follow(request.id, request.epoch)
        if state.mark != self.state.mark or state.topics != self.state.topics:
            self.take(state)
        return {"cmd": "taken", "version": self.state.version,
                "state_epoch": self.state.epoch}

    def _change(self, request: Said, call: Call) -> ReplyObject | None:
        """A change asked of the root, answered once a majority of the primaries hold it
        (:meth:`._changes.Changes.apply`); another server says where the root is (503)."""
        self._check(request, call)
        if self.root != self.me.id:
            raise ServiceError(Status.UNAVAILABLE, f"{self.me.id} is not the root; the "
                               f"root is {self.root or 'not known: the cluster is not ready'}",
                               root=self.root)
        assert request.change is not None
        queue, seq = call.queue, call.seq

        def answer(outcome: int | ServiceError) -> None:
            if queue is None or seq is None:
                return
            reply = (outcome.envelope("change") if isinstance(outcome, ServiceError)
                     else {"cmd": "changed", "version": outcome})
            send(queue, {**reply, "seq": seq}, what=f"cluster peer {queue.remote_id}")

        self.changes.apply(*request.change, answer, by=request.id)
        return None

    def take(self, state: ClusterState) -> None:
        """``state`` is this server's now: kept on disk, told to ``on_state``."""
        old, self.state = self.state, state
        self._keep()
        if self.on_state is not None:
            self.on_state(old, state)
        self.changed()

    def send_state(self) -> None:
        """The whole state to every peer linked (the root's: a change, a joiner)."""
        for peer in self.peers.values():
            if peer.outgoing is not None and peer.outgoing.agreed:
                peer.outgoing.say("state", **self.state.snapshot())

    def change_soon(self, op: str, topic: str, group: str | None, filter_: str | None,
                    done: Callable[[int | ServiceError], object]) -> None:
        """:meth:`._changes.Changes.soon`: a shared topic (or a group of it) declared or
        removed through the root."""
        self.changes.soon(op, topic, group, filter_, done)

    async def change(self, op: str, topic: str, group: str | None = None,
                     filter_: str | None = None) -> int:
        """:meth:`change_soon`, awaited: the state's version once the root has it, or
        the :class:`ServiceError`."""
        outcome: Future[int | ServiceError] = Future()
        self.change_soon(op, topic, group, filter_, outcome.set)
        result = await outcome.wait()
        if isinstance(result, ServiceError):
            raise result
        return result

    def took(self, peer: str, state_epoch: int, version: int) -> None:
        """``peer`` took this root's state at ``version`` (its reply to ``state``): the
        changes waiting for it may be answered."""
        self.versions[peer] = max(self.versions.get(peer, (0, 0)), (state_epoch, version))
        self.changes.answer_confirmed()

    def root_link(self) -> PeerLink | None:
        """The link to the root, if one is up and agreed."""
        link = None if self.root is None else self.peers[self.root].outgoing
        return link if link is not None and link.agreed else None

    def _fetch(self, request: Said, call: Call) -> ReplyObject:
        """This server's state, for a peer behind it."""
        self._check(request, call)
        return {"cmd": "state", **self.state.snapshot()}

    def _behind(self, peer: str) -> None:
        """A peer has a newer state than this server: fetch it.  One fetch at a time,
        while the peer asked may still answer; one that has not answered within the
        silence timeout (or fell silent), its link open, is not waited for: another
        peer is asked, and it is not asked again until it answers."""
        link = self.peers[peer].outgoing
        now = self.broker.pump.now()
        if link is None or not link.agreed or peer in self._fetching or any(
                asked not in self.silent and now - at <= self._live
                for asked, at in self._fetching.items()):
            return
        self._fetching[peer] = now

        def fetched(outcome: ReplyOrError) -> None:
            self._fetching.pop(peer, None)
            if isinstance(outcome, ServiceError):
                return
            try:
                state = ClusterState.of(int(outcome.get("version") or 0), outcome.get("topics"),
                                        int(outcome.get("state_epoch") or 0),
                                        outcome.get("removed"))
            except (StateError, ValueError):
                return
            if state.mark > self.state.mark or (peer == self.root
                                                and state.mark != self.state.mark):
                self.take(state)
                self.elect()

        if not link.request({"cmd": "fetch", **link.said()}, fetched):
            del self._fetching[peer]  # not sent (past the high-water mark): asked again later

    def _heard(self, request: Said) -> None:
        """What a peer's hello or beat says: its vote, its state's version (this server
        fetches a newer one), and a root under a newer epoch."""
        self.votes[request.id] = (request.vote, request.vote_epoch)
        mark = (request.state_epoch, request.version)
        self.versions[request.id] = mark
        self.changes.answer_confirmed()
        if mark > self.state.mark or (request.id == self.root and mark != self.state.mark):
            self._behind(request.id)
        if request.root is not None and request.root != self.me.id and (
                request.epoch > self.epoch or (self.root is None
                                               and request.epoch == self.epoch)):
            why = unruly(self.config, self.me.id, self.ballot, request.root,
                         request.epoch) or self._unvoted(request.root, request.epoch)
            if why is None and request.root in self.active():
                self._follow(request.root, request.epoch)
            elif why is None:  # a root out of reach: its epoch only, when newer
                if request.epoch > self.epoch:
                    self._follow(None, request.epoch)
            else:  # hearsay that breaks the rule: not followed
                self._say(f"not following {request.root}, named root by {request.id}: "
                          f"{why}", key=request.id)

    def _agreed(self) -> ReplyObject:
        return {"cmd": "welcome", "cluster": self.config.name, "id": self.me.id,
                "checksum": self.checksum}

    def _check(self, request: Said, call: Call) -> Peer:
        """The peer a hello or beat comes from; 409 with the reason (logged once per peer
        and reason, the link closed once the reply is sent) if it is not one of ours."""
        remote = call.queue.remote_id if call.queue is not None else "?"
        identity: Identity | None = None if call.queue is None else call.queue.identity
        status = Status.CONFLICT
        why = self.disagreement(request.cluster, request.id, request.checksum)
        if why is None and request.id != remote:
            why = f"says it is {request.id!r} but its link is from broker {remote!r}"
        if why is None and identity is not None and not identity.may(Right.MEMBER, request.id):
            identity.denied(Right.MEMBER)
            status = Status.FORBIDDEN
            why = (f"says it is {request.id!r}, which its link's identity {identity.name!r} "
                   f"may not speak as")
        if why is None:
            peer = self.peers[request.id]
            peer.refusal = None
            return peer
        peer_or_none = self.peers.get(remote)
        if peer_or_none is not None:
            self.refused(peer_or_none, f"refused {remote}: {why}")
        else:
            self._say(f"refused {remote}: {why}", key=remote)
        if call.queue is not None:
            queue = call.queue
            self.broker.pump.post("cluster refusal", lambda: queue.close(
                f"refused by {self.me.id}: {why}"), owner=self.broker)
        raise ServiceError(status, why, refused="cluster")

    def disagreement(self, cluster: str, server_id: str, checksum: int) -> str | None:
        """Why a peer that says this is not one of this server's cluster (None: it is)."""
        if cluster != self.config.name:
            return f"cluster {cluster!r} is not this one ({self.config.name!r})"
        if server_id == self.me.id or server_id not in self.peers:
            return (f"{server_id!r} is not another server of cluster {self.config.name!r} "
                    f"({', '.join(s.id for s in self.config.servers)})")
        if checksum != self.checksum:
            return (f"the cluster's server list differs (checksum {checksum:#010x}, this "
                    f"server's {self.checksum:#010x}): every server must read the same "
                    f"cluster file")
        return None

    def incoming_closed(self, queue: MessageQueue) -> None:
        for peer in self.peers.values():
            if peer.incoming is queue:
                peer.incoming = None
                self.links_changed()

    def links_changed(self) -> None:
        """A link came up or went down: the vote may change; say it to every peer now
        (not at the next beat), and elect again."""
        self.changed()
        self._beat_all()
        self.elect()

    def changed(self) -> None:
        if self._closed:
            return
        if self.on_change is not None:
            self.on_change()
        for watcher in list(self.watchers):
            watcher()

    # -- links out ---------------------------------------------------------------------

    def _beat_all(self) -> None:
        self._silences()
        for peer in self.peers.values():
            if peer.outgoing is not None and peer.outgoing.agreed:
                peer.outgoing.say("beat")

    def refused(self, peer: Peer, why: str) -> None:
        """``peer`` disagrees (``why``): kept with it, logged once."""
        peer.refusal = why
        self._say(why, key=peer.server.id, peer=peer)

    def _say(self, why: str, *, key: str, peer: Peer | None = None,
             level: int = logging.ERROR) -> None:
        said = peer.said if peer is not None else self._said
        if why not in said:
            if len(said) >= 256:  # bounded: reasons name epochs, which move on
                said.clear()
            said.add(why)
            log.log(level, "cluster %s: %s: %s", self.config.name, self.me.id, why)

    # -- state -------------------------------------------------------------------------

    def rows(self) -> list[dict[str, Any]]:
        """Each peer: its type, its links out and in (up or down), a refusal."""
        return [peer.row() for peer in self.peers.values()]

    def summary(self) -> str:
        """Which peers are linked both ways, for a person: ``cluster shop: a linked to
        b, c (2 of 3 peers)``."""
        up = [p.server.id for p in self.peers.values() if p.outgoing is not None
              and p.outgoing.agreed and p.incoming is not None
              and p.server.id not in self.silent]
        root = (f"root {self.root} at epoch {self.epoch}" if self.root is not None
                else "no root")
        silent = f"; {', '.join(sorted(self.silent))} silent" if self.silent else ""
        return (f"cluster {self.config.name}: {self.me.id} ({self.me.type}) linked to "
                f"{', '.join(up) or 'no peer'} ({len(up)} of {len(self.peers)} peers"
                f"{silent}); {root}")

    def info(self) -> dict[str, Any]:
        """What this server registers with the name service (``rdvpump status`` shows it):
        its cluster and type, the root it follows, the epoch, its state's version."""
        return {"name": self.config.name, "type": self.me.type, "root": self.root,
                "epoch": self.epoch, "version": self.state.version}

    def linked(self) -> bool:
        """Every peer linked both ways and agreeing."""
        return all(p.outgoing is not None and p.outgoing.agreed and p.incoming is not None
                   for p in self.peers.values())

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.changes.drop("the cluster server closed")
        self._beats.cancel()
        for peer in self.peers.values():
            if peer.outgoing is not None:
                peer.outgoing.close()
            if peer.incoming is not None:
                peer.incoming.close("cluster server closed")
        if not self.broker.closed:
            self.broker.unbind(CLUSTER_PORT)

    @property
    def closed(self) -> bool:
        return self._closed
