"""MQ servers on rdvpump's links, built from the disk up.

The storage and the semantics, sans-network:

* :class:`TopicLog` -- a topic's durable log: append-only segments with
  checksummed records, sparse indexes, group commit (:meth:`TopicLog.sync`),
  recovery after a crash, retention by size and age (format: docs/mq-format.md);
* :class:`CursorStore` -- consume groups' positions, one file each, saved in place
  into the slot that does not hold the newest;
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

from ._history import (
    History,
    HistoryError,
    HistoryFinding,
    HistoryReport,
    check_history,
)
from .client import (
    SLAVES_AFTER,
    Caller,
    Consumer,
    MessageBatch,
    MqClient,
    Producer,
    Pushed,
    Receiver,
    RpcTimeout,
    Service,
    Stored,
    Subscription,
)
from .client import Message as Message
from .cluster import ClusterConfig, ClusterNode, ClusterServer, declare_on, load_cluster
from .replication import DEFAULT_INSYNC_LAG, keep_role
from .server import FLAGS, MqServer
from .storage import (
    DEFAULT_SEGMENT_BYTES,
    FORMAT_VERSION,
    INDEX_INTERVAL,
    MAX_NAME_BYTES,
    Corruption,
    CursorStore,
    FormatError,
    MemoryLog,
    Record,
    StoreError,
    TopicLog,
    check_name,
    disk_name,
)
from .topics import (
    DEFAULT_ACK_TIMEOUT,
    DEFAULT_MAX_DELIVERIES,
    DEFAULT_WINDOW,
    MAX_FILTER_BYTES,
    Delivery,
    Durability,
    FilterError,
    Finding,
    Report,
    Start,
    TagFilter,
    Topic,
    UnknownGroupError,
    matches,
    verify,
)

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
    "keep_role", "SLAVES_AFTER",
]
