"""Tracking under partitions (rdvpump.testing.Faults on the world's links): a tracker cut
off from half the servers, then two trackers cut off from one; the vote rule keeps every
client's route table right throughout, and healing brings every vote back."""

from __future__ import annotations

import pathlib

from brokermgr.tracking import TrackNode
from rdvpump.testing import Faults

from .world import TIMING, World, servers

SERVERS = ["s1", "s2", "s3", "s4"]


def tracked(node: TrackNode) -> list[str]:
    assert node.tracker is not None
    return sorted(a.split(":")[0] for a in node.tracker.tracked.values())


def test_the_vote_rule_keeps_route_tables_right_across_partitions() -> None:
    world = World()
    faults = Faults(world.universe, partition_timeout=8.0)
    trackers = {t: world.node(t, role="tracker") for t in ("t1", "t2", "t3")}
    for s in SERVERS:
        world.node(s, role="server", trackers=("t1", "t2", "t3"))
    clients = [world.client(f"c{i}", "t1", "t2", "t3") for i in range(2)]
    world.run(1)
    assert all(servers(c) == SERVERS for c in clients)

    # t1 loses half the servers: their links to it stall, then close as partitioned
    faults.partition("t1", ["s1", "s2"])
    world.run(TIMING["expiry"] + 1)
    assert tracked(trackers["t1"]) == ["s3", "s4"]
    assert tracked(trackers["t2"]) == SERVERS
    closed = [link for link in faults.links if link.cut_reason == "partitioned"]
    assert sorted(link.brokers[0] for link in closed) == ["s1", "s2"]
    for c in clients:  # 2 votes of 3 still keep s1 and s2
        assert servers(c) == SERVERS
        assert c.routes.voters("s1:15555") == 2 and c.routes.voters("s3:15555") == 3

    # t2 loses s1 as well: 1 vote of 3 is not enough
    faults.partition("t2", "s1")
    world.run(TIMING["expiry"] + 1)
    for c in clients:
        assert servers(c) == ["s2", "s3", "s4"]
    left = [(who, a) for _, who, a in world.log if who.endswith("leave")]
    assert sorted(left) == [("c0 leave", "s1:15555"), ("c1 leave", "s1:15555")]

    # healed: the servers dial the trackers again and every vote comes back
    faults.heal("t1", ["s1", "s2"])
    faults.heal("t2", "s1")
    world.run(TIMING["retry"] * 4 + TIMING["report_interval"])
    assert all(tracked(t) == SERVERS for t in trackers.values())
    for c in clients:
        assert servers(c) == SERVERS
        assert all(c.routes.voters(f"{s}:15555") == 3 for s in SERVERS)
    world.universe.close()


def test_a_short_partition_changes_nothing_a_client_sees() -> None:
    """Shorter than the link timeout and the tracker's expiry: the stalled reports
    arrive when it heals, and no client ever sees a server leave."""
    world = World()
    faults = Faults(world.universe, partition_timeout=30.0)
    world.node("t1", role="tracker")
    world.node("s1", role="server", trackers=("t1",))
    client = world.client("c", "t1")
    world.run(1)
    faults.partition("t1", "s1")
    world.run(TIMING["expiry"] - 2)
    faults.heal("t1", "s1")
    world.run(TIMING["expiry"] * 3)
    assert servers(client) == ["s1"]
    assert [what for _, what, _ in world.log] == ["c join"]
    assert all(link.cut_reason is None for link in faults.links)
    world.universe.close()


def test_a_crashed_server_restarts_with_its_state_dir(tmp_path: pathlib.Path) -> None:
    """crash() loses the server's links as a kill does (every client sees it leave at
    once); restart() brings a new broker with the same id, whose TrackNode reopens the
    same state_dir, so its InfoVersions go on increasing."""
    world = World()
    faults = Faults(world.universe)
    world.node("t1", role="tracker")
    world.node("s1", role="server", trackers=("t1",), state_dir=tmp_path)
    client = world.client("c", "t1")
    faults.on_restart.append(lambda broker: world.nodes.__setitem__(broker.id, TrackNode(
        broker, role="server", trackers=["t1:15555"], state_dir=tmp_path,
        **{k: v for k, v in TIMING.items() if k != "scan_interval"})))
    world.run(1)
    old_version = client.routes.server_table["s1:15555"].info_version
    faults.crash("s1")
    world.run(0.01)
    assert servers(client) == []
    assert [link.cut_reason for link in faults.links if "s1" in link.brokers] == ["s1 crashed"]
    assert list(tmp_path.iterdir())  # what it kept on disk is there
    world.run(5)
    faults.restart("s1")
    world.run(1)
    assert servers(client) == ["s1"]
    assert client.routes.server_table["s1:15555"].info_version > old_version
    world.universe.close()
