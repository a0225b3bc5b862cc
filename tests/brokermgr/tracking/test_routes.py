"""The client route table, sans-I/O: versions, votes, the zero-tracker rule, the topic index."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from brokermgr.tracking import (
    DeltaError,
    InfoError,
    RoundRobin,
    RouteTable,
    ServerAddress,
    ServerInfo,
    TopicInfo,
    TrackerInfo,
    all_servers,
    by_key_hash,
    by_key_modulo,
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


def test_round_robin_keeps_one_position_per_topic() -> None:
    routes = RouteTable()
    routes.update_tracker("t1", tracker("t1", 1, server("a", 1, "x", "y", consumers=1),
                                        server("b", 1, "x", "y", consumers=1)))
    rr = RoundRobin()  # one selector shared by two topics, picks interleaved
    picks: dict[str, list[str]] = {"x": [], "y": []}
    for _ in range(4):
        for topic in ("x", "y"):
            picks[topic] += rr(routes, topic)
    for topic in ("x", "y"):
        assert picks[topic][0::2] != picks[topic][1::2]  # each topic alternates
        assert sorted(set(picks[topic])) == ["a:15555", "b:15555"]


def _placement(select, n: int, keys: list[str]) -> dict[str, str]:  # type: ignore[no-untyped-def]
    routes = RouteTable()
    routes.update_tracker("t1", tracker("t1", 1, *[server(f"s{i:02d}", 1, "x") for i in range(n)]))
    return {k: select(routes, "x", k)[0] for k in keys}


KEYS = [f"order-{i}" for i in range(10_000)]


def test_key_hashing_moves_only_the_keys_it_must() -> None:
    ten = _placement(by_key_hash, 10, KEYS)
    # a server leaves (s09, the last one, is simply not in the table of 9)
    nine = _placement(by_key_hash, 9, KEYS)
    moved = [k for k in KEYS if ten[k] != nine[k]]
    assert moved and all(ten[k] == "s09:15555" for k in moved)
    assert len(moved) == sum(1 for k in KEYS if ten[k] == "s09:15555")
    # a server joins: about 1/11 of the keys move, all of them to it
    eleven = _placement(by_key_hash, 11, KEYS)
    moved = [k for k in KEYS if ten[k] != eleven[k]]
    assert all(eleven[k] == "s10:15555" for k in moved)
    assert 0.06 < len(moved) / len(KEYS) < 0.12
    # spread: every server holds between 7% and 13% of the keys
    counts = [sum(1 for k in KEYS if ten[k] == f"s{i:02d}:15555") for i in range(10)]
    assert all(700 < c < 1300 for c in counts), counts


def test_modulo_hashing_is_kept_under_its_own_name_and_moves_most_keys() -> None:
    ten = _placement(by_key_modulo, 10, KEYS)
    eleven = _placement(by_key_modulo, 11, KEYS)
    assert sum(1 for k in KEYS if ten[k] != eleven[k]) / len(KEYS) > 0.8
    assert by_key_modulo(RouteTable(), "x", "k") == []


def test_remove_server_sticks_until_listed_anew_or_added() -> None:
    routes = RouteTable()
    routes.update_tracker("t1", tracker("t1", 1, server("a", 1, "x"), server("b", 1, "y")))
    assert routes.remove_server("a:15555").left == ["a:15555"]
    # the tracker keeps listing it, even with a newer ServerInfo: still hidden
    routes.update_tracker("t1", tracker("t1", 2, server("a", 2, "x", "z"), server("b", 2)))
    routes.update_tracker("t1", tracker("t1", 3, server("a", 3, "x"), server("b", 3)))
    assert sorted(routes.server_table) == ["b:15555"] and "x" not in routes.topic_table
    # the tracker drops it and lists it anew (it restarted): back
    routes.update_tracker("t1", tracker("t1", 4, server("b", 3)))
    assert routes.update_tracker("t1", tracker("t1", 5, server("a", 9, "x"),
                                               server("b", 3))).joined == ["a:15555"]
    # removed again, then added as a static server: back at once
    routes.remove_server("a:15555")
    assert routes.update_server(server("a", 10, "x")).joined == ["a:15555"]
    # a delta that only updates it does not bring it back after a removal
    routes.remove_server("a:15555")
    assert not routes.apply_delta("t1", 6, {"a:15555": server("a", 11, "x")}, [])
    assert "a:15555" not in routes.server_table


def test_a_delta_without_a_snapshot_is_refused() -> None:
    with pytest.raises(DeltaError, match="before its snapshot"):
        RouteTable().apply_delta("t1", 1, {}, [])


def test_a_tracker_coming_back_restores_what_a_third_one_outvoted() -> None:
    # b is listed by one tracker of three (purged); when another tracker goes, one of
    # two keeps it: it comes back at once, from the view that still lists it
    routes = RouteTable()
    routes.update_tracker("t1", tracker("t1", 1, server("a", 1), server("b", 1, "y")))
    routes.update_tracker("t2", tracker("t2", 1, server("a", 1)))
    routes.update_tracker("t3", tracker("t3", 1, server("a", 1)))
    assert sorted(routes.server_table) == ["a:15555"]
    assert routes.remove_tracker("t3").joined == ["b:15555"]
    assert list(routes.servers_of("y")) == ["b:15555"]


updates = st.lists(st.tuples(
    st.sampled_from(["t1", "t2", "t3"]), st.integers(1, 6),
    st.lists(st.tuples(st.sampled_from("abcde"), st.integers(1, 6),
                       st.sets(st.sampled_from("xyz"))), max_size=5),
    st.booleans()), max_size=30)


@given(updates)
def test_incremental_topic_table_equals_a_rebuild_and_votes_hold(
        ops: list[tuple[str, int, list[tuple[str, int, set[str]]], bool]]) -> None:
    routes = RouteTable()
    made: dict[tuple[str, str, int], TopicInfo] = {}  # a topic's info, shared by versions
    for name, version, servers, remove in ops:
        if remove:
            routes.remove_tracker(name)
        else:
            infos = {s: ServerInfo(ServerAddress(f"{s}:15555"), v, topic_table={
                t: made.setdefault((s, t, v % 2), TopicInfo(ServerAddress(f"{s}:15555"), t,
                                                            message_depth=v % 2))
                for t in topics}) for s, v, topics in servers}
            routes.update_tracker(name, tracker(name, version, *infos.values()))
        incremental = {t: dict(s) for t, s in routes.topic_table.items()}
        for topic, held in incremental.items():  # the server table's own objects
            assert all(routes.server_table[a].topic_table[topic] is info
                       for a, info in held.items())
        assert incremental == routes.rebuild_topic_table()
        if routes.votes:
            for address in routes.server_table:
                assert routes.voters(address) >= len(routes.votes) * routes.vote_factor


def test_writes_go_to_masters_and_reads_to_the_master_or_while_none_its_slaves() -> None:
    """A replicated group's members say their role in their ServerInfo: producers'
    selectors never pick a slave, consumers read a group from its master, and from its
    slaves while the table has no master of it; servers in no group are as before."""
    from dataclasses import replace

    from brokermgr import GroupMember

    def member(name: str, group: str | None, member_id: int, role: str) -> ServerInfo:
        info = server(name, 1, "orders", consumers=1)
        return replace(info, group=None if group is None else GroupMember(
            group, member_id, role, epoch=1))

    a0, a1, a2 = (member("a0", "a", 0, "master"), member("a1", "a", 1, "slave"),
                  member("a2", "a", 2, "slave"))
    solo = member("solo", None, 0, "master")
    routes = RouteTable()
    routes.update_tracker("t1", tracker("t1", 1, a0, a1, a2, solo))
    assert sorted(routes.servers_of("orders")) == ["a0:15555", "a1:15555", "a2:15555",
                                                   "solo:15555"]
    assert sorted(routes.writable_of("orders")) == ["a0:15555", "solo:15555"]
    rr = RoundRobin()
    assert {rr(routes, "orders")[0] for _ in range(6)} == {"a0:15555", "solo:15555"}
    assert {by_key_hash(routes, "orders", str(k))[0] for k in range(50)} == {
        "a0:15555", "solo:15555"}
    assert all_servers(routes, "orders") == ["a0:15555", "solo:15555"]
    # the master leaves the table: no writes to the group, reads from its slaves
    routes.update_tracker("t1", tracker("t1", 2, a1, a2, solo))
    assert {rr(routes, "orders")[0] for _ in range(4)} == {"solo:15555"}
    assert all_servers(routes, "orders") == ["a1:15555", "a2:15555", "solo:15555"]
    # a1 is promoted: it takes the writes, and is the one the group is read from
    routes.update_tracker("t1", tracker("t1", 3, replace(
        a1, info_version=2, group=GroupMember("a", 1, "master", epoch=2)), a2, solo))
    assert sorted(routes.writable_of("orders")) == ["a1:15555", "solo:15555"]
    assert all_servers(routes, "orders") == ["a1:15555", "solo:15555"]
    # a hung master still listed beside the one promoted over it: superseded, it takes
    # neither writes nor reads until its reports expire
    routes.update_tracker("t1", tracker("t1", 4, a0, replace(
        a1, info_version=2, group=GroupMember("a", 1, "master", epoch=2)), a2, solo))
    assert routes.superseded("a0:15555") and not routes.superseded("a1:15555")
    assert sorted(routes.writable_of("orders")) == ["a1:15555", "solo:15555"]
    assert routes.readable() == ["a1:15555", "solo:15555"]
    # the group travels in the ServerInfo's JSON, checked like every field
    again = ServerInfo.from_json(a1.to_json())
    assert again.group == a1.group and again.slave
    with pytest.raises(InfoError, match=r"serverInfo.group: a role is master or slave"):
        ServerInfo.from_json({**a1.to_json(), "group": {**a1.to_json()["group"],
                                                        "role": "leader"}})
