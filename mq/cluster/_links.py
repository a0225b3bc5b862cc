"""The messages between a cluster's servers and the two ends of each link.

Every message says the cluster, the sender, its checksum, its vote, the root it follows
with its epoch, and its state's version (:meth:`_PeerLink.said`); ``hello`` opens a link,
``beat`` follows each heartbeat, ``root`` announces a new root, ``state`` carries the
root's state, ``change`` asks the root for one, ``fetch`` asks a peer for its state.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Protocol

from brokermgr import (
    MAX_INT,
    STALE_EPOCH,
    Broker,
    BrokerLink,
    CommandTable,
    Fields,
    ReplyOrError,
    ServiceError,
    ServiceSession,
    Status,
)
from channels import MessageQueue

from ._file import ClusterConfig, ClusterServer
from ._root import Ballot
from ._state import CHANGES, ClusterState


class LinkedNode(Protocol):
    """What the links ask of their server's side of the cluster (:class:`~mq.ClusterNode`):
    what it says of itself in each message, its commands, and what it is told."""

    broker: Broker
    port: int
    config: ClusterConfig
    me: ClusterServer
    checksum: int
    ballot: Ballot
    root: str | None
    epoch: int
    state: ClusterState
    table: CommandTable

    def incoming_closed(self, queue: MessageQueue) -> None: ...

    def took(self, peer: str, state_epoch: int, version: int) -> None: ...

    def refused(self, peer: Peer, why: str) -> None: ...

    def disagreement(self, cluster: str, server_id: str, checksum: int) -> str | None: ...

    def links_changed(self) -> None: ...

@dataclass(frozen=True)
class Said:
    cluster: str
    id: str
    checksum: int
    #: The sender's vote (the most senior primary it sees; None from a backup or fanout
    #: server), and the root it follows with that root's epoch.
    vote: str | None = None
    root: str | None = None
    epoch: int = 0
    #: The epoch the sender's vote is for (a ballot: :mod:`._root`).
    vote_epoch: int = 0
    #: ``state``: the root's state (its version and topics); ``change``: one change.
    version: int = 0
    state_epoch: int = 0
    topics: Any = None
    #: ``state``: what the root removed (:mod:`._state`).
    removed: Any = None
    change: tuple[str, str, str | None, str | None] | None = None


def hello_fields(fields: Fields) -> Said:
    return Said(fields.string("cluster"), fields.string("id"),
                  fields.integer("checksum", None, 0, 0xFFFFFFFF),
                  fields.optional_string("vote"), fields.optional_string("root"),
                  fields.epoch("epoch", 0),
                  vote_epoch=fields.epoch("vote_epoch", 0),
                  version=fields.integer("version", 0, 0, MAX_INT),
                  state_epoch=fields.epoch("state_epoch", 0))


def state_fields(fields: Fields) -> Said:
    said = hello_fields(fields)
    return dataclasses.replace(said, version=fields.integer("version", None, 0, MAX_INT),
                               state_epoch=fields.epoch("state_epoch", 0),
                               topics=fields.raw("topics"), removed=fields.raw("removed"))


def change_fields(fields: Fields) -> Said:
    said = hello_fields(fields)
    op = fields.string("op")
    if op not in CHANGES:
        raise fields.bad("op", f"one of {', '.join(CHANGES)}")
    return dataclasses.replace(said, change=(
        op, fields.string("topic"), fields.optional_string("group"),
        fields.optional_string("filter")))


@dataclass
class Peer:
    """What a server knows of another: its link out, its link in, why it was refused."""

    server: ClusterServer
    outgoing: PeerLink | None = None
    incoming: MessageQueue | None = None
    #: Why the last hello or beat on either link was refused (None: agreed).
    refusal: str | None = None
    #: When a hello or beat last came on the link in, and when the peer last answered
    #: one of ours on the link out (pump time): two TCP connections, so that one stalled
    #: by its retransmissions does not make a live peer look silent.
    heard_at: float = float("-inf")
    answered_at: float = float("-inf")
    said: set[str] = field(default_factory=set)

    def row(self) -> dict[str, Any]:
        out = self.outgoing
        return {"id": self.server.id, "type": self.server.type,
                "outgoing": "up" if out is not None and out.agreed else "down",
                "incoming": "up" if self.incoming is not None else "down",
                "refusal": self.refusal}


class Inbound(ServiceSession):
    """A link another server dialled to this one: its requests go to the node's table."""

    what = "cluster request"

    def __init__(self, node: LinkedNode, queue: MessageQueue) -> None:
        super().__init__(queue, node.table)
        self.node = node

    def closed(self, reason: str) -> None:
        self.node.incoming_closed(self.queue)


class PeerLink(BrokerLink):
    """This server's link to one peer: hello on every connect, beats while agreed."""

    def __init__(self, node: LinkedNode, peer: Peer, *, retry: float) -> None:
        super().__init__(node.broker, peer.server.id, node.port,
                         name=f"cluster peer {peer.server.id}", retry=retry)
        self.node = node
        self.peer = peer
        self.agreed = False

    def opened(self) -> None:
        self.say("hello")

    def said(self) -> dict[str, Any]:
        """What every message on the link says: the cluster, this server, its checksum,
        vote, root and epoch."""
        node = self.node
        return {"cluster": node.config.name, "id": node.me.id, "checksum": node.checksum,
                "vote": node.ballot[0], "vote_epoch": node.ballot[1], "root": node.root,
                "epoch": node.epoch,
                "version": node.state.version, "state_epoch": node.state.epoch}

    def say(self, cmd: str, **more: Any) -> None:
        """``hello``, ``beat`` or ``root`` (the answer checked: a ``welcome`` of ours), or
        ``state`` (a refusal logged)."""
        self.request({"cmd": cmd, **self.said(), **more},
                     self._taken if cmd == "state" else self._answered)

    def _taken(self, outcome: ReplyOrError) -> None:
        if not isinstance(outcome, ServiceError):
            version, epoch = outcome.get("version"), outcome.get("state_epoch")
            if type(version) is int and type(epoch) is int:
                self.node.took(self.peer.server.id, epoch, version)
        elif outcome.status != Status.NO_REPLY:
            self.node.refused(self.peer, f"{self.peer.server.id} refused the state: "
                                         f"{outcome.reason}")

    def _answered(self, outcome: ReplyOrError) -> None:
        if isinstance(outcome, ServiceError):
            if outcome.status == Status.NO_REPLY:
                return
            self.node.refused(self.peer, f"{self.peer.server.id} refused it: "
                                         f"{outcome.reason}")
            if outcome.detail.get("refused") in (STALE_EPOCH, "votes"):
                # a root announcement under an epoch the peer has seen passed, or before
                # the votes that carry it reached the peer: the peer is one of ours all
                # the same, and the beats both ways settle it; the link stays agreed
                return
            # the peer does not take this server as one of its cluster: it closes the
            # link (and so does this side, for a refusal that left it open): dialled
            # again, the hello says why
            self._down()
            if self.queue is not None:
                self.queue.close(f"refused by {self.peer.server.id}: {outcome.reason}")
            return
        cluster, server_id, checksum = (outcome.get("cluster"), outcome.get("id"),
                                        outcome.get("checksum"))
        why = self.node.disagreement(str(cluster), str(server_id),
                                     checksum if type(checksum) is int else -1)
        if why is None and server_id != self.peer.server.id:
            why = f"dialled {self.peer.server.id!r}, answered by {server_id!r}"
        if why is not None:
            self._down()
            self.node.refused(self.peer, f"refused {self.peer.server.id}: {why}")
            if self.queue is not None:
                self.queue.close(f"refused by {self.node.me.id}: {why}")
            return
        self.peer.refusal = None
        self.peer.answered_at = self.node.broker.pump.now()
        if not self.agreed:
            self.agreed = True
            self.node.links_changed()

    def lost(self, reason: str) -> None:
        self._down()

    def _down(self) -> None:
        if self.agreed:
            self.agreed = False
            self.node.links_changed()
