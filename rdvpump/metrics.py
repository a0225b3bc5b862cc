"""A process's metrics, served in Prometheus's text format (``--metrics HOST:PORT`` of
``rdvpump broker run`` and ``rdvpump manager serve``).

Everything is read when Prometheus scrapes, from what the process keeps anyway: each
link's queue statistics and the byte counters of its rings, the name service's table,
the trackers' tables, the MQ servers' topics and groups, the replicated groups' and the
clusters' places.  Two things are counted as they happen, both events of links and none
of messages: rendezvous refusals and link closes (the pump's ``tally``, told of the
events it would trace), and connections closed at their handshake (the network node's
``rejections``).  So a process with metrics on pays nothing on its messages' path.

The page is served by hypercorn on the process's own trio loop (the one that runs its
pump), so a scrape reads the state between two pump steps.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import trio
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

from brokermgr import BrokerManager, NameService
from brokermgr.tracking import TrackNode
from rdv import RdvNode

if TYPE_CHECKING:  # a broker process without an MQ server does not load mq
    from mq import ClusterNode, MqServer

__all__ = ["Metrics", "serve_metrics"]


class Metrics(Collector):
    """The metrics of the brokers of ``manager``'s process, and of what runs on them: the
    name services, tracking nodes and MQ servers added with :meth:`watch`, the cluster
    servers with :meth:`watch_cluster`."""

    def __init__(self, manager: BrokerManager) -> None:
        self.manager = manager
        self.names: list[NameService] = []
        self.nodes: list[TrackNode] = []
        self.mq_servers: list[MqServer] = []
        self.clusters: dict[str, ClusterNode] = {}  # by broker id
        #: rendezvous nodes that are not brokers of the manager (a name client's own)
        self.rdv_nodes: list[Any] = []
        #: (broker, reason) -> connects refused; (broker, cause) -> links closed
        self.refusals: collections.Counter[tuple[str, str]] = collections.Counter()
        self.closes: collections.Counter[tuple[str, str]] = collections.Counter()
        #: Where the page is served (``HOST:PORT``), once it is
        self.address: str | None = None
        manager.pump.tally = self._tally

    def watch(self, *what: NameService | RdvNode | TrackNode) -> None:
        """Also report these: name services, tracking nodes, and the links of rendezvous
        nodes that are no broker of the manager's (``rdv`` of a ``NameClient``)."""
        for item in what:
            if isinstance(item, NameService):
                self.names.append(item)
            elif isinstance(item, RdvNode):
                self.rdv_nodes.append(item)
            else:
                self.nodes.append(item)

    def watch_mq(self, *servers: MqServer) -> None:
        """Also report these MQ servers' topics, groups, counters and fsync times."""
        self.mq_servers += servers

    def watch_cluster(self, broker_id: str, node: ClusterNode) -> None:
        self.clusters[broker_id] = node

    def _tally(self, kind: str, fields: dict[str, Any]) -> None:
        if kind == "refuse":
            reason = str(fields.get("reason", "")).split(":", 1)[0]
            self.refusals[(str(fields.get("broker")), reason)] += 1
        elif kind == "close":
            self.closes[(str(fields.get("broker")), str(fields.get("cause")))] += 1

    def collect(self) -> Iterator[Metric]:
        yield from self._links()
        yield from self._names()
        yield from self._tracking()
        for server in self.mq_servers:
            yield from _mq(server)
        yield from self._cluster()

    # -- links -------------------------------------------------------------------------

    def _links(self) -> Iterator[Metric]:
        labels = ["broker", "peer", "port", "link"]
        families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {
            "sent": CounterMetricFamily(
                "rdvpump_link_messages_sent", "Messages this end of a link sent.", labels=labels),
            "received": CounterMetricFamily(
                "rdvpump_link_messages_received", "Messages this end of a link received.",
                labels=labels),
            "bytes_sent": CounterMetricFamily(
                "rdvpump_link_bytes_sent", "Bytes this end of a link sent (length prefixes "
                "included).", labels=labels),
            "bytes_received": CounterMetricFamily(
                "rdvpump_link_bytes_received", "Bytes this end of a link received (length "
                "prefixes included).", labels=labels),
            "queued": GaugeMetricFamily(
                "rdvpump_link_queued_bytes", "Bytes queued to send, not yet in the ring.",
                labels=labels),
            "high_water": GaugeMetricFamily(
                "rdvpump_link_high_water_bytes", "The queued bytes past which a send is "
                "refused (QueueFullError).", labels=labels),
        }
        nodes = [self.manager.broker(b).rdv for b in self.manager.broker_ids]
        for node in [*nodes, *self.rdv_nodes]:
            broker_id = node.id
            for queue in list(node.queues.values()):
                stats = queue.statistics()
                if stats.state == "closed":
                    continue
                # the link as traces name it, the accepting broker and its number: a
                # process numbers what it accepts, so a link it dialled may share one
                values = [broker_id, queue.remote_id, str(queue.port),
                          str(queue.trace_ids()[3])]
                families["sent"].add_metric(values, stats.messages_sent)
                families["received"].add_metric(values, stats.messages_received)
                families["bytes_sent"].add_metric(values, stats.bytes_sent)
                families["bytes_received"].add_metric(values, stats.bytes_received)
                families["queued"].add_metric(values, stats.bytes_queued)
                families["high_water"].add_metric(values, stats.high_water)
        yield from families.values()
        yield _counted("rdvpump_connects_refused", "Connects refused at the rendezvous, by "
                       "the broker that saw the refusal and its reason.", ["broker", "reason"],
                       self.refusals.items())
        yield _counted("rdvpump_link_closes", "Link ends closed, by broker and cause (clean, "
                       "aborted, lost, protocol_error).", ["broker", "cause"],
                       self.closes.items())
        yield _counted("rdvpump_handshakes_rejected", "Connections to this process closed at "
                       "their handshake, by kind.", ["kind"],
                       [((kind,), n) for kind, n in self.manager.net.rejections.items()])
        yield _counted("rdvpump_requests_denied", "Requests refused (403) because the "
                       "link's identity lacks the right, by identity and right.",
                       ["identity", "right"], self.manager.net.identities.denials.items())

    # -- the name service, tracking ------------------------------------------------------

    def _names(self) -> Iterator[Metric]:
        if not self.names:
            return
        registered = GaugeMetricFamily("rdvpump_names_registered_brokers",
                                       "Brokers registered with the name service.",
                                       labels=["universe"])
        age = GaugeMetricFamily("rdvpump_names_heartbeat_age_seconds",
                                "Seconds since a registered broker was last heard from.",
                                labels=["universe", "broker"])
        for service in self.names:
            now = service.pump.now()
            universe = service.manager.name
            entries = service.table.entries()
            registered.add_metric([universe], len(entries))
            for entry in entries:
                age.add_metric([universe, entry.key], max(0.0, now - entry.last_seen))
        yield registered
        yield age

    def _tracking(self) -> Iterator[Metric]:
        servers = GaugeMetricFamily("rdvpump_tracker_servers",
                                    "Servers a tracker's route table holds.",
                                    labels=["tracker"])
        version = GaugeMetricFamily("rdvpump_tracker_version",
                                    "The version of a tracker's route table.",
                                    labels=["tracker"])
        server_version = GaugeMetricFamily("rdvpump_tracker_server_version",
                                           "The version of each server a tracker holds.",
                                           labels=["tracker", "server"])
        topic_servers = GaugeMetricFamily("rdvpump_tracker_topic_servers",
                                          "Servers a tracker's table has serving a topic.",
                                          labels=["tracker", "topic"])
        for node in self.nodes:
            tracker = node.tracker
            if tracker is None:
                continue
            entries = tracker.tracked.entries()
            name = tracker.address.address
            servers.add_metric([name], len(entries))
            version.add_metric([name], tracker.version)
            serving: collections.Counter[str] = collections.Counter()
            for entry in entries:
                server_version.add_metric([name, entry.key], entry.version)
                serving.update(entry.value.topic_table.keys())
            for topic, count in sorted(serving.items()):
                topic_servers.add_metric([name, topic], count)
        yield from (servers, version, server_version, topic_servers)

    def _cluster(self) -> Iterator[Metric]:
        if not self.clusters:
            return
        labels = ["server", "cluster", "type"]
        epoch = GaugeMetricFamily("rdvpump_cluster_epoch", "A cluster server's epoch.",
                                  labels=labels)
        root = GaugeMetricFamily("rdvpump_cluster_is_root",
                                 "1 on the server that is its cluster's root.", labels=labels)
        ready = GaugeMetricFamily("rdvpump_cluster_has_root",
                                  "1 while the server follows a root.", labels=labels)
        state = GaugeMetricFamily("rdvpump_cluster_state_version",
                                  "The version of the cluster state this server holds.",
                                  labels=labels)
        for broker_id, node in sorted(self.clusters.items()):
            info = node.info()
            values = [broker_id, str(info["name"]), str(info["type"])]
            epoch.add_metric(values, info["epoch"])
            root.add_metric(values, 1 if info["root"] == broker_id else 0)
            ready.add_metric(values, 0 if info["root"] is None else 1)
            state.add_metric(values, info["version"])
        yield from (epoch, root, ready, state)


def _counted(name: str, documentation: str, labels: list[str],
             counts: Iterable[tuple[tuple[str, ...], int]]) -> CounterMetricFamily:
    """A counter family from (the labels' values, count) pairs."""
    family = CounterMetricFamily(name, documentation, labels=labels)
    for values, n in sorted(counts):
        family.add_metric(list(values), n)
    return family


def _mq(server: Any) -> Iterator[Metric]:
    """One MQ server's topics and groups, its replicas, its counters and its fsync times."""
    yield from _mq_topics(server)
    yield from _mq_replicas(server)
    yield from _mq_server(server)


def _mq_topics(server: Any) -> Iterator[Metric]:
    address = server.address
    topic_labels = ["server", "topic"]
    group_labels = ["server", "topic", "group"]
    next_offset = GaugeMetricFamily("rdvpump_mq_next_offset",
                                    "The offset the topic's next message takes.",
                                    labels=topic_labels)
    durable = GaugeMetricFamily("rdvpump_mq_durable_offset",
                                "Every message below this offset is on disk (fsynced).",
                                labels=topic_labels)
    depth = GaugeMetricFamily("rdvpump_mq_depth", "Messages the topic holds.",
                              labels=topic_labels)
    error = GaugeMetricFamily("rdvpump_mq_topic_error",
                              "1 while the topic is in its error state (refusing writes).",
                              labels=topic_labels)
    lag = GaugeMetricFamily("rdvpump_mq_group_lag",
                            "Messages the group has not acknowledged yet.", labels=group_labels)
    in_flight = GaugeMetricFamily("rdvpump_mq_group_in_flight",
                                  "Messages delivered to the group, not acknowledged yet.",
                                  labels=group_labels)
    redeliver = GaugeMetricFamily("rdvpump_mq_group_redelivery_waiting",
                                  "Messages waiting to be delivered again (their consumer "
                                  "went or their ack timed out).", labels=group_labels)
    consumers = GaugeMetricFamily("rdvpump_mq_group_consumers",
                                  "Consumers of the group on this server.", labels=group_labels)
    dead = CounterMetricFamily("rdvpump_mq_group_dead_letters",
                               "Messages the group gave up on after too many deliveries.",
                               labels=group_labels)
    for name in sorted(server.catalogue.topics):
        state = server.catalogue.topics[name]
        topic, log = state.topic, state.topic.log
        values = [address, name]
        next_offset.add_metric(values, log.next_offset)
        durable.add_metric(values, log.durable_offset)
        depth.add_metric(values, topic.depth)
        error.add_metric(values, 0 if state.error is None else 1)
        for group in topic.groups.values():
            g = [address, name, group.name]
            lag.add_metric(g, topic.lag(group.name))
            in_flight.add_metric(g, group.in_flight_count)
            redeliver.add_metric(g, len(group.redeliver))
            consumers.add_metric(g, len(group.consumers))
            dead.add_metric(g, group.dead_letters)
    yield from (next_offset, durable, depth, error, lag, in_flight, redeliver, consumers, dead)


def _mq_replicas(server: Any) -> Iterator[Metric]:
    """On a master, each replica of each topic: how far behind, and whether in sync."""
    address = server.address
    replica_lag = GaugeMetricFamily("rdvpump_mq_replica_lag",
                                    "Messages of a master's topic a replica has not "
                                    "acknowledged yet.", labels=["server", "topic", "replica"])
    replica_in_sync = GaugeMetricFamily("rdvpump_mq_replica_in_sync",
                                        "1 while the replica counts as in sync.",
                                        labels=["server", "topic", "replica"])
    for name in sorted(server.catalogue.topics):
        next_offset = server.catalogue.topics[name].topic.log.next_offset
        for replica, said in server.shipper.describe(name).items():
            replica_lag.add_metric([address, name, replica], max(0, next_offset - said["next"]))
            replica_in_sync.add_metric([address, name, replica], 1 if said["inSync"] else 0)
    yield from (replica_lag, replica_in_sync)


def _mq_server(server: Any) -> Iterator[Metric]:
    """The server's counters, its fsync times, its place in a replicated group."""
    address = server.address
    counts = CounterMetricFamily(
        "rdvpump_mq_messages", "An MQ server's messages by what happened to them: stored, "
        "duplicates (retries not stored again), returned, delivered, acked, dead.",
        labels=["server", "outcome"])
    for outcome in ("stored", "duplicates", "returned", "delivered", "acked", "dead"):
        counts.add_metric([address, outcome], server.counts.get(outcome, 0))
    yield counts
    from mq.topics._commit import FSYNC_BUCKETS

    commit = server.commit
    cumulative, buckets = 0, []
    for bound, n in zip([*map(str, FSYNC_BUCKETS), "+Inf"], commit.fsync_buckets, strict=True):
        cumulative += n
        buckets.append((bound, cumulative))
    fsync = HistogramMetricFamily("rdvpump_mq_fsync_seconds",
                                  "How long each group commit's fsyncs took.", labels=["server"])
    fsync.add_metric([address], buckets, commit.fsync_seconds)
    yield fsync
    member = server.group
    if member is not None:
        role = GaugeMetricFamily("rdvpump_mq_replication_epoch",
                                 "A replicated group member's epoch, labelled with its role.",
                                 labels=["server", "group", "role"])
        role.add_metric([address, member.group, member.role], member.epoch)
        yield role


async def serve_metrics(metrics: Metrics, host: str, port: int, *,
                        task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED
                        ) -> None:
    """Serve ``/metrics`` on ``host:port`` (0: a port the kernel picks) until cancelled;
    ``task_status.started(address)`` with the address it listens on."""
    from prometheus_client import make_asgi_app

    from ._asgi import serve_asgi

    registry = CollectorRegistry(auto_describe=True)
    registry.register(metrics)
    await serve_asgi(make_asgi_app(registry), host, port, task_status=task_status)
