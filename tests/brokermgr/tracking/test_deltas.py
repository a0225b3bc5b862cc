"""Deltas give the route tables full snapshots give: random joins, leaves, changes,
reconnects, lost deltas and slow readers, on the pump's virtual clock."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from brokermgr import BrokerManager
from brokermgr.tracking import RouteClient, RouteTable, TrackerInfo, TrackNode
from brokermgr.tracking.feed import Delta, FeedReader, Resync, Snapshot
from brokermgr.tracking.info import ServerInfo

from .world import World, flood_a_slow_subscriber, server_of, tracker_of

SERVERS = 6
#: Which trackers server i reports to.
TRACKERS = (("t1",), ("t2",), ("t1", "t2"))

# Server indexes pick among the servers running (crash, stop, declare, remove) or not
# running (start), modulo their number, so that few steps are no-ops.
op = st.one_of(
    st.tuples(st.just("start"), st.integers(0, SERVERS - 1)),
    st.tuples(st.just("crash"), st.integers(0, SERVERS - 1)),
    st.tuples(st.just("stop"), st.integers(0, SERVERS - 1)),
    st.tuples(st.just("declare"), st.integers(0, SERVERS - 1), st.integers(0, 3)),
    st.tuples(st.just("remove"), st.integers(0, SERVERS - 1), st.integers(0, 3)),
    st.tuples(st.just("reconnect"), st.sampled_from(["t1", "t2"])),
    st.tuples(st.just("lose-delta"), st.sampled_from(["t1", "t2"])),
    st.tuples(st.just("pause"),),
    st.tuples(st.just("resume"),),
)


def table(client: RouteClient) -> dict[str, Any]:
    routes = client.routes
    return {"servers": {a: i.info_version for a, i in routes.server_table.items()},
            "topics": {t: sorted(s) for t, s in routes.topic_table.items()}}


class Run:
    def __init__(self) -> None:
        self.world = World()
        # small rings and high-water marks: a paused reader is behind within a few changes
        self.world.universe = BrokerManager("tracking", ring_capacity=512, high_water=1024)
        self.world.pump = self.world.universe.pump
        self.world.node("t1", role="tracker")
        self.world.node("t2", role="tracker")
        self.servers: dict[int, TrackNode] = {}
        self.full = self.world.client("full", "t1", "t2", deltas=False)
        self.delta = self.world.client("delta", "t1", "t2")
        # the one that suffers: reconnects, lost deltas, reading paused
        self.rough = self.world.client("rough", "t1", "t2")
        self.paused = False

    def apply(self, step: tuple[Any, ...]) -> None:
        kind, *args = step
        world = self.world
        running = sorted(self.servers)
        stopped = [i for i in range(SERVERS) if i not in self.servers]
        if kind == "start" and stopped:
            i = stopped[args[0] % len(stopped)]
            self.servers[i] = world.node(f"s{i}", role="server", trackers=TRACKERS[i % 3])
        elif kind in ("crash", "stop") and running:
            node = self.servers.pop(running[args[0] % len(running)])
            if kind == "stop":
                node.close()
            node.broker.close("crash" if kind == "crash" else "stop")
        elif kind == "declare" and running:
            self.servers[running[args[0] % len(running)]].declare_topic(f"topic-{args[1]}")
        elif kind == "remove" and running:
            server = self.servers[running[args[0] % len(running)]]
            if f"topic-{args[1]}" in server.server_info.topic_table:
                server.remove_topic(f"topic-{args[1]}")
        elif kind == "reconnect":
            sub = self.rough.trackers[f"{args[0]}:15555"]
            if sub.queue is not None:
                sub.queue.abort("test: the subscription is lost")
        elif kind == "lose-delta":
            reader = self.rough.trackers[f"{args[0]}:15555"].reader
            if reader.expected is not None:
                reader.expected -= 1  # as if the next delta was the one after a lost one
        elif kind == "pause" and not self.paused:
            self._reading(pause=True)
        elif kind == "resume" and self.paused:
            self._reading(pause=False)
        world.run(0.5)

    def _reading(self, *, pause: bool) -> None:
        self.paused = pause
        for sub in self.rough.trackers.values():
            if sub.queue is not None:
                if pause:
                    sub.queue.pause_reading()
                else:
                    sub.queue.resume_reading()


@given(st.lists(op, min_size=1, max_size=30), st.booleans())
def test_deltas_give_the_tables_full_snapshots_give(steps: list[tuple[Any, ...]],
                                                     slow_from_the_start: bool) -> None:
    run = Run()
    try:
        for _ in range(3):
            run.apply(("start", 0))
        if slow_from_the_start:
            run.apply(("pause",))
        for step in steps:
            run.apply(step)
            # the two undisturbed clients agree at every quiet point
            assert table(run.delta) == table(run.full), step
        if run.paused:
            run.apply(("resume",))
        run.world.run(10)  # past the retry interval: every lost link is back
        assert table(run.rough) == table(run.delta) == table(run.full)
        live = {f"s{i}:15555" for i in run.servers}
        assert set(run.full.routes.server_table) == live
        for sub in run.delta.trackers.values():
            assert sub.resyncs == 0  # nothing was lost on the undisturbed links
        lost = sum(1 for s in steps if s[0] == "lose-delta")
        if lost == 0:
            assert all(sub.resyncs == 0 for sub in run.rough.trackers.values())
    finally:
        run.world.universe.close()


def test_a_lost_delta_is_noticed_and_repaired_by_a_snapshot(world: World) -> None:
    world.node("t1", role="tracker")
    s1 = world.node("s1", role="server", trackers=("t1",))
    client = world.client("c", "t1")
    world.run(0.5)
    sub = client.trackers["t1:15555"]
    assert sub.reader.expected is not None
    sub.reader.expected -= 1  # the next delta looks like the one after a lost one
    s1.declare_topic("x")
    world.run(0.5)
    assert sub.resyncs == 1 and list(client.routes.topic_table) == ["x"]
    assert world.nodes["t1"].received["track_sub"] == 2


def test_after_the_first_snapshot_only_changes_travel(world: World) -> None:
    t1 = world.node("t1", role="tracker")
    nodes = [world.node(f"s{i}", role="server", trackers=("t1",)) for i in range(20)]
    for node in nodes:
        for j in range(20):
            node.declare_topic(f"topic-{j}")
    client = world.client("c", "t1")
    world.run(0.5)
    snapshot_bytes = t1.sent_bytes["track_pub"]
    nodes[3].declare_topic("one-more")
    world.run(0.5)
    assert "one-more" in client.routes.topic_table
    assert t1.sent_bytes["track_pub"] == snapshot_bytes  # no second snapshot
    assert t1.sent["track_delta"] == 1
    assert t1.sent_bytes["track_delta"] < snapshot_bytes / 15  # one server of twenty


def test_a_change_of_a_server_the_client_holds_costs_the_topics_that_changed(
        world: World) -> None:
    t1 = world.node("t1", role="tracker")
    s1 = world.node("s1", role="server", trackers=("t1",))
    for j in range(500):
        s1.declare_topic(f"topic-{j:03d}")
    client = world.client("c", "t1")
    world.run(0.5)
    snapshot_bytes = t1.sent_bytes["track_pub"]
    s1.declare_topic("one-more")
    s1.remove_topic("topic-007")
    world.run(0.5)
    assert sorted(client.routes.topic_table) == sorted(
        [f"topic-{j:03d}" for j in range(500) if j != 7] + ["one-more"])
    assert client.routes.server_table["s1:15555"] == server_of(s1).info  # all of it
    # two patches (one per change), each one topic's worth, not the server's 500
    assert t1.sent["track_delta"] == 2 and t1.sent_bytes["track_delta"] < snapshot_bytes / 50
    assert client.trackers["t1:15555"].resyncs == 0


def test_a_patch_of_a_server_info_the_client_does_not_hold_asks_for_a_snapshot(
        world: World) -> None:
    world.node("t1", role="tracker")
    s1 = world.node("s1", role="server", trackers=("t1",))
    s1.declare_topic("x")
    client = world.client("c", "t1")
    world.run(0.5)
    sub = client.trackers["t1:15555"]
    view = client.routes.votes["t1:15555"].servers
    view["s1:15555"] = replace(view["s1:15555"], info_version=1)  # not what it was sent
    s1.declare_topic("y")
    world.run(0.5)
    assert sub.resyncs == 1 and sorted(client.routes.topic_table) == ["x", "y"]
    assert world.nodes["t1"].received["track_sub"] == 2


def test_after_its_first_report_a_server_reports_what_changed(world: World) -> None:
    t1 = world.node("t1", role="tracker")
    s1 = world.node("s1", role="server", trackers=("t1",))
    for j in range(500):
        s1.declare_topic(f"topic-{j:03d}")
    world.run(0.5)
    whole = s1.sent_bytes["track_pub"]
    s1.declare_topic("one-more")
    s1.remove_topic("topic-007")
    world.run(0.5)
    assert tracker_of(t1).tracked.values()["s1:15555"] == server_of(s1).info  # all of it
    assert s1.sent_bytes["track_pub"] - whole < whole / 50  # two changes' worth


def test_a_patch_the_tracker_cannot_apply_brings_the_whole_server_info(
        world: World) -> None:
    t1 = world.node("t1", role="tracker")
    s1 = world.node("s1", role="server", trackers=("t1",))
    s1.declare_topic("x")
    world.run(0.5)
    tracker_of(t1).tracked.remove("s1:15555")  # as if it expired: the base is gone
    s1.declare_topic("y")  # a patch, refused (409, whole), then the whole ServerInfo
    world.run(0.5)
    assert tracker_of(t1).tracked.values()["s1:15555"] == server_of(s1).info
    publisher = server_of(s1).publishers[0]
    assert publisher.sent is server_of(s1).info and not publisher.whole_only


def test_a_tracker_that_refuses_patches_gets_whole_reports(world: World) -> None:
    from brokermgr import ServiceError

    t1 = world.node("t1", role="tracker")
    s1 = world.node("s1", role="server", trackers=("t1",))
    s1.declare_topic("x")
    world.run(0.5)
    publisher = server_of(s1).publishers[0]
    publisher._refused(ServiceError(400, "track_pub: serverInfo is missing"))  # an old one
    world.run(0.5)
    assert publisher.whole_only
    before = s1.sent_bytes["track_pub"]
    s1.declare_topic("y")
    world.run(0.5)
    assert s1.sent_bytes["track_pub"] - before > len(server_of(s1).encoded_info())  # whole
    assert tracker_of(t1).tracked.values()["s1:15555"] == server_of(s1).info


def test_a_snapshot_larger_than_one_message_arrives_in_pieces() -> None:
    world = World()
    world.universe = BrokerManager("tracking", max_message_size=8192, high_water=8192)
    world.pump = world.universe.pump
    t1 = world.node("t1", role="tracker")
    servers = [world.node(f"s{i}", role="server", trackers=("t1",)) for i in range(10)]
    for node in servers:
        for j in range(8):
            node.declare_topic(f"topic-{j}")
    client = world.client("c", "t1")
    world.run(0.5)
    assert len(tracker_of(t1).snapshot()) > 3 * 8192  # would not fit one message
    assert t1.sent["track_pub"] > 3  # pieces
    assert len(client.routes.server_table) == 10
    assert all(len(by) == 10 for by in client.routes.topic_table.values())
    world.universe.close()


def test_a_slow_delta_subscriber_gets_every_change_coalesced_in_bounded_memory() -> None:
    world, t1, slow = flood_a_slow_subscriber(b'{"cmd":"track_sub","deltas":true}')
    got = slow.got
    (subscriber,) = tracker_of(t1).subscribers.values()
    stats = subscriber.queue.statistics()
    assert stats.bytes_queued <= 4096 + len(tracker_of(t1).snapshot())
    assert subscriber.behind and set(subscriber.pending) == {"s1:15555"}  # one entry owed
    slow.queue.resume_reading()
    world.run(1)
    # what the slow reader got builds the whole table
    reader, routes = FeedReader(), RouteTable()
    for message in got:
        event = reader.receive(json.loads(message))
        if isinstance(event, Snapshot):
            routes.update_tracker("t1", TrackerInfo.from_json(event.tracker_info))
        elif isinstance(event, Delta):
            routes.apply_delta("t1", event.version, {
                a: ServerInfo.from_json(v) for a, v in event.servers.items()}, event.left)
        else:
            assert not isinstance(event, Resync)
    assert len(routes.server_table["s1:15555"].topic_table) == 200
    assert routes.votes["t1"].version == tracker_of(t1).version
    assert len(got) < 50  # coalesced, not one per change
    world.universe.close()
