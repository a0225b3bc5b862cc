"""MQ servers on rdvpump's links, built from the disk up.

The storage and the semantics, sans-network:

* :class:`TopicLog` -- a topic's durable log: append-only segments with
  checksummed records, sparse indexes, group commit (:meth:`TopicLog.sync`),
  recovery after a crash, retention by size and age (format: docs/mq-format.md);
* :class:`CursorStore` -- consume groups' positions, one file each, replaced
  atomically;
* :class:`TagFilter` -- zbus's tag-filter grammar;
* :class:`Topic` -- consume groups over a log: start positions, filters,
  credits, acks, redelivery on consumer loss and ack timeout, dead letters
  (sans-I/O); :class:`MemoryLog` -- a memory-only topic's bounded ring.

Over links:

* :class:`MqServer` -- the server role on a broker's tracking port, and
  :class:`MqClient` its async client (requests refused, or not answered, raise the
  service protocol's :class:`ServiceError`); :class:`Caller` and :class:`Service`,
  RPC over ``rpc`` topics; push to named receivers; :class:`Producer` and
  :class:`Consumer`, which follow tracking's route tables.
* :class:`ClusterNode` -- a server's links to the other servers of its cluster (a
  cluster file, :func:`load_cluster`: every server linked to every other, a server of
  another configuration refused on both sides).

Checking what clients saw:

* :class:`History` and :func:`check_history` -- publish, consume and ack operations
  checked against at-least-once delivery: acknowledged messages lost, more copies of a
  message than publishes of it, delivered again after a confirmed ack, out of order
  within a partition, two histories at one offset, two masters in one epoch
  (``rdvpump mq check-history FILE`` for a JSON Lines history).
"""

from brokermgr import ServiceError, Status

from ._client import MqClient, Stored
from ._cluster import ClusterNode
from ._cluster_file import ClusterConfig, ClusterServer, load_cluster
from ._commit import Durability
from ._cursor import CursorStore
from ._filter import MAX_FILTER_BYTES, FilterError, TagFilter, matches
from ._history import (
    History,
    HistoryError,
    HistoryFinding,
    HistoryReport,
    check_history,
)
from ._log import DEFAULT_SEGMENT_BYTES, TopicLog
from ._member import keep_role
from ._memory import MemoryLog
from ._names import MAX_NAME_BYTES, check_name, disk_name
from ._record import FORMAT_VERSION, FormatError, Record, StoreError
from ._replication import DEFAULT_INSYNC_LAG
from ._routed import Consumer, Producer
from ._rpc import Caller, RpcTimeout, Service
from ._scan import INDEX_INTERVAL, Corruption
from ._server import FLAGS, MqServer
from ._shared import declare_on
from ._subscription import Message as Message
from ._subscription import MessageBatch, Pushed, Receiver, Subscription
from ._topic import (
    DEFAULT_ACK_TIMEOUT,
    DEFAULT_MAX_DELIVERIES,
    DEFAULT_WINDOW,
    Delivery,
    Start,
    Topic,
    UnknownGroupError,
)
from ._verify import Finding, Report, verify

__all__ = [
    "DEFAULT_ACK_TIMEOUT", "DEFAULT_INSYNC_LAG", "DEFAULT_MAX_DELIVERIES",
    "DEFAULT_SEGMENT_BYTES", "DEFAULT_WINDOW",
    "FORMAT_VERSION", "INDEX_INTERVAL", "MAX_FILTER_BYTES", "Consumer", "Corruption",
    "CursorStore", "Delivery", "FilterError", "FormatError", "MemoryLog", "Record", "Start",
    "StoreError", "TagFilter", "Topic", "TopicLog", "UnknownGroupError", "matches",
    "FLAGS", "Durability", "Message", "MessageBatch", "MqClient", "MqServer", "Stored",
    "Subscription", "Caller", "Service", "RpcTimeout", "Pushed", "Receiver", "Producer",
    "MAX_NAME_BYTES", "check_name", "disk_name", "ServiceError", "Status", "Finding", "Report",
    "verify", "History", "HistoryError", "HistoryFinding", "HistoryReport", "check_history",
    "ClusterConfig", "ClusterNode", "ClusterServer", "declare_on", "load_cluster",
    "keep_role",
]
