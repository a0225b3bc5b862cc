"""A client's route table, sans-I/O: zbus's BrokerRouteTable with its version bug fixed.

Fed tracker tables (full snapshots and deltas from ``track_sub`` links),
static servers and tracker losses; never reads a clock, never touches a
link.  The table is a function of what the client currently holds, not of
the order things arrived in:

* Each tracker's *view*: the servers it lists, each with its ServerInfo, at
  the tracker's InfoVersion.  A snapshot replaces the view, a delta patches
  it; either is accepted only if its InfoVersion is higher than the last one
  accepted *from that tracker* (zbus remembered only the first version it
  saw, so a stale TrackerInfo could overwrite a newer one).
* A server is in the table if at least ``vote_factor`` of the trackers list
  it (with 2 trackers and the default 0.5, one vote keeps it), or it is a
  static server (:meth:`RouteTable.update_server`), and it has not been
  removed (:meth:`RouteTable.remove_server`).  Its ServerInfo is the one
  with the highest InfoVersion among the views and the static copy.
* With zero trackers nothing is purged: the table the last tracker left is
  kept, so a client that lost every tracker still routes to what it knew.
  Explicit here and tested; in zbus it is an accident of ``0 < 0 * factor``.
* ``remove_server(address)`` hides a server until ``update_server`` (a static
  add) or a tracker lists it *anew* -- a server that was not in that
  tracker's previous list, which includes the first list of a tracker this
  client (re)subscribes to.  A tracker that merely keeps listing it, or
  sends it a newer ServerInfo, does not bring it back.
* The topic table is derived from the server table.  Updates maintain it
  incrementally; :meth:`RouteTable.rebuild_topic_table` rebuilds it whole
  (the benchmark compares the two, the tests check they agree).

Because the table depends only on the views, a client fed deltas and a
client fed full snapshots of the same tracker states hold the same table
(a hypothesis test drives both).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from pump import ConfigError

from .info import InfoError, ServerInfo, TopicInfo, TrackerInfo

DEFAULT_VOTE_FACTOR = 0.5


class DeltaError(InfoError):
    """A delta from a tracker whose snapshot this table does not hold (ask for one)."""


@dataclass
class Vote:
    """One tracker's view: the servers it lists (address -> ServerInfo), at which InfoVersion."""

    servers: dict[str, ServerInfo]
    version: int


@dataclass
class RouteChange:
    """What one update did: servers that joined, left or got another ServerInfo."""

    joined: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    stale: bool = False

    def __bool__(self) -> bool:
        return bool(self.joined or self.left or self.updated)


class RouteTable:
    """Servers, topics and tracker views of one client.

    ``on_join(info)`` and ``on_leave(address)`` are called for every server
    that enters or leaves the table, after the table is consistent.
    """

    def __init__(self, *, vote_factor: float = DEFAULT_VOTE_FACTOR,
                 on_join: Callable[[ServerInfo], object] | None = None,
                 on_leave: Callable[[str], object] | None = None) -> None:
        if not 0 < vote_factor <= 1:
            raise ConfigError(f"vote_factor must be within (0, 1], got {vote_factor!r}")
        self.vote_factor = vote_factor
        self.on_join = on_join
        self.on_leave = on_leave
        #: address -> the ServerInfo routed by (the freshest the client holds)
        self.server_table: dict[str, ServerInfo] = {}
        #: topic -> address -> TopicInfo
        self.topic_table: dict[str, dict[str, TopicInfo]] = {}
        #: tracker address -> its view
        self.votes: dict[str, Vote] = {}
        #: static servers: address -> the ServerInfo the server itself sent
        self.static: dict[str, ServerInfo] = {}
        #: what the last tracker left behind (used only while there are no trackers)
        self.retained: dict[str, ServerInfo] = {}
        #: servers hidden by remove_server until added again
        self.removed: set[str] = set()
        #: Bumped on every change; selectors cache against it.
        self.version = 0

    # -- updates -----------------------------------------------------------------------

    def update_tracker(self, tracker: str, info: TrackerInfo) -> RouteChange:
        """Replace ``tracker``'s view with its snapshot; stale ones change nothing."""
        held = self.votes.get(tracker)
        if held is not None and info.info_version <= held.version:
            return RouteChange(stale=True)
        new = dict(info.server_table)
        if held is None:
            affected = self._arrive(tracker, new, info.info_version)
        else:
            old = held.servers
            self._unremove(new.keys() - old.keys())
            affected = old.keys() ^ new.keys()
            affected |= {a for a, s in new.items() if a in old and old[a] is not s}
            self.votes[tracker] = Vote(new, info.info_version)
        return self._recompute(affected)

    def apply_delta(self, tracker: str, version: int, servers: Mapping[str, ServerInfo],
                    left: Iterable[str]) -> RouteChange:
        """Patch ``tracker``'s view: ``servers`` joined or got a new ServerInfo, ``left``
        left.  :class:`DeltaError` if no snapshot of that tracker is held."""
        held = self.votes.get(tracker)
        if held is None:
            raise DeltaError(f"a delta from tracker {tracker} before its snapshot")
        if version <= held.version:
            return RouteChange(stale=True)
        view = held.servers
        held.version = version
        affected = set(servers)
        for address in left:
            if view.pop(address, None) is not None:
                affected.add(address)
        self._unremove(a for a in servers if a not in view)
        view.update(servers)
        return self._recompute(affected)

    def remove_tracker(self, tracker: str) -> RouteChange:
        """A tracker is gone (link lost, removed): its view goes, servers are counted again."""
        if self.votes.pop(tracker, None) is None:
            return RouteChange()
        if not self.votes:
            self.retained = dict(self.server_table)
        return self._recompute(self._everyone())

    def update_server(self, info: ServerInfo) -> RouteChange:
        """A static server's own ServerInfo: pinned (never purged), and added back if it
        was removed; an older one than held changes nothing."""
        address = info.server_address.address
        held = self.static.get(address)
        if held is not None and info.info_version <= held.info_version:
            return RouteChange(stale=True)
        self.static[address] = info
        self.removed.discard(address)
        return self._recompute((address,))

    def remove_server(self, address: str) -> RouteChange:
        """Drop a server now (static or not), until it is added again (see the module)."""
        self.static.pop(address, None)
        self.retained.pop(address, None)
        self.removed.add(address)
        return self._recompute((address,))

    # -- queries -----------------------------------------------------------------------

    def voters(self, address: str) -> int:
        return sum(1 for vote in self.votes.values() if address in vote.servers)

    def servers_of(self, topic: str) -> dict[str, TopicInfo]:
        return self.topic_table.get(topic, {})

    def writable_of(self, topic: str) -> dict[str, TopicInfo]:
        """The servers of ``topic`` that take writes: all but replicated groups' slaves,
        and masters that one at a newer epoch of their group has superseded (hung or
        cut off, still listed until their reports expire)."""
        table, newest = self.server_table, self._newest_masters()
        return {a: t for a, t in self.servers_of(topic).items()
                if a not in table or not (table[a].slave or _superseded(table[a], newest))}

    def readable(self) -> list[str]:
        """The servers to read from, sorted: a replicated group's master (the one at its
        newest epoch), or its slaves while no master of it is in the table; every server
        in no group."""
        newest = self._newest_masters()
        return sorted(a for a, info in self.server_table.items()
                      if info.group is None
                      or (info.slave and info.group.group not in newest)
                      or (not info.slave and not _superseded(info, newest)))

    def superseded(self, address: str) -> bool:
        """Whether the server at ``address`` is a group's master that one at a newer
        epoch of its group has superseded in the table."""
        info = self.server_table.get(address)
        return info is not None and _superseded(info, self._newest_masters())

    def _newest_masters(self) -> dict[str, int]:
        """Each replicated group's newest master epoch in the table."""
        newest: dict[str, int] = {}
        for info in self.server_table.values():
            if info.group is not None and not info.slave:
                group = info.group
                newest[group.group] = max(newest.get(group.group, 0), group.epoch)
        return newest

    def rebuild_topic_table(self) -> dict[str, dict[str, TopicInfo]]:
        """The topic table computed from scratch from the server table (and installed)."""
        table: dict[str, dict[str, TopicInfo]] = {}
        for address, server in self.server_table.items():
            for name, topic in server.topic_table.items():
                table.setdefault(name, {})[address] = topic
        self.topic_table = table
        return table

    # -- internals ---------------------------------------------------------------------

    def _arrive(self, tracker: str, view: dict[str, ServerInfo], version: int) -> set[str]:
        """A tracker's first view: every server in it is listed anew; the count of
        trackers changed, so every server is counted again."""
        if not self.votes:
            self.retained = {}
        self._unremove(view)
        self.votes[tracker] = Vote(view, version)
        return self._everyone()

    def _unremove(self, addresses: Iterable[str]) -> None:
        if self.removed:
            self.removed.difference_update(addresses)

    def _everyone(self) -> set[str]:
        everyone = set(self.server_table) | set(self.static) | set(self.retained)
        for vote in self.votes.values():
            everyone.update(vote.servers)
        return everyone

    def _effective(self, address: str) -> ServerInfo | None:
        """What the table holds for ``address``: a function of the views, the static
        copy and (with no trackers) what the last tracker left."""
        if address in self.removed:
            return None
        best = self.static.get(address)
        if self.votes:
            count = 0
            for vote in self.votes.values():
                info = vote.servers.get(address)
                if info is not None:
                    count += 1
                    if best is None or info.info_version > best.info_version:
                        best = info
            if address not in self.static and count < len(self.votes) * self.vote_factor:
                return None
        else:
            kept = self.retained.get(address)
            if kept is not None and (best is None or kept.info_version > best.info_version):
                best = kept
        return best

    def _recompute(self, addresses: Iterable[str]) -> RouteChange:
        change = RouteChange()
        for address in sorted(addresses):
            info = self._effective(address)
            old = self.server_table.get(address)
            if info is None:
                if old is not None:
                    del self.server_table[address]
                    self._unindex(address, old.topic_table)
                    change.left.append(address)
                if address in self.removed and not self._listed(address):
                    self.removed.discard(address)  # nobody lists it: a later listing is new
                continue
            if old is not None and (info is old or info.info_version == old.info_version):
                continue
            self.server_table[address] = info
            if old is None:
                change.joined.append(address)
                held: dict[str, TopicInfo] = {}
            else:
                change.updated.append(address)
                held = old.topic_table
                gone = [name for name in held if name not in info.topic_table]
                if gone:
                    self._unindex(address, gone)
            # only the topics that changed (a server's new info keeps the others' objects)
            for name, topic in info.topic_table.items():
                if held.get(name) is not topic:
                    self.topic_table.setdefault(name, {})[address] = topic
        return self._done(change)

    def _listed(self, address: str) -> bool:
        if address in self.static or (not self.votes and address in self.retained):
            return True
        return any(address in v.servers for v in self.votes.values())

    def _unindex(self, address: str, names: Iterable[str]) -> None:
        for name in names:
            servers = self.topic_table.get(name)
            if servers is not None:
                servers.pop(address, None)
                if not servers:
                    del self.topic_table[name]

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


def _superseded(info: ServerInfo, newest: dict[str, int]) -> bool:
    """A group's master listed beside one at a newer epoch of its group."""
    return (info.group is not None and not info.slave
            and info.group.epoch < newest.get(info.group.group, 0))
