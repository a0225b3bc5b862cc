"""No silently stale routes: restarted servers, static servers that change, removals."""

from __future__ import annotations

import pathlib

import pytest

from brokermgr.tracking import RouteClient

from .world import TIMING, World

REPORT = TIMING["report_interval"]


def topics(client: RouteClient) -> list[str]:
    return sorted(client.routes.topic_table)


@pytest.mark.parametrize("with_state_dir", [True, False])
def test_a_restarted_server_reaches_every_kind_of_client_within_one_report_interval(
        world: World, tmp_path: pathlib.Path, with_state_dir: bool) -> None:
    state = {"state_dir": tmp_path / "s1"} if with_state_dir else {}
    world.node("t1", role="tracker")
    t2 = world.node("t2", role="tracker")
    s1 = world.node("s1", role="server", trackers=("t1", "t2"), **state)
    for i in range(20):  # a few changes before the restart
        s1.declare_topic(f"before-{i}")
    fed = world.client("fed", "t1")  # routes from a tracker
    static = world.client("static")  # no tracker at all: the server is static
    static.add_server("s1:15555")
    mixed = world.client("mixed", "t1")  # both
    mixed.add_server("s1:15555")
    lost = world.client("lost", "t2")  # its only tracker is gone across the restart
    world.run(1)
    clients = (fed, static, mixed, lost)
    assert all(len(topics(c)) == 20 for c in clients)
    old = {c: c.routes.server_table["s1:15555"].info_version for c in clients}
    t2.broker.close("crash")
    world.run(0.1)
    assert not lost.routes.votes and len(topics(lost)) == 20  # zero trackers: kept
    # a crash and a restart on the same id, with fresh counters
    s1.broker.close("crash")
    world.run(0.1)
    again = world.node("s1", role="server", trackers=("t1", "t2"), **state)
    again.declare_topic("after")
    world.node("t2", role="tracker")  # the lost client's tracker is back
    world.run(REPORT)
    for client in clients:
        assert topics(client) == ["after"], client.broker.id
        assert client.routes.server_table["s1:15555"].info_version > old[client]


def test_a_static_server_stays_current(world: World) -> None:
    s1 = world.node("s1", role="server")
    client = world.client("c")
    client.add_server("s1:15555")
    world.run(1)
    assert topics(client) == []
    world.run(100)
    s1.declare_topic("later")
    world.run(0.01)  # one message, not a report interval
    assert topics(client) == ["later"]
    s1.remove_topic("later")
    world.run(0.01)
    assert topics(client) == []
    assert s1.sent["server"] == 3  # once on connect, once a change


def test_a_removed_server_stays_removed_in_a_stable_system(world: World) -> None:
    world.node("t1", role="tracker")
    s1 = world.node("s1", role="server", trackers=("t1",))
    s2 = world.node("s2", role="server", trackers=("t1",))
    client = world.client("c", "t1")
    world.run(1)
    client.remove_server("s1:15555")
    for i in range(20):  # other changes, reports and scans for 200 s
        s2.declare_topic(f"t{i}")
        world.run(10)
    s1.declare_topic("newer")  # a newer ServerInfo of the removed server
    world.run(1)
    assert sorted(client.routes.server_table) == ["s2:15555"]
    client.add_server("s1:15555")  # added again: back
    world.run(1)
    assert "newer" in client.routes.topic_table
    client.remove_server("s1:15555")
    # the server restarts: the tracker drops it and lists it anew: back
    s1.broker.close("crash")
    world.run(0.1)
    world.node("s1", role="server", trackers=("t1",))
    world.run(1)
    assert sorted(client.routes.server_table) == ["s1:15555", "s2:15555"]
