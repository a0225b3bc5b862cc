"""zbus-style tracking on top of the framework: trackers, versioned route tables, server selection.

* :mod:`.info` -- ServerAddress, ServerInfo, TrackerInfo, TopicInfo, ConsumeGroupInfo
  (zbus's JSON shapes) and :class:`VersionCounter` (InfoVersions across restarts);
* :mod:`.routes` -- the client's route table, sans-I/O;
* :mod:`.feed` -- what trackers send subscribers (snapshots, deltas, pieces), sans-I/O;
* :mod:`.select` -- server selection algorithms;
* :mod:`.server` and :mod:`.tracker` -- the two roles of a broker, and :mod:`.node`,
  :class:`TrackNode`, which runs one or both on a rendezvous port;
* :mod:`.client` -- :class:`RouteClient`, which builds routes from trackers and servers,
  and the routing half of producers and consumers.
"""

from .._link import DEFAULT_RETRY
from .._liveness import DEFAULT_SCAN_INTERVAL
from .client import DEFAULT_TRACK_PORT, ConsumerRoute, ProducerRoute, RouteClient
from .info import (
    ConsumeGroupInfo,
    InfoError,
    ServerAddress,
    ServerInfo,
    TopicInfo,
    TrackerInfo,
    VersionCounter,
)
from .node import ROLES, TRACKER_ALIAS, TrackNode
from .routes import DEFAULT_VOTE_FACTOR, DeltaError, RouteChange, RouteTable, Vote
from .select import RoundRobin, Selector, all_servers, by_key_hash, by_key_modulo
from .server import DEFAULT_REPORT_INTERVAL, ServerRole
from .tracker import DEFAULT_SERVER_EXPIRY, TrackerRole

__all__ = [
    "DEFAULT_REPORT_INTERVAL", "DEFAULT_RETRY", "DEFAULT_SCAN_INTERVAL", "DEFAULT_SERVER_EXPIRY",
    "DEFAULT_TRACK_PORT", "DEFAULT_VOTE_FACTOR", "ROLES", "TRACKER_ALIAS", "ConsumeGroupInfo",
    "ConsumerRoute", "DeltaError", "InfoError", "ProducerRoute", "RoundRobin", "RouteChange",
    "RouteClient", "RouteTable", "Selector", "ServerAddress", "ServerInfo", "ServerRole",
    "TopicInfo", "TrackNode", "TrackerInfo", "TrackerRole", "VersionCounter", "Vote",
    "all_servers", "by_key_hash", "by_key_modulo",
]
