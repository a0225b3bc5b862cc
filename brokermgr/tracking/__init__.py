"""zbus-style tracking on top of the framework: trackers, versioned route tables, server selection.

* :mod:`.info` -- ServerAddress, ServerInfo, TrackerInfo, TopicInfo, ConsumeGroupInfo
  (zbus's JSON shapes) and :class:`VersionCounter` (InfoVersions across restarts);
* :mod:`.routes` -- the client's route table, sans-I/O;
* :mod:`.select` -- server selection algorithms;
* :mod:`.node` -- the server and tracker roles of a broker (:class:`TrackNode`)
  and the client (:class:`RouteClient`), over the framework's message queues.
"""

from .._liveness import DEFAULT_SCAN_INTERVAL
from .info import (
    ConsumeGroupInfo,
    InfoError,
    ServerAddress,
    ServerInfo,
    TopicInfo,
    TrackerInfo,
    VersionCounter,
)
from .node import (
    DEFAULT_REPORT_INTERVAL,
    DEFAULT_RETRY,
    DEFAULT_SERVER_EXPIRY,
    DEFAULT_TRACK_PORT,
    TRACKER_ALIAS,
    Consumer,
    Producer,
    RouteClient,
    TrackedServers,
    TrackNode,
)
from .routes import DEFAULT_VOTE_FACTOR, RouteChange, RouteTable, Vote
from .select import RoundRobin, Selector, all_servers, by_key_hash

__all__ = [
    "DEFAULT_REPORT_INTERVAL", "DEFAULT_RETRY", "DEFAULT_SCAN_INTERVAL", "DEFAULT_SERVER_EXPIRY",
    "DEFAULT_TRACK_PORT", "DEFAULT_VOTE_FACTOR", "TRACKER_ALIAS", "ConsumeGroupInfo", "Consumer",
    "InfoError",
    "Producer", "RoundRobin", "RouteChange", "RouteClient", "RouteTable", "Selector",
    "ServerAddress", "ServerInfo", "TopicInfo", "TrackNode", "TrackedServers", "TrackerInfo",
    "VersionCounter", "Vote", "all_servers", "by_key_hash",
]
