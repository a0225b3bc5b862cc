"""A cluster's configuration and membership, on the virtual clock: every server linked to
every other both ways, a server that disagrees refused on both sides (logged once), a
newer link from a peer replacing the older one, a crashed peer linked again."""

from __future__ import annotations

import logging
import pathlib
from typing import Any

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from brokermgr import open_universe
from mq import ServiceError
from mq.cluster._file import ClusterConfig, load_cluster, parse_cluster
from mq.cluster._node import CLUSTER_PORT, ClusterNode
from pump import ConfigError


def config(*servers: tuple[str, str], name: str = "shop") -> ClusterConfig:
    return parse_cluster({"cluster": {"name": name}, "server": [
        {"id": i, "address": f"127.0.0.1:{9901 + n}", "type": t}
        for n, (i, t) in enumerate(servers)]})


THREE = config(("a", "primary"), ("b", "primary"), ("c", "backup"))


async def until(check: Any, *, within: float = 30.0) -> None:
    """Wait (virtual seconds) for ``check()``; each turn of the pump may change it."""
    with trio.fail_after(within):
        while not check():
            await trio.sleep(0.05)


async def fill(link: Any) -> None:
    """Requests on ``link`` (its peer not reading) until it is past its high-water mark."""
    sent = 0
    while link.request({"cmd": "fetch", **link.said()}, lambda _: None):
        sent += 1
        if sent % 100 == 0:
            await trio.sleep(0)  # the pump moves what fits into the ring


def test_a_cluster_file_is_read_and_its_problems_named(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "cluster.toml"
    path.write_text('[cluster]\nname = "shop"\n'
                    '[[server]]\nid = "a"\naddress = "127.0.0.1:9901"\ntype = "primary"\n'
                    '[[server]]\nid = "b"\naddress = "127.0.0.1:9902"\ntype = "fanout"\n')
    loaded = load_cluster(path)
    assert [(s.id, s.type) for s in loaded.servers] == [("a", "primary"), ("b", "fanout")]
    assert loaded.checksum == load_cluster(path).checksum
    # the checksum stands for the whole list: name, order, address and type count
    assert len({THREE.checksum,
                config(("b", "primary"), ("a", "primary"), ("c", "backup")).checksum,
                config(("a", "primary"), ("b", "primary"), ("c", "fanout")).checksum,
                config(("a", "primary"), ("b", "primary"), ("c", "backup"),
                       name="other").checksum}) == 4
    # the beat and the silence are the cluster's: every server must read the same
    timed = {"cluster": {"name": "shop", "heartbeat": 1, "silence": 5},
             "server": [{"id": "a", "address": "127.0.0.1:9901", "type": "primary"}]}
    assert (parse_cluster(timed).heartbeat, parse_cluster(timed).silence) == (1.0, 5.0)
    default = config(("a", "primary"))
    assert (default.heartbeat, default.silence) == (0.1, 0.5)
    assert parse_cluster(timed).checksum != default.checksum
    timed["cluster"].update(heartbeat=0.1, silence=0.5)  # the defaults, said
    assert parse_cluster(timed).checksum == default.checksum
    server = '[[server]]\nid = "a"\naddress = "h:1"\ntype = "primary"\n'
    for text, said in (
            ('[cluster]\nname = "x"\nheartbeat = 0\n' + server,
             "[cluster] heartbeat must be seconds, above 0 and below a day, got 0"),
            ('[cluster]\nname = "x"\nsilence = "1s"\n' + server,
             "[cluster] silence must be seconds, above 0 and below a day, got '1s'"),
            ('[cluster]\nname = "x"\nheartbeat = 1\n' + server,
             "[cluster] silence (0.5 s) must be at least two heartbeats (1 s each)"),
            ('[cluster]\nname = "x"\nbeat = 1\n' + server,
             "[cluster] takes name, and optionally heartbeat and silence"),
            ('[cluster]\nname = "x"\n', "no [[server]]"),
            ('[[server]]\nid = "a"\naddress = "h:1"\ntype = "primary"\n', "no [cluster] table"),
            ('[cluster]\nname = "x"\n[[server]]\nid = "a"\naddress = "h:1"\ntype = "root"\n',
             "server 1: type must be one of primary, backup, fanout, got 'root'"),
            ('[cluster]\nname = "x"\n[[server]]\nid = "a"\naddress = "h:1"\ntype = "backup"\n',
             "no primary server"),
            ('[cluster]\nname = "x"\n[[server]]\nid = "a"\naddress = "h"\ntype = "primary"\n',
             "server 1: address must be HOST:PORT, with a port 1-65535, got 'h'"),
            ('[cluster]\nname = "x"\n[[server]]\nid = "a"\naddress = "h:0"\ntype = "primary"\n',
             "server 1: address must be HOST:PORT, with a port 1-65535, got 'h:0'"),
            ('[cluster]\nname = "x"\n' + '[[server]]\nid = "a"\naddress = "h:1"\n'
             'type = "primary"\n' * 2, "server 2: id 'a' is listed twice"),
            ('[cluster]\nname = "x"\n[[server]]\nid = "a"\naddress = "h:1"\n', "takes id, "),
            ("[cluster\n", "not TOML")):
        path.write_text(text)
        with pytest.raises(ConfigError) as exc:
            load_cluster(path)
        assert str(exc.value).startswith(str(path)) and said in str(exc.value), exc.value
    with pytest.raises(ConfigError, match="cannot read the cluster file"):
        load_cluster(tmp_path / "missing.toml")


async def test_every_server_is_linked_to_every_other_both_ways(autojump_clock: object) -> None:
    async with open_universe("u") as universe:
        nodes = {s.id: ClusterNode(universe.add_broker(s.id), THREE) for s in THREE.servers}
        await until(lambda: all(n.linked() for n in nodes.values()))
        for node in nodes.values():
            assert [(r["outgoing"], r["incoming"], r["refusal"]) for r in node.rows()] == [
                ("up", "up", None)] * 2
        with pytest.raises(ConfigError, match="'x' is not a server of cluster 'shop'"):
            ClusterNode(universe.add_broker("x"), THREE)
        for node in nodes.values():
            node.close()


async def test_a_server_with_another_list_is_refused_on_both_sides_and_logged_once(
        autojump_clock: object, caplog: pytest.LogCaptureFixture) -> None:
    """c reads a file where it is a fanout server: a and b refuse its links, and it
    refuses theirs, with the reason, however often they dial again; a and b agree."""
    other = config(("a", "primary"), ("b", "primary"), ("c", "fanout"))
    caplog.set_level(logging.ERROR, logger="rdvpump.mq.cluster")
    async with open_universe("u") as universe:
        a = ClusterNode(universe.add_broker("a"), THREE)
        b = ClusterNode(universe.add_broker("b"), THREE)
        c = ClusterNode(universe.add_broker("c"), other)
        await until(lambda: all(r["refusal"] for r in c.rows())
                    and a.rows()[1]["refusal"] and b.rows()[1]["refusal"])
        await trio.sleep(20)  # twenty more seconds of dialling: nothing new is said
        assert a.rows()[0]["outgoing"] == a.rows()[0]["incoming"] == "up"
        for node in (a, b, c):
            bad = [r for r in node.rows() if r["refusal"]]
            assert all(r["outgoing"] == r["incoming"] == "down" for r in bad)
            assert all("server list differs" in r["refusal"] for r in bad)
        lines = [r.getMessage() for r in caplog.records]
        # each side says each of its two reasons (its refusal, the peer's) once a peer
        for side, peer in (("a", "c"), ("b", "c"), ("c", "a"), ("c", "b")):
            said = [x for x in lines if x.startswith(f"cluster shop: {side}: ")
                    and f" {peer}" in x.split(":")[2]]
            assert len(said) == 2 and len(set(said)) == 2, (side, peer, lines)
        for node in (a, b, c):
            node.close()


async def test_another_cluster_name_is_refused_with_it(autojump_clock: object) -> None:
    renamed = config(("a", "primary"), ("b", "primary"), ("c", "backup"), name="depot")
    async with open_universe("u") as universe:
        a = ClusterNode(universe.add_broker("a"), THREE)
        b = ClusterNode(universe.add_broker("b"), renamed)
        await until(lambda: a.rows()[0]["refusal"] and b.rows()[0]["refusal"])
        for node in (a, b):  # its own refusal or the peer's, whichever came last
            why = node.rows()[0]["refusal"]
            assert ("cluster 'depot' is not this one ('shop')" in why
                    or "cluster 'shop' is not this one ('depot')" in why), why
        a.close()
        b.close()


async def test_a_live_peer_s_link_is_never_displaced_and_a_silent_one_is(
        autojump_clock: object) -> None:
    """A second link that says it is b, while b's link in beats: refused (409, the
    reason logged once), and b's link kept.  Once b's link has been silent for the silence
    timeout (b restarted behind a connection left open), a newer link from b
    replaces it.  A hello naming another server than the broker that dialled is
    refused."""
    from mq.cluster._node import SILENCE

    async with open_universe("u") as universe:
        a = ClusterNode(universe.add_broker("a"), THREE)
        b_broker = universe.add_broker("b")
        b = ClusterNode(b_broker, THREE)
        await until(lambda: a.rows()[0]["incoming"] == "up")
        first = a.peers["b"].incoming
        assert first is not None
        hello = b'{"cmd":"hello","cluster":"shop","id":"b","checksum":%d,"seq":1}' % (
            THREE.checksum)
        second = await b_broker.connect_queue("a", CLUSTER_PORT)
        await second.send(hello)
        refused = await second.receive()
        assert b'"status":409' in refused and b"its link is live" in refused, refused
        assert a.peers["b"].incoming is first and not first.closed
        b._beats.cancel()  # b goes silent, its link left open
        await trio.sleep(SILENCE + 0.5)
        third = await b_broker.connect_queue("a", CLUSTER_PORT)
        await third.send(hello)
        assert b'"welcome"' in await third.receive()
        await until(lambda: first.closed)
        assert a.peers["b"].incoming is not first and a.rows()[0]["incoming"] == "up"
        # a hello that names another server than the broker that dialled is refused
        fourth = await b_broker.connect_queue("a", CLUSTER_PORT)
        await fourth.send(b'{"cmd":"hello","cluster":"shop","id":"c","checksum":%d,"seq":1}'
                          % THREE.checksum)
        refusal = await fourth.receive()
        assert b"says it is 'c' but its link is from broker 'b'" in refusal
        await third.aclose()
        a.close()
        b.close()


async def test_a_peer_counts_as_gone_after_the_cluster_file_s_silence(
        autojump_clock: object) -> None:
    """With ``silence = 5`` in the file, a peer whose beats stop (its links open) still
    counts 4.5 s later, and is counted out at 5 s: a link that says it is that peer
    replaces its silent one only then."""
    slow = parse_cluster({"cluster": {"name": "shop", "heartbeat": 1, "silence": 5},
                          "server": [{"id": i, "address": f"127.0.0.1:{9901 + n}",
                                      "type": "primary"} for n, i in enumerate("ab")]})
    async with open_universe("u") as universe:
        a = ClusterNode(universe.add_broker("a"), slow)
        b_broker = universe.add_broker("b")
        b = ClusterNode(b_broker, slow)
        await until(lambda: a.linked() and b.linked())
        hello = b'{"cmd":"hello","cluster":"shop","id":"b","checksum":%d,"seq":1}' % (
            slow.checksum)
        b._beats.cancel()  # b goes silent, its links left open
        await trio.sleep(4.5)
        early = await b_broker.connect_queue("a", CLUSTER_PORT)
        await early.send(hello)
        assert b"its link is live" in await early.receive()
        await trio.sleep(1.5)
        late = await b_broker.connect_queue("a", CLUSTER_PORT)
        await late.send(hello)
        assert b'"welcome"' in await late.receive()
        for queue in (early, late):
            await queue.aclose()
        a.close()
        b.close()


async def test_a_crashed_peer_is_linked_again_when_it_comes_back(
        autojump_clock: object) -> None:
    async with open_universe("u") as universe:
        nodes = {s.id: ClusterNode(universe.add_broker(s.id), THREE) for s in THREE.servers}
        await until(lambda: all(n.linked() for n in nodes.values()))
        nodes["c"].close()
        universe.broker("c").close("crashed")
        await until(lambda: all(r["outgoing"] == r["incoming"] == "down"
                                for n in (nodes["a"], nodes["b"]) for r in n.rows()
                                if r["id"] == "c"))
        nodes["c"] = ClusterNode(universe.add_broker("c"), THREE)
        await until(lambda: all(n.linked() for n in nodes.values()))
        for node in nodes.values():
            node.close()


FOUR = config(("a", "primary"), ("b", "primary"), ("c", "primary"), ("d", "backup"))


def test_the_root_is_the_most_senior_active_primary_with_every_vote_and_a_majority() -> None:
    from mq.cluster._root import ballot, candidate, may_take_over

    everyone = ["a", "b", "c", "d"]
    votes: dict[str, Any] = {"b": ("a", 1), "c": ("a", 1)}
    assert candidate(FOUR, everyone) == "a"
    assert may_take_over(FOUR, "a", everyone, votes, ("a", 1))
    assert not may_take_over(FOUR, "b", everyone, votes, ("b", 1))
    # a gone: b, once c votes for it at b's epoch; not while c's ballot is another
    left = ["b", "c", "d"]
    assert may_take_over(FOUR, "b", left, {"c": ("b", 2)}, ("b", 2))
    assert not may_take_over(FOUR, "b", left, {"c": ("a", 1)}, ("b", 2))
    assert not may_take_over(FOUR, "b", left, {"c": ("b", 3)}, ("b", 2))
    # a majority of the primaries listed: c and the backup alone are not one
    assert candidate(FOUR, ["c", "d"]) == "c"
    assert not may_take_over(FOUR, "c", ["c", "d"], {}, ("c", 2))
    # backups neither vote nor lead
    assert not may_take_over(FOUR, "d", everyone, {p: ("d", 1) for p in "abc"}, ("d", 1))
    # not from an older state than an active server said it has (it fetches it first)
    assert not may_take_over(FOUR, "a", everyone, votes, ("a", 1), (1, 4),
                             {"b": (1, 5), "c": (1, 4)})
    assert not may_take_over(FOUR, "a", everyone, votes, ("a", 1), (1, 9), {"b": (2, 1)})
    assert may_take_over(FOUR, "a", everyone, votes, ("a", 1), (1, 5),
                         {"b": (1, 5), "x": (3, 9)})
    # ballots: a new primary only with a new epoch, above every epoch known or heard
    assert ballot(FOUR, everyone, (None, 0), 0, None, []) == ("a", 1)
    assert ballot(FOUR, everyone, ("a", 1), 1, "a", [("a", 1)]) == ("a", 1)  # it holds
    assert ballot(FOUR, left, ("a", 1), 1, "a", [("a", 1), ("c", 4)]) == ("b", 5)
    assert ballot(FOUR, left, ("b", 2), 1, "a", [("b", 3)]) == ("b", 3)  # one epoch
    assert ballot(FOUR, everyone, ("a", 1), 2, "b", []) == ("a", 3)  # 1 was passed over


@given(st.lists(st.sampled_from(["primary", "backup", "fanout"]), min_size=1, max_size=7),
       st.data())
def test_servers_that_see_the_same_peers_elect_at_most_one_root(types: list[str],
                                                                data: Any) -> None:
    from mq.cluster._root import ballot, candidate, may_take_over

    if "primary" not in types:
        types[0] = "primary"
    cluster = config(*((f"s{i}", t) for i, t in enumerate(types)))
    ids = [s.id for s in cluster.servers]
    active = data.draw(st.lists(st.sampled_from(ids), unique=True))
    votes = {s: ballot(cluster, active, (None, 0), 0, None, [])
             for s, t in zip(ids, types, strict=True) if s in active and t == "primary"}
    roots = [s for s in votes if may_take_over(cluster, s, active, votes, votes[s])]
    primaries = [s for s, t in zip(ids, types, strict=True) if t == "primary"]
    if len(votes) * 2 > len(primaries):
        assert roots == [candidate(cluster, active)]
    else:
        assert roots == []


async def test_a_root_is_elected_replaced_when_it_crashes_and_fenced_when_it_returns(
        autojump_clock: object) -> None:
    """a, b, c primaries and d a backup: a is root; a crashes and b is root at a newer
    epoch once c votes for it; a back, it is the most senior again and takes over at a
    newer one still; an announcement under an older epoch is refused."""
    async with open_universe("u") as universe:
        nodes = {s.id: ClusterNode(universe.add_broker(s.id), FOUR) for s in FOUR.servers}

        def agreed(*names: str) -> tuple[str | None, int] | None:
            seen = {(nodes[n].root, nodes[n].epoch) for n in names}
            return next(iter(seen)) if len(seen) == 1 else None

        await until(lambda: (agreed("a", "b", "c", "d") or (None,))[0] == "a")
        first = nodes["a"].epoch
        nodes["a"].close()
        universe.broker("a").close("crashed")
        await until(lambda: (agreed("b", "c", "d") or (None,))[0] == "b")
        second = nodes["b"].epoch
        nodes["a"] = ClusterNode(universe.add_broker("a"), FOUR)
        await until(lambda: (agreed("a", "b", "c", "d") or (None,))[0] == "a")
        third = nodes["a"].epoch
        assert first < second < third
        assert f"root a at epoch {third}" in nodes["d"].summary()
        # b says it is root at the epoch it led to c: c follows a at a newer one
        with pytest.raises(ServiceError, match="stale epoch"):
            await nodes["b"].peers["c"].outgoing.call(  # type: ignore[union-attr]
                {"cmd": "root", "cluster": "shop", "id": "b", "checksum": FOUR.checksum,
                 "root": "b", "epoch": second}, timeout=5)
        for node in nodes.values():
            node.close()


async def test_a_root_announcement_refused_as_stale_leaves_the_link_up(
        autojump_clock: object, caplog: pytest.LogCaptureFixture) -> None:
    """Two primaries may each take over before they see each other (a at a newer epoch
    than b): a refuses b's announcement as stale, and b, told a's root by a's beats,
    follows it over the same link.  The refusal is about the epoch, not the link: b's
    link to a stays agreed (it was left down for good: b never saw a as active again,
    and went from following a to no root at each beat)."""
    async with open_universe("u") as universe:
        nodes = {s.id: ClusterNode(universe.add_broker(s.id), FOUR) for s in FOUR.servers}
        await until(lambda: all(n.root == "a" and n.linked() for n in nodes.values()))
        b = nodes["b"]
        b.root, b.epoch = "b", nodes["a"].epoch - 1  # as if b took over before it saw a
        link = b.peers["a"].outgoing
        assert link is not None
        link.say("root")
        # (the refusal, logged: b's record of it lasts only until a's next beat)
        await until(lambda: any("a refused it: stale epoch" in r.getMessage()
                                for r in caplog.records), within=5)
        await until(lambda: all(n.root == "a" and n.linked() for n in nodes.values()),
                    within=5)
        assert link.agreed and link.connects == 1  # the same link, never dialled again
        for node in nodes.values():
            node.close()


async def test_every_server_restarted_on_its_store_keeps_the_cluster_state(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    """The state is kept with the epoch and vote: every server restarted (the primaries
    first, while the backup that also held it is down) still holds the shared topic;
    the new root never takes over with an empty state."""
    async with open_universe("u") as universe:
        def start(server_id: str) -> ClusterNode:
            return ClusterNode(universe.add_broker(server_id), THREE, store=tmp_path)

        nodes = {s.id: start(s.id) for s in THREE.servers}
        await until(lambda: all(n.root == "a" for n in nodes.values()))
        await nodes["b"].change("declare", "orders")
        await until(lambda: all("orders" in n.state.topics for n in nodes.values()))
        for server_id in ("c", "a", "b"):
            nodes.pop(server_id).close()
            universe.broker(server_id).close("crashed")
        nodes = {server_id: start(server_id) for server_id in ("a", "b")}
        await until(lambda: all(n.root == "a" for n in nodes.values()))
        nodes["c"] = start("c")
        await until(lambda: nodes["c"].root == "a")
        assert all(set(n.state.topics) == {"orders"} for n in nodes.values())
        for node in nodes.values():
            node.close()


async def test_a_primary_cut_off_with_a_minority_has_no_root(autojump_clock: object) -> None:
    """c partitioned from a and b: a stays root (two of three primaries); c sees no root
    (one of three is not a majority) until the partition heals, then follows a (at the
    same epoch, or a newer one if c's ballot for itself moved the others' up)."""
    from rdvpump.testing import Faults

    async with open_universe("u") as universe:
        faults = Faults(universe, partition_timeout=1.0)
        nodes = {s.id: ClusterNode(universe.add_broker(s.id), FOUR) for s in FOUR.servers}
        await until(lambda: all(n.root == "a" for n in nodes.values()))
        epoch = nodes["a"].epoch
        faults.partition("c", ["a", "b"])
        await until(lambda: nodes["c"].root is None)
        assert (nodes["a"].root, nodes["b"].root) == ("a", "a")
        await trio.sleep(10)  # ten seconds cut off: c never takes over
        assert nodes["c"].root is None and nodes["c"].epoch == epoch
        faults.heal("c", ["a", "b"])
        await until(lambda: len({(n.root, n.epoch) for n in nodes.values()}) == 1
                    and nodes["c"].root == "a")
        assert nodes["c"].epoch >= epoch
        for node in nodes.values():
            node.close()


async def test_a_server_cut_off_from_the_root_alone_waits_for_it_without_switching(
        autojump_clock: object) -> None:
    """c cut off from the root a, but linked to b and d, which follow a and say so at
    every beat: c has no root while it cannot reach a (and neither takes a's place nor
    follows it), without following a on each beat and dropping it at once (each switch
    tells its watchers: the MQ server's relay, its registration); it follows a again
    once the cut heals."""
    from rdvpump.testing import Faults

    async with open_universe("u") as universe:
        faults = Faults(universe, partition_timeout=1.0)
        nodes = {s.id: ClusterNode(universe.add_broker(s.id), FOUR) for s in FOUR.servers}
        await until(lambda: all(n.root == "a" for n in nodes.values()))
        epoch = nodes["a"].epoch
        told: list[str | None] = []
        nodes["c"].watchers.append(lambda: told.append(nodes["c"].root))
        faults.partition("c", ["a"])
        await until(lambda: nodes["c"].root is None)
        await trio.sleep(10)  # b's and d's beats naming a, ten a second each
        assert nodes["c"].root is None and nodes["c"].epoch == epoch
        assert (nodes["a"].root, nodes["b"].root, nodes["d"].root) == ("a", "a", "a")
        switches = sum(x != y for x, y in zip(["a", *told], told, strict=False))
        assert switches == 1, told[:10]  # a to none, once (it was some 400 times)
        faults.heal("c", ["a"])
        await until(lambda: len({(n.root, n.epoch) for n in nodes.values()}) == 1
                    and nodes["c"].root == "a")
        for node in nodes.values():
            node.close()


async def test_a_root_claim_the_rule_forbids_is_refused_and_changes_nothing(
        autojump_clock: object) -> None:
    """Claims checked against the rule, not only the epoch: a fanout server announcing
    itself root at the next epoch, or sending a state, is refused (409 with the
    reason); a junior primary claiming the next epoch over its own link to a more
    senior active primary is refused by it, and to the others when the votes they heard
    leave it no majority; a root named by a peer's hello is not followed when it is no
    primary, or when this primary voted for another at that epoch.  The root stays."""
    from brokermgr import decode, encode

    cfg = config(("a", "primary"), ("b", "primary"), ("c", "primary"), ("e", "fanout"))
    async with open_universe("u") as universe:
        brokers = {s.id: universe.add_broker(s.id) for s in cfg.servers}
        nodes = {s: ClusterNode(brokers[s], cfg) for s in brokers}
        await until(lambda: all(n.root == "a" for n in nodes.values()))
        epoch = nodes["b"].epoch

        async def say(sender: str, to: str, cmd: str, **fields: Any) -> dict[str, Any]:
            queue = await brokers[sender].connect_queue(to, CLUSTER_PORT)
            await queue.send(encode({"cmd": cmd, "seq": 1, "cluster": "shop", "id": sender,
                                     "checksum": cfg.checksum, **fields}))
            reply: dict[str, Any] = decode(await queue.receive())
            await queue.aclose()
            return reply

        for cmd in ("root", "state"):
            reply = await say("e", "b", cmd, root="e", epoch=epoch + 1, version=9,
                              topics={})
            assert (reply["status"], reply["refused"]) == (409, "rule"), reply
            assert "e is a fanout server: only a primary is ever root" in reply["error"]
        reply = await say("b", "a", "root", root="b", epoch=epoch + 1)
        assert (reply["status"], reply["refused"]) == (409, "rule"), reply
        assert "a, a primary more senior than b, is active" in reply["error"]
        # the junior primary's claim of the next epoch to the others: the votes they heard
        # (a's, c's, for a at the current epoch) leave it no majority; the link is kept
        for to in ("c", "e"):
            reply = await say("b", to, "root", root="b", epoch=epoch + 1, vote="b",
                              vote_epoch=epoch + 1)
            assert (reply["status"], reply["refused"]) == (409, "votes"), reply
            assert ("of the 3 primaries did not vote for b at epoch "
                    f"{epoch + 1}, as this server last heard them") in reply["error"]
        await say("b", "e", "hello", root="b", epoch=epoch + 1)  # hearsay: not followed
        # hearsay: a hello naming a root the rule forbids is not followed
        await say("e", "b", "hello", root="e", epoch=epoch + 1)
        nodes["c"].ballot = ("a", epoch + 1)  # c voted for a at the next epoch
        await say("e", "c", "hello", root="b", epoch=epoch + 1)
        assert all((n.root, n.epoch) == ("a", epoch) for n in nodes.values())
        for node in nodes.values():
            node.close()


def test_the_state_takes_declares_and_removes() -> None:
    from mq.cluster._state import ClusterState, StateError

    state = ClusterState()
    assert state.apply("declare", "orders")
    assert not state.apply("declare", "orders")  # again: no change
    assert state.apply("declare", "orders", "audit", "eu.*")
    assert not state.apply("declare", "orders", "audit", "eu.*")
    assert state.apply("declare", "orders", "audit", None)  # a new filter is a change
    assert state.topics == {"orders": {"orders": None, "audit": None}}
    assert state.apply("remove", "orders", "audit") and not state.apply("remove", "x")
    assert state.was_removed("orders", "audit") and not state.was_removed("orders")
    snapshot = state.snapshot()
    assert ClusterState.of(3, snapshot["topics"], 2, snapshot["removed"]) == ClusterState(
        {"orders": {"orders": None}}, 3, 2, [("orders", "audit")])
    # declared again: its removal is struck out; a topic removed whole is said so
    assert state.apply("declare", "orders", "audit") and not state.was_removed(
        "orders", "audit")
    assert state.apply("remove", "orders") and state.was_removed("orders")
    assert state.apply("declare", "orders") and not state.was_removed("orders")
    for bad_removed, said in (("x", "removed must be a list"), ([["t"]], r"is not \[topic"),
                              ([["", None]], "removed: "), ([[1, None]], r"is not \[topic")):
        with pytest.raises(StateError, match=said):
            ClusterState.of(1, {}, 0, bad_removed)
    for bad, said in (([1], "topics must be an object"), ({"t": 1}, "its groups"),
                      ({"": {}}, "topic"), ({"t": {"g": 5}}, "a filter is")):
        with pytest.raises(StateError, match=said):
            ClusterState.of(1, bad)
    with pytest.raises(StateError, match="a change is one of declare, remove"):
        state.apply("drop", "orders")


async def test_the_root_holds_the_state_and_every_server_gets_it(
        autojump_clock: object) -> None:
    """Changes go through the root and reach every server; the state outlives the root
    (b, the next root, has it); a that comes back with an older state fetches the newest
    before it takes over again; d joining late gets it whole."""
    async with open_universe("u") as universe:
        nodes = {s: ClusterNode(universe.add_broker(s), FOUR) for s in ("a", "b", "c")}

        def states(*names: str) -> list[Any]:
            return [(nodes[n].state.version, nodes[n].state.topics) for n in names]

        await until(lambda: all(n.root == "a" for n in nodes.values()))
        await nodes["c"].change("declare", "orders")
        await nodes["b"].change("declare", "orders", "audit", "eu.*")
        shared = {"orders": {"orders": None, "audit": "eu.*"}}
        await until(lambda: [t for _, t in states("a", "b", "c")] == [shared] * 3)
        nodes["a"].close()
        universe.broker("a").close("crashed")
        await until(lambda: nodes["b"].root == "b" and nodes["c"].root == "b")
        await nodes["c"].change("remove", "orders", "audit")
        after = {"orders": {"orders": None}}
        await until(lambda: [t for _, t in states("b", "c")] == [after] * 2)
        newest = nodes["b"].state.version
        nodes["a"] = ClusterNode(universe.add_broker("a"), FOUR)  # its state: version 0
        led_by_b = nodes["b"].epoch
        await until(lambda: len({(n.root, n.epoch) for n in nodes.values()}) == 1
                    and nodes["a"].root == "a" and nodes["a"].epoch > led_by_b)
        assert [t for _, t in states("a", "b", "c")] == [after] * 3
        assert nodes["a"].state.version > newest
        nodes["d"] = ClusterNode(universe.add_broker("d"), FOUR)
        await until(lambda: states("d") == states("a"))
        for node in nodes.values():
            node.close()


async def test_a_change_waits_while_the_root_s_link_is_full_then_goes_through(
        autojump_clock: object) -> None:
    """The root stops reading b's link until b's side is past its high-water mark: a
    change asked of b is held (asked again each 0.1 s, not lost), and goes through once
    the root reads again; or, if it never does, is refused as not ready."""
    async with open_universe("u") as universe:
        nodes = {s: ClusterNode(universe.add_broker(s), FOUR, not_ready_wait=3.0)
                 for s in ("a", "b", "c")}
        await until(lambda: all(n.root == "a" for n in nodes.values()))
        into_root = nodes["a"].peers["b"].incoming
        link = nodes["b"].peers["a"].outgoing
        assert into_root is not None and link is not None
        into_root.pause_reading()
        await fill(link)
        version: list[int] = []

        async def change() -> None:
            version.append(await nodes["b"].change("declare", "orders"))

        with trio.fail_after(10):  # virtual seconds
            async with trio.open_nursery() as nursery:
                nursery.start_soon(change)
                await trio.sleep(1)
                assert not version and "orders" not in nodes["a"].state.topics
                into_root.resume_reading()
        assert version and "orders" in nodes["a"].state.topics
        # the root never reads again: refused after the wait, not held for ever
        into_root.pause_reading()
        await fill(link)
        with trio.fail_after(10), pytest.raises(ServiceError, match="not ready"):
            await nodes["b"].change("declare", "refunds")
        for node in nodes.values():
            node.close()


async def test_a_change_is_acknowledged_only_once_a_majority_of_the_primaries_hold_it(
        autojump_clock: object) -> None:
    """a, root, is cut off from the others before it notices: a change asked of it then
    cannot reach a majority of the primaries, and b takes over without it.  It is
    refused (503, it may or may not be kept), never acknowledged and then lost; a change
    asked of b, which b and c hold, is acknowledged and kept once a is back."""
    from rdvpump.testing import Faults

    async with open_universe("u") as universe:
        faults = Faults(universe, partition_timeout=1.0)
        nodes = {s.id: ClusterNode(universe.add_broker(s.id), FOUR, not_ready_wait=3.0)
                 for s in FOUR.servers}
        await until(lambda: all(n.root == "a" and n.linked() for n in nodes.values()))
        faults.partition("a", ["b", "c", "d"])
        outcome: list[int | ServiceError] = []

        async def change(node: ClusterNode, topic: str) -> None:
            try:
                outcome.append(await node.change("declare", topic))
            except ServiceError as exc:
                outcome.append(exc)

        with trio.fail_after(30):
            await change(nodes["a"], "cut-off")
        (refused,) = outcome
        assert isinstance(refused, ServiceError) and refused.status == 503, refused
        assert "may or may not be kept" in str(refused)
        await until(lambda: all(nodes[n].root == "b" for n in "bcd"))
        await change(nodes["c"], "kept")
        assert isinstance(outcome[-1], int)
        faults.heal("a", ["b", "c", "d"])
        await until(lambda: len({(n.root, n.epoch, n.state.mark)
                                 for n in nodes.values()}) == 1
                    and all(n.linked() for n in nodes.values()))
        for node in nodes.values():
            assert "kept" in node.state.topics and "cut-off" not in node.state.topics
            node.close()


async def test_a_primary_that_voted_in_a_newer_epoch_takes_no_older_root_s_state(
        autojump_clock: object) -> None:
    """c voted for b at a newer epoch while it still follows a: a's state (a change a
    wants a majority for) is refused, so that c never counts towards a change the root
    of the newer epoch may lack."""
    async with open_universe("u") as universe:
        nodes = {s.id: ClusterNode(universe.add_broker(s.id), FOUR) for s in FOUR.servers}
        await until(lambda: all(n.root == "a" and n.linked() for n in nodes.values()))
        a, c = nodes["a"], nodes["c"]
        c.ballot = ("b", a.epoch + 1)  # its vote, as a ballot of b's had just moved it
        link = a.peers["c"].outgoing
        assert link is not None
        with pytest.raises(ServiceError, match=f"voted for b at epoch {a.epoch + 1}"):
            await link.call({"cmd": "state", **link.said(), **a.state.snapshot()},
                            timeout=5)
        for node in nodes.values():
            node.close()


async def test_a_fetch_that_could_not_be_sent_does_not_stop_the_next(
        autojump_clock: object) -> None:
    """b does not read the root's link, so it hears of a change only from c's beats; its
    link to c is past its high-water mark when they come, so its first fetch is not sent.
    Once c reads again, the next beat's fetch goes, and b has the state."""
    async with open_universe("u") as universe:
        nodes = {s: ClusterNode(universe.add_broker(s), FOUR) for s in ("a", "b", "c")}
        await until(lambda: all(n.root == "a" for n in nodes.values()))
        from_root, into_c = nodes["b"].peers["a"].incoming, nodes["c"].peers["b"].incoming
        to_c = nodes["b"].peers["c"].outgoing
        assert from_root is not None and into_c is not None and to_c is not None
        from_root.pause_reading()
        into_c.pause_reading()
        await fill(to_c)
        await nodes["a"].change("declare", "orders")
        await until(lambda: nodes["c"].state.mark > nodes["b"].state.mark)
        await trio.sleep(5)  # beats of c's come meanwhile: b's fetches are not sent
        assert "orders" not in nodes["b"].state.topics
        into_c.resume_reading()
        await until(lambda: "orders" in nodes["b"].state.topics, within=10)
        assert nodes["b"].state == nodes["c"].state
        from_root.resume_reading()
        for node in nodes.values():
            node.close()


async def test_a_fetch_its_peer_never_answers_does_not_stop_the_next(
        autojump_clock: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """b hears from the root a's beats that a has a newer state, but its push of that
    state never reaches b, and a never answers b's fetch: its links stay up and its beats
    go on, as a process stopped while the fetch was on its way looks until its silence
    counts.  c has that state too.  b asks c once the silence timeout has passed.  (A
    fetch waited for its answer as long as the link stayed open: b never caught up, and
    with c's state newer than its own, b could not take over when a was counted out.)"""
    answer, take = ClusterNode._fetch, ClusterNode._state

    def fetch(node: ClusterNode, request: Any, call: Any) -> Any:
        return None if node.me.id == "a" else answer(node, request, call)  # None: later

    def state(node: ClusterNode, request: Any, call: Any) -> Any:
        return None if node.me.id == "b" else take(node, request, call)

    monkeypatch.setattr(ClusterNode, "_fetch", fetch)
    monkeypatch.setattr(ClusterNode, "_state", state)
    async with open_universe("u") as universe:
        nodes = {s: ClusterNode(universe.add_broker(s), FOUR) for s in ("a", "b", "c")}
        await until(lambda: all(n.root == "a" for n in nodes.values()))
        a, b, c = nodes["a"], nodes["b"], nodes["c"]
        await a.change("declare", "orders")  # c's confirmation is the majority's
        asked = trio.current_time()
        await until(lambda: "orders" in b.state.topics, within=10)  # fetched from c
        assert b.state == c.state
        assert trio.current_time() - asked > FOUR.silence  # a was asked first, and waited for
        for node in nodes.values():
            node.close()


async def test_a_change_with_no_root_waits_then_says_the_cluster_is_not_ready(
        autojump_clock: object) -> None:
    async with open_universe("u") as universe:
        alone = ClusterNode(universe.add_broker("a"), FOUR, not_ready_wait=3.0)
        started = trio.current_time()
        with pytest.raises(ServiceError) as exc:
            await alone.change("declare", "orders")
        assert exc.value.status == 503 and trio.current_time() - started == pytest.approx(3)
        assert str(exc.value) == "cluster shop not ready: no root within 3 s (status 503)"
        alone.close()


async def test_a_state_that_leaves_a_shared_topic_out_deletes_nothing(
        tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture,
        autojump_clock: object) -> None:
    """The forged state that once deleted acknowledged data on every server: a state
    without a shared topic (or a group of it), and with no removal of it, keeps the
    topic and its messages on the server, logged once; a state that says it was removed
    (the root's, after an explicit removal) removes it."""
    from brokermgr.tracking import TrackNode
    from mq import MqClient, MqServer, declare_on
    from mq.cluster._state import ClusterState

    async with open_universe("u") as universe:
        server = MqServer(TrackNode(universe.add_broker("b"), role="server"),
                          tmp_path / "b", fsync_thread=False)
        take = declare_on(server)
        shared = ClusterState({"orders": {"orders": None, "audit": None}}, 1, 1)
        take(ClusterState(), shared)
        client = MqClient(universe.add_broker("app"), "b:15555", timeout=30)
        await client.publish_many("orders", [b"m1", b"m2"])  # acknowledged

        def held() -> dict[str, Any]:
            return dict(server.handle_local({"cmd": "query"})["topics"])

        silent = ClusterState({}, 2, 1)
        with caplog.at_level(logging.WARNING, logger="rdvpump.mq"):
            take(shared, silent)
            take(shared, silent)  # said once
        assert held()["orders"]["next"] == 2 and sorted(held()["orders"]["groups"]) == [
            "audit", "orders"]
        kept = [r.getMessage() for r in caplog.records
                if "without a removal" in r.getMessage()]
        assert len(kept) == 1 and "shared topic orders" in kept[0], kept
        take(shared, ClusterState({"orders": {"orders": None}}, 2, 1))  # a group left out
        assert sorted(held()["orders"]["groups"]) == ["audit", "orders"]
        removed = ClusterState({"orders": {"orders": None}}, 3, 1, [("orders", "audit")])
        take(shared, removed)
        assert sorted(held()["orders"]["groups"]) == ["orders"]
        take(removed, ClusterState({}, 4, 1, [("orders", "audit"), ("orders", None)]))
        assert "orders" not in held()
        client.close()
        server.close()


async def test_each_server_declares_the_shared_topics_in_its_mq_server(
        tmp_path: pathlib.Path, autojump_clock: object,
        caplog: pytest.LogCaptureFixture) -> None:
    """A shared topic declared through c reaches every server's MQ server, a group of it
    too; a removal removes it everywhere; a private topic stays on its server."""
    from brokermgr.tracking import TrackNode
    from mq import MqClient, MqServer, declare_on

    timing: dict[str, Any] = {"report_interval": 5.0, "expiry": 12.0, "scan_interval": 2.0,
                              "retry": 0.5}
    async with open_universe("u") as universe:
        servers, nodes = {}, {}
        for s in FOUR.servers:
            broker = universe.add_broker(s.id)
            servers[s.id] = MqServer(TrackNode(broker, role="server", **timing),
                                     tmp_path / s.id, fsync_thread=False)
            nodes[s.id] = ClusterNode(broker, FOUR, on_state=declare_on(servers[s.id]))
        await until(lambda: all(n.root == "a" for n in nodes.values()))
        servers["b"].handle_local({"cmd": "declare", "topic": "private"})
        await nodes["c"].change("declare", "orders")
        await nodes["d"].change("declare", "orders", "audit", "eu.*")

        def groups(server: MqServer, topic: str) -> list[str]:
            topics = server.handle_local({"cmd": "query"})["topics"]
            return sorted(topics[topic]["groups"]) if topic in topics else []

        await until(lambda: all(groups(s, "orders") == ["audit", "orders"]
                                for s in servers.values()))
        with caplog.at_level(logging.WARNING, logger="rdvpump.mq.cluster"):
            await nodes["b"].change("remove", "orders", "audit")
            await until(lambda: all(groups(s, "orders") == ["orders"]
                                    for s in servers.values()))
            await nodes["a"].change("remove", "orders")
            await until(lambda: all(groups(s, "orders") == [] for s in servers.values()))
        # a removal, the one change that deletes messages, is on the record at the root
        removals = [r.getMessage() for r in caplog.records if " removes shared " in
                    r.getMessage()]
        assert removals == [
            "cluster shop: a removes shared group audit of orders at state v4 (asked "
            "through b): its messages go on every server",
            "cluster shop: a removes shared orders at state v5 (asked through a): its "
            "messages go on every server"], removals
        assert [bool(groups(s, "private")) for s in servers.values()] == [
            False, True, False, False]
        # a client declares a shared topic on any server: answered once the root has it,
        # declared there at once and on every other server as the state reaches it
        for s_id, server in servers.items():
            server.join_cluster(nodes[s_id])
        client = MqClient(universe.add_broker("app"), "c:15555", timeout=30)
        reply = await client.declare("events", group="audit", shared=True)
        assert (reply["shared"], reply["group"]) == (True, "audit") and reply["version"] > 0
        assert groups(servers["c"], "events") == ["audit", "events"]
        await until(lambda: all(groups(s, "events") == ["audit", "events"]
                                for s in servers.values()))
        with pytest.raises(ServiceError, match="a shared topic takes no flags"):
            await client.declare("x", flags=["memory"], shared=True)
        loner = MqServer(TrackNode(universe.add_broker("z"), role="server", **timing), None)
        alone = MqClient(universe.add_broker("app2"), "z:15555", timeout=30)
        with pytest.raises(ServiceError, match="z:15555 is in no cluster"):
            await alone.declare("x", shared=True)
        client.close()
        alone.close()
        loner.close()
        for node in nodes.values():
            node.close()
        for server in servers.values():
            server.close()


def test_a_relay_asks_its_root_for_no_window_the_root_refuses() -> None:
    """A root takes consumes of at most MAX_WINDOW messages: a relay made to ask for more
    is refused when it is made (it would be refused by its root each second, its
    clients waiting for ever), and the default asks for what a root takes."""
    from mq.cluster._relay import RELAY_WINDOW, Relay
    from mq.topics._requests import MAX_WINDOW
    from pump import ConfigError

    assert 1 <= RELAY_WINDOW <= MAX_WINDOW
    for window in (0, MAX_WINDOW + 1):
        with pytest.raises(ConfigError, match=f"a relay's window is 1 to {MAX_WINDOW} "):
            Relay(None, None, window=window)  # type: ignore[arg-type]
