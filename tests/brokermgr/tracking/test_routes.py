"""The client route table, sans-I/O: versions, votes, the zero-tracker rule, the topic index."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from brokermgr.tracking import (
    RoundRobin,
    RouteTable,
    ServerAddress,
    ServerInfo,
    TopicInfo,
    TrackerInfo,
    all_servers,
    by_key_hash,
)


def server(name: str, version: int, *topics: str, consumers: int = 0,
           depth: int = 0) -> ServerInfo:
    address = ServerAddress(f"{name}:15555")
    return ServerInfo(address, version, topic_table={
        t: TopicInfo(address, t, consumer_count=consumers, message_depth=depth) for t in topics})


def tracker(name: str, version: int, *servers: ServerInfo) -> TrackerInfo:
    return TrackerInfo(ServerAddress(f"{name}:15555"), version,
                       server_table={s.server_address.address: s for s in servers})


def test_a_tracker_info_builds_servers_and_topics() -> None:
    routes = RouteTable()
    change = routes.update_tracker("t1", tracker("t1", 1, server("a", 1, "x", "y"),
                                                 server("b", 1, "y")))
    assert change.joined == ["a:15555", "b:15555"] and not change.left
    assert sorted(routes.topic_table) == ["x", "y"]
    assert sorted(routes.servers_of("y")) == ["a:15555", "b:15555"]


def test_a_stale_tracker_info_arriving_late_changes_nothing() -> None:
    routes = RouteTable()
    routes.update_tracker("t1", tracker("t1", 5, server("a", 3, "x")))
    routes.update_tracker("t1", tracker("t1", 7, server("a", 4, "x", "y")))
    late = routes.update_tracker("t1", tracker("t1", 6, server("a", 9, "z")))
    assert late.stale and not late
    assert routes.server_table["a:15555"].info_version == 4
    assert sorted(routes.topic_table) == ["x", "y"]


def test_the_vote_version_is_the_last_accepted_one_not_the_first() -> None:
    # zbus's bug: vote.version stayed at the first TrackerInfo's version, so after
    # versions 1 then 10, a stale 5 was accepted and removed server b.
    routes = RouteTable()
    routes.update_tracker("t1", tracker("t1", 1, server("a", 1)))
    routes.update_tracker("t1", tracker("t1", 10, server("a", 1), server("b", 1)))
    stale = routes.update_tracker("t1", tracker("t1", 5, server("a", 1)))
    assert stale.stale
    assert sorted(routes.server_table) == ["a:15555", "b:15555"]
    assert routes.votes["t1"].version == 10


def test_a_server_info_is_merged_only_if_newer() -> None:
    routes = RouteTable()
    routes.update_tracker("t1", tracker("t1", 1, server("a", 5, "new")))
    routes.update_tracker("t2", tracker("t2", 1, server("a", 4, "old")))
    assert list(routes.topic_table) == ["new"]
    change = routes.update_tracker("t2", tracker("t2", 2, server("a", 6, "newer")))
    assert change.updated == ["a:15555"]
    assert list(routes.topic_table) == ["newer"]


def test_two_trackers_that_disagree_one_vote_of_two_keeps_a_server() -> None:
    routes = RouteTable()
    routes.update_tracker("t1", tracker("t1", 1, server("a", 1), server("b", 1)))
    routes.update_tracker("t2", tracker("t2", 1, server("a", 1)))
    assert sorted(routes.server_table) == ["a:15555", "b:15555"]  # 1 of 2 >= 0.5
    routes.update_tracker("t3", tracker("t3", 1, server("a", 1)))
    assert sorted(routes.server_table) == ["a:15555"]  # b: 1 of 3 < 0.5
    assert routes.voters("a:15555") == 3


def test_vote_factor_is_configurable() -> None:
    routes = RouteTable(vote_factor=1.0)  # every tracker must list a server
    routes.update_tracker("t1", tracker("t1", 1, server("a", 1), server("b", 1)))
    change = routes.update_tracker("t2", tracker("t2", 1, server("a", 1)))
    assert change.left == ["b:15555"]
    with pytest.raises(ValueError, match="vote_factor"):
        RouteTable(vote_factor=0)


def test_a_tracker_lost_and_back() -> None:
    left: list[str] = []
    joined: list[str] = []
    routes = RouteTable(on_join=lambda i: joined.append(i.server_address.address),
                        on_leave=left.append)
    routes.update_tracker("t1", tracker("t1", 1, server("a", 1)))
    routes.update_tracker("t2", tracker("t2", 1, server("b", 1)))
    assert joined == ["a:15555", "b:15555"]
    routes.remove_tracker("t2")  # b now has 0 votes of 1
    assert left == ["b:15555"] and sorted(routes.server_table) == ["a:15555"]
    routes.update_tracker("t2", tracker("t2", 2, server("b", 1)))
    assert joined[-1] == "b:15555" and sorted(routes.server_table) == ["a:15555", "b:15555"]


def test_with_zero_trackers_the_last_known_servers_are_kept() -> None:
    routes = RouteTable()
    routes.update_tracker("t1", tracker("t1", 1, server("a", 1, "x")))
    change = routes.remove_tracker("t1")
    assert not change and not routes.votes
    assert list(routes.server_table) == ["a:15555"]
    assert list(routes.servers_of("x")) == ["a:15555"]


def test_static_servers_are_never_purged_until_removed() -> None:
    routes = RouteTable()
    routes.update_server(server("s", 1, "x"))
    routes.update_tracker("t1", tracker("t1", 1, server("a", 1)))
    assert sorted(routes.server_table) == ["a:15555", "s:15555"]
    assert routes.remove_server("s:15555").left == ["s:15555"]
    assert "x" not in routes.topic_table


def test_an_empty_tracker_info_purges_what_it_no_longer_lists() -> None:
    routes = RouteTable()
    routes.update_tracker("t1", tracker("t1", 1, server("a", 1, "x")))
    change = routes.update_tracker("t1", tracker("t1", 2))
    assert change.left == ["a:15555"] and not routes.topic_table


def test_selectors() -> None:
    routes = RouteTable()
    routes.update_tracker("t1", tracker("t1", 1, server("a", 1, "x", consumers=0, depth=9),
                                        server("b", 1, "x", consumers=2),
                                        server("c", 1, "x", consumers=1), server("d", 1, "y")))
    rr = RoundRobin()
    picks = [rr(routes, "x")[0] for _ in range(4)]
    assert sorted(set(picks)) == ["b:15555", "c:15555"] and picks[0] != picks[1]
    assert rr(routes, "nope") == []
    assert all_servers(routes, "x") == ["a:15555", "b:15555", "c:15555", "d:15555"]
    assert by_key_hash(routes, "x", "k1") == by_key_hash(routes, "x", b"k1")
    assert by_key_hash(routes, "x", None) == []
    assert {by_key_hash(routes, "x", f"k{i}")[0] for i in range(50)} == {
        "a:15555", "b:15555", "c:15555"}
    # no server with consumers: the one with the most, ties by lowest depth
    quiet = RouteTable()
    quiet.update_tracker("t1", tracker("t1", 1, server("a", 1, "x", depth=9),
                                       server("b", 1, "x", depth=3)))
    assert RoundRobin()(quiet, "x") == ["b:15555"]


def test_round_robin_sees_route_changes() -> None:
    routes = RouteTable()
    rr = RoundRobin()
    routes.update_tracker("t1", tracker("t1", 1, server("a", 1, "x", consumers=1)))
    assert rr(routes, "x") == ["a:15555"]
    routes.update_tracker("t1", tracker("t1", 2, server("b", 1, "x", consumers=1)))
    assert rr(routes, "x") == ["b:15555"]


updates = st.lists(st.tuples(
    st.sampled_from(["t1", "t2", "t3"]), st.integers(1, 6),
    st.lists(st.tuples(st.sampled_from("abcde"), st.integers(1, 6),
                       st.sets(st.sampled_from("xyz"))), max_size=5),
    st.booleans()), max_size=30)


@settings(max_examples=150, deadline=None)
@given(updates)
def test_incremental_topic_table_equals_a_rebuild_and_votes_hold(ops: list) -> None:
    routes = RouteTable()
    for name, version, servers, remove in ops:
        if remove:
            routes.remove_tracker(name)
        else:
            infos = {s: server(s, v, *topics) for s, v, topics in servers}
            routes.update_tracker(name, tracker(name, version, *infos.values()))
        incremental = {t: dict(s) for t, s in routes.topic_table.items()}
        assert incremental == routes.rebuild_topic_table()
        if routes.votes:
            for address in routes.server_table:
                assert routes.voters(address) >= len(routes.votes) * routes.vote_factor
