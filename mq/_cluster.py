"""A cluster of MQ servers: its configuration, and the links that make its membership.

Every server of a cluster reads the same configuration, a cluster file::

    [cluster]
    name = "shop"                 # like a vhost: a server of another cluster is refused

    [[server]]
    id = "a"                      # its broker id in the universe
    address = "127.0.0.1:9901"    # where its process listens
    type = "primary"              # primary, backup or fanout

The order of the servers is their seniority (the first is the most senior).  The
configuration's checksum (CRC-32 of its canonical JSON: the name, then each server's
id, address and type, in order) stands for the whole list, as OpenAMQ's clusters did:
two servers agree on the cluster only if their checksums are equal.

Membership: each server dials every other on :data:`CLUSTER_PORT` and accepts every
other's link there, so that a pair has one link each way, fully interconnected.  A link
opens with ``hello`` ``{cluster, id, checksum}``: the side that accepts it checks that
the cluster name and the checksum are its own, and that the id is a server of the
configuration and the broker that dialled, and refuses it otherwise (409, with the
reason; it closes the link).  The same check runs on every heartbeat (``beat``, each
:data:`HEARTBEAT` seconds).  Each side logs a refusal once per peer and reason, however
often the peer dials again.  A second link from one peer replaces the first (the older
one is closed): never two live links one way for one pair.
"""

from __future__ import annotations

import json
import logging
import tomllib
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from brokermgr import (
    MAX_INT,
    STALE_EPOCH,
    Broker,
    BrokerLink,
    Call,
    Command,
    CommandTable,
    Fields,
    Outcome,
    ReplyObject,
    ServiceError,
    ServiceSession,
    Status,
    fenced,
)
from channels import MessageQueue
from pump import ConfigError, Repeating

from ._root import candidate, may_take_over

__all__ = ["CLUSTER_PORT", "HEARTBEAT", "SERVER_TYPES", "ClusterConfig", "ClusterNode",
           "ClusterServer", "load_cluster", "parse_cluster"]

log = logging.getLogger("rdvpump.mq.cluster")

#: The rendezvous port of the links between a cluster's servers.
CLUSTER_PORT = 15556
#: Seconds between heartbeats on each link a server dialled.
HEARTBEAT = 1.0
#: Longest back-off between dials of a peer that cannot be reached or refused us.
RETRY = 1.0
SERVER_TYPES = ("primary", "backup", "fanout")


@dataclass(frozen=True)
class ClusterServer:
    id: str
    address: str
    type: str


@dataclass(frozen=True)
class ClusterConfig:
    """A cluster's name and its servers, most senior first."""

    name: str
    servers: tuple[ClusterServer, ...]

    @property
    def checksum(self) -> int:
        canonical = json.dumps([self.name, [[s.id, s.address, s.type] for s in self.servers]],
                               separators=(",", ":"))
        return zlib.crc32(canonical.encode())

    def server(self, server_id: str) -> ClusterServer | None:
        return next((s for s in self.servers if s.id == server_id), None)

    def peers(self, me: str) -> list[ClusterServer]:
        return [s for s in self.servers if s.id != me]


def parse_cluster(data: Mapping[str, Any], where: str = "cluster") -> ClusterConfig:
    """A configuration from a cluster file's tables; :class:`ConfigError` naming the
    field of the first problem."""
    unknown = set(data) - {"cluster", "server"}
    if unknown:
        raise ConfigError(f"{where}: unknown table {sorted(unknown)[0]!r} (a cluster file "
                          f"has [cluster] and [[server]])")
    table = data.get("cluster")
    if table is None:
        raise ConfigError(f"{where}: no [cluster] table: it names the cluster")
    if not isinstance(table, dict) or set(table) - {"name"}:
        raise ConfigError(f"{where}: [cluster] takes one key, name")
    name = table.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{where}: [cluster] name must be a non-empty string")
    rows = data.get("server")
    if not isinstance(rows, list) or not rows:
        raise ConfigError(f"{where}: no [[server]]: a cluster needs at least one")
    servers: list[ClusterServer] = []
    for i, row in enumerate(rows):
        at = f"{where}: server {i + 1}"
        if not isinstance(row, dict) or set(row) != {"id", "address", "type"}:
            raise ConfigError(f"{at}: takes id, address and type, got "
                              f"{sorted(row) if isinstance(row, dict) else row!r}")
        for key in ("id", "address", "type"):
            if not isinstance(row[key], str) or not row[key]:
                raise ConfigError(f"{at}: {key} must be a non-empty string")
        if row["id"].startswith("@"):
            raise ConfigError(f"{at}: id {row['id']!r}: ids starting with @ are the "
                              f"universe's own")
        if row["type"] not in SERVER_TYPES:
            raise ConfigError(f"{at}: type must be one of {', '.join(SERVER_TYPES)}, got "
                              f"{row['type']!r}")
        host, _, port = row["address"].rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"{at}: address must be HOST:PORT, got {row['address']!r}")
        if any(s.id == row["id"] for s in servers):
            raise ConfigError(f"{at}: id {row['id']!r} is listed twice")
        servers.append(ClusterServer(row["id"], row["address"], row["type"]))
    if not any(s.type == "primary" for s in servers):
        raise ConfigError(f"{where}: no primary server: the root is elected among them")
    return ClusterConfig(name, tuple(servers))


def load_cluster(path: str | Path) -> ClusterConfig:
    """Read a cluster file; :class:`ConfigError` (the file and the field) if it is not
    one."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the cluster file: "
                          f"{exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not TOML: {exc}") from None
    return parse_cluster(data, str(path))


@dataclass(frozen=True)
class _Hello:
    cluster: str
    id: str
    checksum: int
    #: The sender's vote (the most senior primary it sees; None from a backup or fanout
    #: server), and the root it follows with that root's epoch.
    vote: str | None = None
    root: str | None = None
    epoch: int = 0


def _hello(fields: Fields) -> _Hello:
    return _Hello(fields.string("cluster"), fields.string("id"),
                  fields.integer("checksum", None, 0, 0xFFFFFFFF),
                  fields.optional_string("vote"), fields.optional_string("root"),
                  fields.integer("epoch", 0, 0, MAX_INT))


@dataclass
class Peer:
    """What a server knows of another: its link out, its link in, why it was refused."""

    server: ClusterServer
    outgoing: _PeerLink | None = None
    incoming: MessageQueue | None = None
    #: Why the last hello or beat on either link was refused (None: agreed).
    refusal: str | None = None
    said: set[str] = field(default_factory=set)

    def row(self) -> dict[str, Any]:
        out = self.outgoing
        return {"id": self.server.id, "type": self.server.type,
                "outgoing": "up" if out is not None and out.agreed else "down",
                "incoming": "up" if self.incoming is not None else "down",
                "refusal": self.refusal}


class ClusterNode:
    """One server's side of its cluster: it serves :data:`CLUSTER_PORT` on ``broker``
    (whose id must be one of ``config``'s servers) and dials every other server."""

    def __init__(self, broker: Broker, config: ClusterConfig, *,
                 heartbeat: float = HEARTBEAT, retry: float = RETRY,
                 on_change: Callable[[], object] | None = None) -> None:
        me = config.server(broker.id)
        if me is None:
            raise ConfigError(f"broker {broker.id!r} is not a server of cluster "
                              f"{config.name!r} ({', '.join(s.id for s in config.servers)})")
        self.broker = broker
        self.config = config
        self.me = me
        self.checksum = config.checksum
        self.peers = {s.id: Peer(s) for s in config.peers(broker.id)}
        self.table = CommandTable("cluster", {"hello": Command(_hello, self._hello),
                                              "beat": Command(_hello, self._beat),
                                              "root": Command(_hello, self._root)})
        #: The root this server follows (None: none yet, the cluster is not ready) and its
        #: epoch; each peer's vote as it last said it (:mod:`._root`).
        self.root: str | None = None
        self.epoch = 0
        self.votes: dict[str, str | None] = {}
        self._closed = False
        self._said: set[str] = set()  # refusals of brokers that are not peers, logged
        #: Called when a peer's links come up or go down.
        self.on_change = on_change
        broker.listen(CLUSTER_PORT, self)
        for peer in self.peers.values():
            peer.outgoing = _PeerLink(self, peer, retry=retry)
            peer.outgoing.connect()
        self._beats: Repeating = broker.pump.call_every(heartbeat, self._beat_all)

    # -- links in ----------------------------------------------------------------------

    def accepted(self, queue: MessageQueue) -> None:
        queue.set_listener(_Session(self, queue))

    def _hello(self, request: _Hello, call: Call) -> ReplyObject:
        peer = self._check(request, call)
        assert call.queue is not None
        if peer.incoming is not None and peer.incoming is not call.queue:
            old, peer.incoming = peer.incoming, None
            old.close(f"a newer link from {peer.server.id} replaces this one")
        peer.incoming = call.queue
        self._heard(request)
        self.links_changed()
        return self._agreed()

    def _beat(self, request: _Hello, call: Call) -> ReplyObject:
        peer = self._check(request, call)
        if peer.incoming is not call.queue:
            raise ServiceError(Status.CONFLICT, f"{peer.server.id}: a beat on a link that "
                                                f"did not say hello", refused="cluster")
        self._heard(request)
        self.elect()
        return self._agreed()

    def _root(self, request: _Hello, call: Call) -> ReplyObject:
        """A root's announcement: followed unless an epoch this server holds fences it."""
        self._check(request, call)
        if request.root != request.id or fenced(self._held(), request.id, request.epoch):
            raise ServiceError(Status.CONFLICT, f"{STALE_EPOCH}: {request.id} announced "
                               f"itself root at epoch {request.epoch}; this server follows "
                               f"{self.root} at epoch {self.epoch}", refused=STALE_EPOCH)
        self._follow(request.id, request.epoch)
        return self._agreed()

    def _heard(self, request: _Hello) -> None:
        """What a peer's hello or beat says: its vote, and a root under a newer epoch."""
        self.votes[request.id] = request.vote
        if request.root is not None and (request.epoch > self.epoch or (
                self.root is None and request.epoch == self.epoch)):
            self._follow(request.root, request.epoch)

    def _agreed(self) -> ReplyObject:
        return {"cmd": "welcome", "cluster": self.config.name, "id": self.me.id,
                "checksum": self.checksum}

    # -- the root ----------------------------------------------------------------------

    def active(self) -> list[str]:
        """This server and the peers linked to it both ways."""
        return [self.me.id, *(p.server.id for p in self.peers.values()
                              if p.outgoing is not None and p.outgoing.agreed
                              and p.incoming is not None)]

    def vote(self) -> str | None:
        """The primary this server votes for (a primary's vote; None from the others)."""
        return candidate(self.config, self.active()) if self.me.type == "primary" else None

    def elect(self) -> None:
        """Take over as root when the rule of :mod:`._root` says so (announced to every
        peer at the next epoch); step down when it no longer holds (a minority left)."""
        if self._closed:
            return
        active = self.active()
        if may_take_over(self.config, self.me.id, active, self.votes):
            if self.root != self.me.id:
                self._follow(self.me.id, self.epoch + 1)
                log.warning("cluster %s: %s is root at epoch %d (active: %s)",
                            self.config.name, self.me.id, self.epoch, ", ".join(active))
                for peer in self.peers.values():
                    if peer.outgoing is not None and peer.outgoing.agreed:
                        peer.outgoing.say("root")
        elif self.root == self.me.id:
            log.warning("cluster %s: %s steps down as root at epoch %d: it sees %s",
                        self.config.name, self.me.id, self.epoch, ", ".join(active))
            self.root = None
            self.changed()
        elif self.root is not None and self.root not in active:
            self.root = None  # its root is out of reach: not ready until one is known
            self.changed()

    def _follow(self, root: str, epoch: int) -> None:
        if self.root == self.me.id and root != self.me.id:
            log.warning("cluster %s: %s steps down: %s is root at epoch %d",
                        self.config.name, self.me.id, root, epoch)
        self.root, self.epoch = root, epoch
        self.changed()

    def _held(self) -> tuple[int, str] | None:
        return None if self.root is None else (self.epoch, self.root)

    def _check(self, request: _Hello, call: Call) -> Peer:
        """The peer a hello or beat comes from; 409 with the reason (logged once per peer
        and reason, the link closed once the reply is sent) if it is not one of ours."""
        remote = call.queue.remote_id if call.queue is not None else "?"
        why = self.disagreement(request.cluster, request.id, request.checksum)
        if why is None and request.id != remote:
            why = f"says it is {request.id!r} but its link is from broker {remote!r}"
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
        raise ServiceError(Status.CONFLICT, why, refused="cluster")

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
        if self.on_change is not None and not self._closed:
            self.on_change()

    # -- links out ---------------------------------------------------------------------

    def _beat_all(self) -> None:
        for peer in self.peers.values():
            if peer.outgoing is not None and peer.outgoing.agreed:
                peer.outgoing.say("beat")

    def refused(self, peer: Peer, why: str) -> None:
        """``peer`` disagrees (``why``): kept with it, logged once."""
        peer.refusal = why
        self._say(why, key=peer.server.id, peer=peer)

    def _say(self, why: str, *, key: str, peer: Peer | None = None) -> None:
        said = peer.said if peer is not None else self._said
        if why not in said:
            said.add(why)
            log.error("cluster %s: %s: %s", self.config.name, self.me.id, why)

    # -- state -------------------------------------------------------------------------

    def rows(self) -> list[dict[str, Any]]:
        """Each peer: its type, its links out and in (up or down), a refusal."""
        return [peer.row() for peer in self.peers.values()]

    def summary(self) -> str:
        """Which peers are linked both ways, for a person: ``cluster shop: a linked to
        b, c (2 of 3 peers)``."""
        up = [p.server.id for p in self.peers.values() if p.outgoing is not None
              and p.outgoing.agreed and p.incoming is not None]
        root = (f"root {self.root} at epoch {self.epoch}" if self.root is not None
                else "no root")
        return (f"cluster {self.config.name}: {self.me.id} ({self.me.type}) linked to "
                f"{', '.join(up) or 'no peer'} ({len(up)} of {len(self.peers)} peers); "
                f"{root}")

    def linked(self) -> bool:
        """Every peer linked both ways and agreeing."""
        return all(p.outgoing is not None and p.outgoing.agreed and p.incoming is not None
                   for p in self.peers.values())

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._beats.cancel()
        for peer in self.peers.values():
            if peer.outgoing is not None:
                peer.outgoing.close()
            if peer.incoming is not None:
                peer.incoming.close("cluster server closed")
        if not self.broker.closed:
            self.broker.unbind(CLUSTER_PORT)


class _Session(ServiceSession):
    what = "cluster request"

    def __init__(self, node: ClusterNode, queue: MessageQueue) -> None:
        super().__init__(queue, node.table)
        self.node = node

    def closed(self, reason: str) -> None:
        self.node.incoming_closed(self.queue)


class _PeerLink(BrokerLink):
    """This server's link to one peer: hello on every connect, beats while agreed."""

    def __init__(self, node: ClusterNode, peer: Peer, *, retry: float) -> None:
        super().__init__(node.broker, peer.server.id, CLUSTER_PORT,
                         name=f"cluster peer {peer.server.id}", retry=retry)
        self.node = node
        self.peer = peer
        self.agreed = False

    def opened(self) -> None:
        self.say("hello")

    def say(self, cmd: str) -> None:
        node = self.node
        self.request({"cmd": cmd, "cluster": node.config.name, "id": node.me.id,
                      "checksum": node.checksum, "vote": node.vote(), "root": node.root,
                      "epoch": node.epoch}, self._answered)

    def _answered(self, outcome: Outcome) -> None:
        if isinstance(outcome, ServiceError):
            if outcome.status != Status.NO_REPLY:  # refused: the peer closes the link
                self._down()
                self.node.refused(self.peer, f"{self.peer.server.id} refused it: "
                                              f"{outcome.reason}")
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
        if not self.agreed:
            self.agreed = True
            self.node.links_changed()

    def lost(self, reason: str) -> None:
        self._down()

    def _down(self) -> None:
        if self.agreed:
            self.agreed = False
            self.node.links_changed()
