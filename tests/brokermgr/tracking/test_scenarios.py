"""Trackers, servers and clients on one pump, on its virtual clock: deterministic, no sleeps.

Intervals are short (report 5 s, expiry 12 s, scan 2 s, retry 3 s) and time
only moves when the test runs the pump.
"""

from __future__ import annotations

import json
import pathlib
from dataclasses import replace
from typing import Any

import pytest

from brokermgr import BrokerManager
from brokermgr._rpc import encode
from brokermgr.tracking import (
    ConsumerRoute,
    ProducerRoute,
    ServerAddress,
    ServerInfo,
    TopicInfo,
    TrackNode,
    by_key_hash,
    feed,
)
from pump import ConfigError

from .world import TIMING, World, flood_a_slow_subscriber, server_of, servers, tracker_of


def test_subscribe_get_routes_at_once_then_on_each_change(world: World) -> None:
    world.node("t1", role="tracker")
    s1 = world.node("s1", role="server", trackers=("t1",))
    client = world.client("c", "t1")
    world.run(0.1)
    assert servers(client) == ["s1"]
    before = client.routes.server_table["s1:15555"].info_version
    s1.declare_topic("orders")
    s1.declare_group("orders", "billing", filter="eu.*")
    s1.update_group("orders", "billing", consumers=["c1", "c2"], message_count=4)
    world.run(0.1)
    info = client.routes.server_table["s1:15555"]
    assert info.info_version > before
    topic = client.routes.servers_of("orders")["s1:15555"]
    assert topic.consumer_count == 2 and topic.message_depth == 4
    assert [g.group_name for g in topic.consume_group_list] == ["orders", "billing"]
    s1.remove_group("orders", "billing")
    s1.remove_topic("orders")
    world.run(0.1)
    assert client.routes.servers_of("orders") == {}
    assert client.routes.server_table["s1:15555"].info_version > info.info_version


def test_two_trackers_that_disagree(world: World) -> None:
    for t in ("t1", "t2", "t3"):
        world.node(t, role="tracker")
    world.node("s1", role="server", trackers=("t1", "t2", "t3"))
    world.node("s2", role="server", trackers=("t1",))
    world.node("s3", role="server", trackers=("t2",))
    two = world.client("two", "t1", "t2")
    three = world.client("three", "t1", "t2", "t3")
    world.run(1)
    # one vote of two is enough (>= 0.5); one of three is not
    assert servers(two) == ["s1", "s2", "s3"]
    assert servers(three) == ["s1"]
    assert two.routes.voters("s2:15555") == 1 and three.routes.voters("s1:15555") == 3


def test_a_stale_server_info_arriving_late_loses_to_the_newer_one(
        world: World, tmp_path: pathlib.Path) -> None:
    world.node("t1", role="tracker")
    world.node("t2", role="tracker")
    s1_broker = world.universe.add_broker("s1")

    class Late:  # an earlier incarnation's report reaching t2 late
        def connected(self, queue: Any) -> None:
            old = ServerInfo(ServerAddress("s1:15555"), 1, topic_table={
                "old": TopicInfo(ServerAddress("s1:15555"), "old")})
            queue.send(encode({"cmd": "track_pub", "serverInfo": old.to_json()}))

        def refused(self, reason: str) -> None:
            raise AssertionError(reason)

    s1_broker.connect("t2", 15555, Late())
    world.run(0.1)
    s1 = TrackNode(s1_broker, role="server", trackers=["t1:15555"], state_dir=tmp_path,
                   **TIMING)
    s1.declare_topic("new")
    world.run(0.1)
    assert tracker_of(world.nodes["t2"]).tracked.values()["s1:15555"].info_version == 1
    for order in (("t2", "t1"), ("t1", "t2")):
        client = world.client(f"c-{'-'.join(order)}", order[0])
        world.run(0.1)
        client.add_tracker(f"{order[1]}:15555")
        world.run(0.1)
        assert list(client.routes.topic_table) == ["new"], order
        assert client.routes.server_table["s1:15555"].info_version > 1


def test_info_versions_keep_increasing_across_a_server_restart(
        world: World, tmp_path: pathlib.Path) -> None:
    world.node("t1", role="tracker")
    world.node("t2", role="tracker")
    s1 = world.node("s1", role="server", trackers=("t1", "t2"), state_dir=tmp_path)
    s1.declare_topic("before")
    client = world.client("c", "t1", "t2")
    world.run(1)
    old_version = client.routes.server_table["s1:15555"].info_version
    # restart: same id, same state directory, a fresh process's counters
    s1.broker.close("restart")
    world.run(0.1)
    again = world.node("s1", role="server", trackers=("t1", "t2"), state_dir=tmp_path)
    again.declare_topic("after")
    world.run(1)
    assert client.routes.server_table["s1:15555"].info_version > old_version
    assert list(client.routes.topic_table) == ["after"]


def test_a_tracker_lost_and_back(world: World) -> None:
    world.node("t1", role="tracker")
    t2 = world.node("t2", role="tracker")
    world.node("s1", role="server", trackers=("t1", "t2"))
    world.node("s2", role="server", trackers=("t2",))
    client = world.client("c", "t1", "t2")
    world.run(1)
    assert servers(client) == ["s1", "s2"]
    t2.broker.close("tracker went away")
    world.run(0.5)
    # t2's votes are gone: s2 has 0 of 1; s1 still has t1's
    assert servers(client) == ["s1"] and list(client.routes.votes) == ["t1:15555"]
    world.node("t2", role="tracker")
    world.run(TIMING["retry"] + 1)  # the client and s2 dial t2 again
    assert servers(client) == ["s1", "s2"]
    assert client.trackers["t2:15555"].connects == 2


def test_losing_every_tracker_keeps_the_last_known_servers(world: World) -> None:
    t1 = world.node("t1", role="tracker")
    world.node("s1", role="server", trackers=("t1",)).declare_topic("x")
    client = world.client("c", "t1")
    world.run(1)
    t1.broker.close("gone")
    world.run(30)
    assert servers(client) == ["s1"] and not client.routes.votes
    assert ProducerRoute(client, "x").servers() == ["s1:15555"]


def test_a_server_crash_leaves_every_client_at_once(world: World) -> None:
    world.node("t1", role="tracker")
    world.node("t2", role="tracker")
    s1 = world.node("s1", role="server", trackers=("t1", "t2"))
    world.node("s2", role="server", trackers=("t1", "t2"))
    clients = [world.client(f"c{i}", "t1", "t2") for i in range(3)]
    world.run(1)

    def crash() -> None:
        raise RuntimeError("segfault, say")

    crashed_at = world.pump.now()
    world.pump.post("work", crash, owner=s1.broker)  # the pump fails the broker
    world.run(1)
    assert s1.broker.closed
    for c in clients:
        assert servers(c) == ["s2"]
    leaves = [t for t, what, a in world.log if what.endswith("leave") and a == "s1:15555"]
    assert len(leaves) == 3 and max(leaves) - crashed_at < 0.01  # the link drop, not expiry


def test_a_server_hung_but_connected_expires(world: World) -> None:
    t1 = world.node("t1", role="tracker")
    s1 = world.node("s1", role="server", trackers=("t1",))
    client = world.client("c", "t1")
    world.run(1)
    server_of(s1).pause_reports()  # hung: the link stays open, no report comes
    entry = tracker_of(t1).tracked.get("s1:15555")
    assert entry is not None
    last = entry.last_seen
    world.run(TIMING["expiry"] - 1)
    assert servers(client) == ["s1"]  # not before the expiry
    world.run(TIMING["scan_interval"] + 2)
    assert servers(client) == []
    (when,) = [t for t, what, a in world.log if what == "c leave"]
    assert TIMING["expiry"] < when - last <= TIMING["expiry"] + TIMING["scan_interval"]
    assert server_of(s1).publishers[0].queue is not None  # still connected: expiry did it


def test_a_reporting_server_never_expires(world: World) -> None:
    world.node("t1", role="tracker")
    world.node("s1", role="server", trackers=("t1",))
    client = world.client("c", "t1")
    world.run(10 * TIMING["expiry"])
    assert servers(client) == ["s1"] and not [e for e in world.log if "leave" in e[1]]


def test_two_instances_tracking_each_other_do_not_loop(world: World) -> None:
    a = world.node("a", trackers=("b",))
    b = world.node("b", trackers=("a",))
    client = world.client("c", "a", "b")
    world.run(1)
    before = {n: dict(node.sent) for n, node in (("a", a), ("b", b))}
    a.declare_topic("x")
    world.run(1)  # well within the report interval

    def sent(node: TrackNode, name: str, cmd: str) -> int:
        return node.sent.get(cmd, 0) - before[name].get(cmd, 0)

    # a published its change once to b (plus one delta to the client, as a tracker);
    # b's table changed, so b told its subscriber, and sent nothing back to a
    assert (sent(a, "a", "track_pub"), sent(a, "a", "track_delta")) == (1, 1)
    assert (sent(b, "b", "track_pub"), sent(b, "b", "track_delta")) == (0, 1)
    world.run(100)
    # only the periodic reports: about one per 5 s each way, nothing growing on its own
    assert a.received["track_pub"] <= 100 / TIMING["report_interval"] + 3
    # servers never subscribe; b's entry in a came from b itself, never cascaded
    assert "track_sub" not in a.received or a.received["track_sub"] == 1  # the client only
    assert b.received.get("track_sub", 0) == 1
    assert [q.remote_id for q in tracker_of(a).subscribers] == ["c"]
    assert sorted(tracker_of(a).tracked.values()) == ["a:15555", "b:15555"]
    assert servers(client) == ["a", "b"]
    assert list(client.routes.topic_table) == ["x"]


def _tell_once(world: World, obj: dict[str, Any]) -> list[str]:
    """A broker "liar" (a token holder, no server) sends ``obj`` to tracker t1 on a link
    of its own: why that link closed, once the world ran a second."""
    reasons: list[str] = []

    class Liar:
        def connected(self, queue: Any) -> None:
            queue.set_listener(self)
            queue.send(encode(obj))

        def refused(self, reason: str) -> None:
            raise AssertionError(reason)

        def received(self, message: bytes) -> None: ...

        def closed(self, reason: str) -> None:
            reasons.append(reason)

    world.universe.add_broker("liar").connect("t1", 15555, Liar())
    world.run(1)
    return reasons


def test_a_server_may_publish_only_its_own_server_info(world: World) -> None:
    t1 = world.node("t1", role="tracker")
    world.node("s1", role="server", trackers=("t1",))
    client = world.client("c", "t1")
    forged = ServerInfo(ServerAddress("s9:15555"), 99)
    reasons = _tell_once(world, {"cmd": "track_pub", "serverInfo": forged.to_json()})
    assert reasons and "published the ServerInfo of 's9:15555'" in reasons[0]
    assert sorted(tracker_of(t1).tracked.values()) == ["s1:15555"]
    assert servers(client) == ["s1"]


def test_a_forged_patch_of_another_server_closes_the_liar_s_link_and_changes_nothing(
        world: World) -> None:
    t1 = world.node("t1", role="tracker")
    s1 = world.node("s1", role="server", trackers=("t1",))
    s1.declare_topic("x")
    client = world.client("c", "t1")
    world.run(0.5)
    held = tracker_of(t1).tracked.values()["s1:15555"]
    forged = replace(held, info_version=held.info_version + 1, topic_table={
        "stolen": TopicInfo(ServerAddress("s1:15555"), "stolen")})
    patch = json.loads(feed.patch_value(held, forged))  # a base the tracker holds
    reasons = _tell_once(world, {"cmd": "track_pub", "live": True, "patch": patch})
    assert reasons and "published the ServerInfo of 's1:15555'" in reasons[0]
    assert tracker_of(t1).tracked.values()["s1:15555"] is held  # as s1 said it
    assert list(client.routes.topic_table) == ["x"]


def test_bad_messages_close_only_their_own_link(world: World) -> None:
    t1 = world.node("t1", role="tracker")
    s1 = world.node("s1", role="server", trackers=("t1",))
    client = world.client("c", "t1")
    world.run(0.5)
    outcomes: dict[str, list[Any]] = {}

    class Raw:
        def __init__(self, name: str, payload: bytes) -> None:
            self.name, self.payload = name, payload
            outcomes[name] = []

        def connected(self, queue: Any) -> None:
            queue.set_listener(self)
            queue.send(self.payload)

        def refused(self, reason: str) -> None:
            raise AssertionError(reason)

        def received(self, message: bytes) -> None:
            outcomes[self.name].append(message)

        def closed(self, reason: str) -> None:
            outcomes[self.name].append(reason)

    bad = world.universe.add_broker("bad")
    bad.connect("t1", 15555, Raw("garbage", b"\xff{not json"))
    bad.connect("t1", 15555, Raw("unknown", b'{"cmd":"teleport"}'))
    bad.connect("t1", 15555, Raw("shape", b'{"cmd":"track_pub","serverInfo":{"x":1}}'))
    bad.connect("s1", 15555, Raw("wrong-role", b'{"cmd":"track_sub"}'))
    world.run(0.5)
    assert "protocol error: bad tracking message" in outcomes["garbage"][0]
    assert b'"status":400' in outcomes["unknown"][0] and b"teleport" in outcomes["unknown"][0]
    assert len(outcomes["unknown"]) == 1  # the link stays open
    assert b"missing field" in outcomes["shape"][0]
    assert b"is not a tracker" in outcomes["wrong-role"][0]
    s1.declare_topic("still-works")
    world.run(0.5)
    assert list(client.routes.topic_table) == ["still-works"]
    assert [q.remote_id for q in tracker_of(t1).subscribers] == ["c"]


def test_static_servers_queries_and_selection(world: World) -> None:
    t1 = world.node("t1", role="tracker")
    s1 = world.node("s1", role="server")
    s2 = world.node("s2", role="server", trackers=("t1",))
    for s in (s1, s2):
        s.declare_topic("orders")
    s2.update_group("orders", "orders", consumers=["x"])
    client = world.client("c", "t1")
    client.add_server("s1:15555")
    world.run(0.5)
    assert servers(client) == ["s1", "s2"] and set(client.routes.static) == {"s1:15555"}
    producer = ProducerRoute(client, "orders")
    assert {producer.servers()[0] for _ in range(3)} == {"s2:15555"}  # only s2 has consumers
    assert ConsumerRoute(client, "orders").servers() == ["s1:15555", "s2:15555"]
    keyed = ProducerRoute(client, "orders", by_key_hash)
    assert keyed.servers("k") == keyed.servers("k") != []
    # a one-shot `tracker` query
    answers: list[bytes] = []

    class Query:
        def connected(self, queue: Any) -> None:
            queue.set_listener(self)
            queue.send(b'{"cmd":"tracker"}')

        def refused(self, reason: str) -> None:
            raise AssertionError(reason)

        def received(self, message: bytes) -> None:
            answers.append(message)

        def closed(self, reason: str) -> None: ...

    client.broker.connect("t1", 15555, Query())
    world.run(0.5)
    assert b'"cmd":"tracker"' in answers[0] and b"s2:15555" in answers[0]
    # the trackers lose s2; the static s1 stays
    t1.broker.close("gone")
    s2.broker.close("gone")
    world.run(1)
    assert servers(client) == ["s1", "s2"]  # zero trackers: last known kept
    client.remove_server("s1:15555")
    assert servers(client) == ["s2"]
    del t1


def test_clean_shutdown_tells_the_tracker_at_once(world: World) -> None:
    world.node("t1", role="tracker")
    s1 = world.node("s1", role="server", trackers=("t1",))
    client = world.client("c", "t1")
    world.run(1)
    s1.close()
    world.run(0.1)
    assert servers(client) == []
    assert not s1.broker.closed  # only the tracking roles stopped


def test_roles_are_checked(world: World) -> None:
    tracker = world.node("t1", role="tracker")
    with pytest.raises(ConfigError, match="tracker only"):
        tracker.declare_topic("x")
    with pytest.raises(ValueError, match="role must be one of"):
        world.node("x", role="king")
    server = world.node("s1", role="server")
    with pytest.raises(KeyError, match="no topic"):
        server.remove_topic("nope")
    with pytest.raises(ValueError, match="127 bytes"):
        server.declare_topic("t")
        server.declare_group("t", "g", filter="x" * 128)


def test_a_slow_subscriber_gets_the_latest_snapshot_and_memory_stays_bounded() -> None:
    world, t1, slow = flood_a_slow_subscriber(b'{"cmd":"track_sub"}')  # zbus's feed
    got = slow.got
    (session,) = tracker_of(t1).subscribers.values()
    stats = session.queue.statistics()
    assert stats.bytes_queued <= 4096 + len(tracker_of(t1).snapshot()) and session.behind
    slow.queue.resume_reading()
    world.run(1)
    last = json.loads(got[-1])["trackerInfo"]
    assert last["infoVersion"] == tracker_of(t1).version
    assert len(last["serverTable"]["s1:15555"]["topicTable"]) == 200
    assert len(got) < 200  # coalesced, not one per change


def test_a_server_info_larger_than_a_link_s_message_reaches_clients_in_parts() -> None:
    world = World()
    world.universe = BrokerManager("tracking", max_message_size=2048, high_water=2048)
    world.pump = world.universe.pump
    t1 = world.node("t1", role="both")  # its own topics enter its table without a link
    client = world.client("c", "t1")
    world.run(0.1)
    names = [f"topic-{i:02d}" for i in range(40)]  # about 6 KB of topics: 2 KB messages
    for name in names:
        t1.declare_topic(name)
    world.run(0.1)
    assert sorted(client.routes.topic_table) == names
    assert "t1:15555" in client.trackers and tracker_of(t1).subscribers
    t1.remove_topic("topic-07")  # a delta of a split ServerInfo: parts again
    world.run(0.1)
    assert sorted(client.routes.topic_table) == [n for n in names if n != "topic-07"]


def test_a_topic_too_big_for_a_link_closes_that_link_only() -> None:
    world = World()
    world.universe = BrokerManager("tracking", max_message_size=2048, high_water=2048)
    world.pump = world.universe.pump
    t1 = world.node("t1", role="both")
    client = world.client("c", "t1")
    other = world.client("other", "t1")
    world.run(0.1)
    assert servers(client) == ["t1"]
    closed: list[str] = []
    client.trackers["t1:15555"].lost = closed.append  # type: ignore[method-assign,assignment]
    t1.declare_topic("t" * 1200)  # one topic with its ServerInfo: over a 2 KB message
    world.run(0.1)
    assert closed and "exceeds the maximum message size" in closed[0]
    assert not t1.broker.closed and not tracker_of(t1).subscribers  # the tracker goes on
    assert not other.broker.closed and "t1:15555" in other.trackers  # it will dial again


def test_a_server_s_group_and_a_promotion_reach_clients_through_the_tracker(
        world: World) -> None:
    from brokermgr import GroupMember

    world.node("t1", role="tracker")
    a0 = world.node("a0", role="server", trackers=("t1",),
                    group=GroupMember("a", 0, "master", epoch=1))
    a1 = world.node("a1", role="server", trackers=("t1",),
                    group=GroupMember("a", 1, "slave", epoch=1))
    for node in (a0, a1):
        node.declare_topic("orders")
    client = world.client("c", "t1")
    world.run(0.1)
    assert sorted(client.routes.writable_of("orders")) == ["a0:15555"]
    assert client.routes.server_table["a1:15555"].group == GroupMember("a", 1, "slave", 1)
    assert a1.server is not None
    a1.server.set_group(GroupMember("a", 1, "master", epoch=2))
    a0.close()
    world.run(0.1)
    assert sorted(client.routes.writable_of("orders")) == ["a1:15555"]
    assert client.routes.server_table["a1:15555"].group == GroupMember("a", 1, "master", 2)


def test_rdvpump_routes_shows_each_server_s_group_and_a_slave_s_lag(world: World) -> None:
    """The JSON snapshot of ``rdvpump routes`` carries each server's group and the
    records it holds, and its table gets a group column (name/id role@epoch, and a
    slave's lag behind its master) when a server has one."""
    from rich.console import Console

    from brokermgr import GroupMember
    from rdvpump.cli.routes import _routes_table
    from rdvpump.watch import snapshot

    world.node("t1", role="tracker")
    a0 = world.node("a0", role="server", trackers=("t1",),
                    group=GroupMember("a", 0, "master", epoch=4))
    a1 = world.node("a1", role="server", trackers=("t1",),
                    group=GroupMember("a", 1, "slave", epoch=4))
    for node in (a0, a1):
        node.declare_topic("orders")
    world.node("solo", role="server", trackers=("t1",))
    client = world.client("c", "t1")
    world.run(0.1)
    snap = snapshot(client.routes, world.pump.now())
    groups = {s["address"]: s["group"] for s in snap["servers"]}
    assert groups == {"a0:15555": {"name": "a", "id": 0, "role": "master", "epoch": 4,
                                   "cluster": "default"},
                      "a1:15555": {"name": "a", "id": 1, "role": "slave", "epoch": 4,
                                   "cluster": "default"}, "solo:15555": None}
    console = Console(width=200, record=True)
    console.print(_routes_table(snap))
    assert "a/1 slave@4" in console.export_text()
    assert "lag" not in console.export_text()  # the members have not said what they hold
    assert a0.server is not None and a1.server is not None
    a0.server.set_held(120)
    a1.server.set_held(112)
    world.run(0.1)
    snap = snapshot(client.routes, world.pump.now())
    assert {s["address"]: s["held"] for s in snap["servers"]} == {
        "a0:15555": 120, "a1:15555": 112, "solo:15555": None}
    console = Console(width=200, record=True)
    console.print(_routes_table(snap))
    text = console.export_text()
    assert "a/1 slave@4 lag 8" in text and "a/0 master@4 lag" not in text, text
