"""MQ servers on rdvpump's links (issue 11), being built from the disk up.

Built so far, each sans-network:

* :class:`TopicLog` -- a topic's durable log: append-only segments with
  checksummed records, sparse indexes, group commit (:meth:`TopicLog.sync`),
  recovery after a crash, retention by size and age (format: docs/mq-format.md);
* :class:`CursorStore` -- consume groups' positions, one file each, replaced
  atomically;
* :class:`TagFilter` -- zbus's tag-filter grammar.

Not built yet: the server role, the commands over links, delivery with
credits and acks, RPC and push, the client API and the CLI.
"""

from ._cursor import CursorStore
from ._filter import MAX_FILTER_BYTES, FilterError, TagFilter, matches
from ._log import DEFAULT_SEGMENT_BYTES, INDEX_INTERVAL, Corruption, TopicLog
from ._record import FORMAT_VERSION, FormatError, Record, StoreError

__all__ = [
    "DEFAULT_SEGMENT_BYTES", "FORMAT_VERSION", "INDEX_INTERVAL", "MAX_FILTER_BYTES",
    "Corruption", "CursorStore", "FilterError", "FormatError", "Record", "StoreError",
    "TagFilter", "TopicLog", "matches",
]
