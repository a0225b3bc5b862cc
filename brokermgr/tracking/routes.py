"""A client's route table, sans-I/O: zbus's BrokerRouteTable with its version bug fixed.

Fed TrackerInfos (from ``track_sub`` links), static servers and tracker
losses; never reads a clock, never touches a link.  Rules (seeds 000 and 003,
reference section 2):

* A TrackerInfo is accepted only if its InfoVersion is higher than the last
  one accepted *from that tracker* (zbus remembered only the first version it
  saw, so a stale TrackerInfo could overwrite a newer one).
* A ServerInfo is merged only if its InfoVersion is higher than the one held.
* A server listed by fewer than ``vote_factor`` of the trackers is purged
  (with 2 trackers and the default 0.5, one vote keeps it).  Static servers
  (:meth:`RouteTable.update_server` with ``static=True``) are never purged.
* With zero trackers nothing is purged: the last known servers are kept, so
  a client that lost every tracker still routes to what it knew.  Explicit
  here and tested; in zbus it is an accident of ``0 < 0 * factor``.
* The topic table is derived from the server table.  Updates maintain it
  incrementally; :meth:`RouteTable.rebuild_topic_table` rebuilds it whole
  (the benchmark compares the two, the tests check they agree).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .info import ServerInfo, TopicInfo, TrackerInfo

DEFAULT_VOTE_FACTOR = 0.5


@dataclass(frozen=True)
class Vote:
    """What one tracker last told us: the servers it lists, at which InfoVersion."""

    servers: frozenset[str]
    version: int


@dataclass
class RouteChange:
    """What one update did: servers that joined, left or got a newer ServerInfo."""

    joined: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    stale: bool = False

    def __bool__(self) -> bool:
        return bool(self.joined or self.left or self.updated)


class RouteTable:
    """Servers, topics and tracker votes of one client.

    ``on_join(info)`` and ``on_leave(address)`` are called for every server
    that enters or leaves the table, after the table is consistent.
    """

    def __init__(self, *, vote_factor: float = DEFAULT_VOTE_FACTOR,
                 on_join: Callable[[ServerInfo], object] | None = None,
                 on_leave: Callable[[str], object] | None = None) -> None:
        if not 0 < vote_factor <= 1:
            raise ValueError(f"vote_factor must be within (0, 1], got {vote_factor!r}")
        self.vote_factor = vote_factor
        self.on_join = on_join
        self.on_leave = on_leave
        #: address -> the freshest ServerInfo seen
        self.server_table: dict[str, ServerInfo] = {}
        #: topic -> address -> TopicInfo
        self.topic_table: dict[str, dict[str, TopicInfo]] = {}
        #: tracker address -> its last accepted vote
        self.votes: dict[str, Vote] = {}
        self.static: set[str] = set()
        #: Bumped on every change; selectors cache against it.
        self.version = 0

    # -- updates -----------------------------------------------------------------------

    def update_tracker(self, tracker: str, info: TrackerInfo) -> RouteChange:
        """Merge a TrackerInfo from ``tracker``; stale ones change nothing."""
        held = self.votes.get(tracker)
        if held is not None and info.info_version <= held.version:
            return RouteChange(stale=True)
        self.votes[tracker] = Vote(frozenset(info.server_table), info.info_version)
        change = RouteChange()
        for server in info.server_table.values():
            self._merge(server, change)
        self._purge(change)
        return self._done(change)

    def remove_tracker(self, tracker: str) -> RouteChange:
        """A tracker is gone (link lost, removed): its votes go, servers are purged again."""
        change = RouteChange()
        if self.votes.pop(tracker, None) is not None:
            self._purge(change)
        return self._done(change)

    def update_server(self, info: ServerInfo, *, static: bool = False) -> RouteChange:
        """Merge one ServerInfo (only if newer than the one held); ``static`` pins it."""
        change = RouteChange()
        if static:
            self.static.add(info.server_address.address)
        self._merge(info, change)
        return self._done(change)

    def remove_server(self, address: str) -> RouteChange:
        """Drop a server (static or not) now."""
        change = RouteChange()
        self.static.discard(address)
        if address in self.server_table:
            self._drop(address, change)
        return self._done(change)

    # -- queries -----------------------------------------------------------------------

    def voters(self, address: str) -> int:
        return sum(1 for vote in self.votes.values() if address in vote.servers)

    def can_remove(self, address: str) -> bool:
        """Listed by fewer than ``vote_factor`` of the trackers (never with zero trackers)."""
        if address in self.static or not self.votes:
            return False
        return self.voters(address) < len(self.votes) * self.vote_factor

    def servers_of(self, topic: str) -> dict[str, TopicInfo]:
        return self.topic_table.get(topic, {})

    def rebuild_topic_table(self) -> dict[str, dict[str, TopicInfo]]:
        """The topic table computed from scratch from the server table (and installed)."""
        table: dict[str, dict[str, TopicInfo]] = {}
        for address, server in self.server_table.items():
            for name, topic in server.topic_table.items():
                table.setdefault(name, {})[address] = topic
        self.topic_table = table
        return table

    # -- internals ---------------------------------------------------------------------

    def _merge(self, info: ServerInfo, change: RouteChange) -> None:
        address = info.server_address.address
        old = self.server_table.get(address)
        if old is not None and info.info_version <= old.info_version:
            return
        self.server_table[address] = info
        if old is not None:
            self._unindex(address, old)
            change.updated.append(address)
        else:
            change.joined.append(address)
        for name, topic in info.topic_table.items():
            self.topic_table.setdefault(name, {})[address] = topic

    def _unindex(self, address: str, info: ServerInfo) -> None:
        for name in info.topic_table:
            servers = self.topic_table.get(name)
            if servers is not None:
                servers.pop(address, None)
                if not servers:
                    del self.topic_table[name]

    def _drop(self, address: str, change: RouteChange) -> None:
        info = self.server_table.pop(address)
        self._unindex(address, info)
        if address in change.joined:
            change.joined.remove(address)
        else:
            change.left.append(address)
        if address in change.updated:
            change.updated.remove(address)

    def _purge(self, change: RouteChange) -> None:
        for address in [a for a in self.server_table if self.can_remove(a)]:
            self._drop(address, change)

    def _done(self, change: RouteChange) -> RouteChange:
        if change:
            self.version += 1
            if self.on_join is not None:
                for address in change.joined:
                    self.on_join(self.server_table[address])
            if self.on_leave is not None:
                for address in change.left:
                    self.on_leave(address)
        return change
