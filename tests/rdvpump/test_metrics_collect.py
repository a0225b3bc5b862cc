"""The metrics of tracking and of a cluster, read from a universe on the virtual clock
(the page's text as Prometheus reads it)."""

from __future__ import annotations

import pathlib

import trio
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from brokermgr import open_universe
from brokermgr.tracking import TrackNode
from rdvpump.metrics import Metrics
from tests.mq.test_cluster import until
from tests.mq.test_cluster_messages import SIX, Cluster
from tests.mq.test_replication import sync_master, two_replicas
from tests.mq.test_replication import until as until_copied


def samples(metrics: Metrics) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    registry = CollectorRegistry()
    registry.register(metrics)
    text = generate_latest(registry).decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


async def test_a_tracker_s_servers_and_versions(autojump_clock: object) -> None:
    async with open_universe("u") as universe:
        metrics = Metrics(universe)
        tracker = TrackNode(universe.add_broker("t1"), role="tracker")
        servers = [TrackNode(universe.add_broker(f"s{i}"), role="server",
                             trackers=["t1:15555"]) for i in (1, 2)]
        metrics.watch(tracker, *servers)
        assert tracker.tracker is not None
        for server, topics in zip(servers, (["orders", "audit"], ["orders"]), strict=True):
            assert server.server is not None
            for topic in topics:
                server.server.declare_topic(topic)
        await until(lambda: sum(len(e.value.topic_table)
                                for e in tracker.tracker.tracked.entries()) == 3)
        got = samples(metrics)
        # the topics in the tracker's table, each with the servers serving it
        assert {dict(ls)["topic"]: v for (name, ls), v in got.items()
                if name == "rdvpump_tracker_topic_servers"} == {"orders": 2, "audit": 1}
        # as the console reads them from the page
        from rdv import Address
        from rdvpump.console import UniverseConsole

        shown = UniverseConsole("u", Address("127.0.0.1", 1))._figures({"p": got}, 0.0)
        assert shown["topics"] == [
            {"tracker": "t1:15555", "topic": "audit", "servers": 1},
            {"tracker": "t1:15555", "topic": "orders", "servers": 2}]
        assert shown["trackers"] == [{"tracker": "t1:15555", "servers": 2,
                                      "version": int(float(tracker.tracker.version))}]
        where = frozenset({("tracker", "t1:15555")})
        assert got[("rdvpump_tracker_servers", where)] == 2
        # versions are floats on the page (exact below 2**53; wall-clock ones are near)
        assert got[("rdvpump_tracker_version", where)] == float(tracker.tracker.version)
        for server in servers:
            key = frozenset({*where, ("server", server.address.address)})
            entry = tracker.tracker.tracked.get(server.address.address)
            assert entry is not None
            assert got[("rdvpump_tracker_server_version", key)] == float(entry.version)
        # the links between them, both ends in this process
        sent = [ls for (name, ls) in got if name == "rdvpump_link_messages_sent_total"]
        assert {dict(ls)["broker"] for ls in sent} >= {"t1", "s1", "s2"}
        for node in (tracker, *servers):
            node.close()


async def test_every_cluster_server_says_its_root_and_epoch(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    async with open_universe("u") as universe:
        cluster = Cluster(universe, SIX, tmp_path)
        await until(lambda: cluster.roots() == {"a"})
        metrics = Metrics(universe)
        for server_id, node in cluster.nodes.items():
            metrics.watch_cluster(server_id, node)
        metrics.watch_mq(*cluster.servers.values())
        got = samples(metrics)
        epoch = cluster.nodes["a"].epoch
        for server in SIX.servers:
            labels = frozenset({("server", server.id), ("cluster", SIX.name),
                                ("type", server.type)})
            assert got[("rdvpump_cluster_epoch", labels)] == epoch
            assert got[("rdvpump_cluster_is_root", labels)] == (server.id == "a")
            assert got[("rdvpump_cluster_has_root", labels)] == 1
        cluster.crash("a")
        del metrics.clusters["a"]  # its process, and its page, are gone with it
        await until(lambda: cluster.roots() == {"b"})
        got = samples(metrics)
        roots = [dict(ls)["server"] for (name, ls), v in got.items()
                 if name == "rdvpump_cluster_is_root" and v == 1]
        assert roots == ["b"]
        await trio.sleep(0)
        cluster.close()


async def test_a_master_s_replicas_lag_and_sync(tmp_path: pathlib.Path,
                                                 autojump_clock: object) -> None:
    """Two replicas following a master's topic under ``sync``: once they hold what was
    acknowledged, each is in sync with no lag; one that goes is no longer listed."""
    async with sync_master(tmp_path) as (universe, server, client):
        logs, followers = await two_replicas(universe, tmp_path)
        metrics = Metrics(universe)
        metrics.watch_mq(server)
        await client.publish_many("orders", [b"o%d" % i for i in range(20)])
        for name in followers:
            await until_copied(followers[name], logs[name], 20)
        await trio.sleep(1)  # their acks reach the master
        def by_replica(name: str) -> dict[str, float]:
            # a replica is named by its link's caller id: its broker's, then "#" and a number
            return {dict(ls)["replica"].split("#")[0]: v
                    for (n, ls), v in samples(metrics).items() if n == name}

        assert by_replica("rdvpump_mq_replica_lag") == {"r1": 0, "r2": 0}
        assert by_replica("rdvpump_mq_replica_in_sync") == {"r1": 1, "r2": 1}
        followers["r2"].close()
        await client.publish_many("orders", [b"p%d" % i for i in range(10)])
        await until_copied(followers["r1"], logs["r1"], 30)
        await trio.sleep(1)
        # a replica whose link closed is no longer shipped to, and no longer shown
        assert by_replica("rdvpump_mq_replica_lag") == {"r1": 0}
        for follower in followers.values():
            follower.close()
