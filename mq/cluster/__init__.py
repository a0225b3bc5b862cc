"""Clusters (OpenAMQ's): servers that share a cluster file, elect a root and share
topics through it.

It owns the cluster file (``_file``), the root's rule (``_root``), the shared state of
topics and groups (``_state``), the messages between servers (``_links``), a server's
side of its cluster (``_node``: :class:`ClusterNode`), shared topics' messages relayed
through the root (``_relay``, ``_relay_groups``), what a former root stored sent to the
next (``_drain``) and shared topics declared through the root (``_shared``).  It
imports :mod:`mq.topics` and :mod:`mq.storage`; the MQ server it serves is a protocol
of what it uses.
"""


from ._file import ClusterConfig as ClusterConfig
from ._file import ClusterServer as ClusterServer
from ._file import load_cluster as load_cluster
from ._node import ClusterNode as ClusterNode
from ._shared import declare_on as declare_on
