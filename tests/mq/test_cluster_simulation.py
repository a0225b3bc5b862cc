"""A cluster under random faults, on the virtual clock, one run per seed: partitions
between any servers, delays of every byte between two of them (up to 1.5 s, so that
their messages cross others'), crashes and restarts of any of them (the root too), a
server that joins late, another that joins with a configuration of its own, changes of
the shared state asked of any server meanwhile.  Checked each run: no epoch ever has
two roots; every change a root acknowledged is kept; once the faults stop, every server
is linked both ways to every other, follows one root at one epoch and holds the same
state, and the server with the other configuration is refused by every one of them and
never gets their state.  With a shared topic's messages too: every acknowledged
message reaches each group, and every former root sends the root what it held for them
and stops.  Each server keeps its epoch and ballot in a directory of its own (in
memory: what is checked is the protocol, not the disk) across its restarts."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import pathlib
import random
from typing import Any

import pytest
import trio

from mq import ServiceError
from mq.cluster._file import parse_cluster
from mq.cluster._node import ClusterNode
from rdvpump.testing import open_simulation, run_simulation

from .chaos import Chaos, memory_dir

pytestmark = pytest.mark.slow

SERVERS_OF = (("a", "primary"), ("b", "primary"), ("c", "primary"), ("d", "backup"),
              ("e", "fanout"), ("x", "fanout"))


def _config(servers: tuple[tuple[str, str], ...]) -> Any:
    return parse_cluster({"cluster": {"name": "sim"}, "server": [
        {"id": i, "address": f"127.0.0.1:{9901 + n}", "type": t}
        for n, (i, t) in enumerate(servers)]})


#: Six servers; x, a fanout server, only ever starts with :data:`MISMATCHED`.
CLUSTER = _config(SERVERS_OF)
IDS = [s.id for s in CLUSTER.servers if s.id != "x"]
#: The file x reads: the same servers, but x a primary (a checksum of its own).
MISMATCHED = _config((*SERVERS_OF[:-1], ("x", "primary")))
SEEDS = 200


def linked(node: ClusterNode) -> bool:
    """Whether ``node`` is linked both ways to every server but x (which never agrees)."""
    return all(row["outgoing"] == row["incoming"] == "up" for row in node.rows()
               if row["id"] != "x")


async def one_run(seed: int, store: pathlib.Path) -> dict[str, Any]:
    rng = random.Random(seed)
    claims: dict[int, set[str]] = {}  # epoch -> servers that were root in it
    nodes: dict[str, ClusterNode] = {}
    acknowledged: set[str] = set()  # the topics whose declaration a root acknowledged
    async with open_simulation("sim", seed=seed, partition_timeout=1.0) as faults:
        universe = faults.universe

        def start(broker: Any) -> None:
            def changed() -> None:
                node = nodes[broker.id]
                if node.root == node.me.id:
                    claims.setdefault(node.epoch, set()).add(node.me.id)

            nodes[broker.id] = ClusterNode(broker, CLUSTER, not_ready_wait=2.0,
                                           on_change=changed, store=store)

        for server in IDS:
            start(universe.add_broker(server))
        faults.on_crash.append(lambda b: nodes[b].close())
        faults.on_restart.append(start)
        chaos = Chaos(faults, rng, IDS)
        # a late joiner: one server is down from the start until a restart brings it
        late = rng.choice(IDS)
        faults.crash(late)
        chaos.crashed.add(late)
        stranger: ClusterNode | None = None  # joins at a random step with MISMATCHED
        stranger_at = rng.randrange(12)

        async def change(node: ClusterNode, topic: str) -> None:
            with contextlib.suppress(ServiceError):  # not ready, or the root went
                await node.change("declare", topic)
                acknowledged.add(topic)

        async with trio.open_nursery() as nursery:  # each change ends within its wait
            for step in range(12):
                await trio.sleep(rng.uniform(0.1, 2.0))
                if step == stranger_at:
                    stranger = ClusterNode(universe.add_broker("x"), MISMATCHED,
                                           not_ready_wait=2.0, store=store)
                action = rng.choice(("partition", "heal", "crash", "restart", "change",
                                     "change", "delay"))
                if action == "partition":
                    side = rng.sample(IDS, rng.randint(1, 2))
                    chaos.partition(side, [s for s in IDS if s not in side])
                elif action == "change":
                    if chaos.live:
                        nursery.start_soon(change, nodes[rng.choice(chaos.live)],
                                           f"t{step}")
                else:
                    chaos.apply(action)
        chaos.end()
        with trio.fail_after(120):  # virtual seconds: the cluster settles or fails
            while len({json.dumps([n.root, n.epoch, n.state.mark, n.state.topics],
                                  sort_keys=True) for n in nodes.values()}) != 1 \
                    or next(iter(nodes.values())).root is None \
                    or not all(linked(n) for n in nodes.values()):
                await trio.sleep(0.5)
        final = {n.me.id: (n.root, n.epoch, dict(n.state.topics)) for n in nodes.values()}
        assert stranger is not None
        # every server refuses the one with the other list, which never gets a root
        with trio.fail_after(60):
            while not all(row["refusal"] and "server list differs" in row["refusal"]
                          for row in stranger.rows()):
                await trio.sleep(0.5)
        outsider = (stranger.root, dict(stranger.state.topics))
        stranger.close()
        for node in nodes.values():
            node.close()
    return {"claims": claims, "final": final, "outsider": outsider,
            "acknowledged": acknowledged}


@pytest.mark.parametrize("first", range(0, SEEDS, 50))
def test_no_epoch_has_two_roots_and_the_cluster_settles_on_one_state(first: int) -> None:
    for seed in range(first, first + 50):
        with memory_dir("rdvpump-cluster-") as store:
            run = run_simulation(one_run, seed, store, seed=seed)
        twice = {epoch: roots for epoch, roots in run["claims"].items() if len(roots) > 1}
        assert not twice, (seed, twice)
        states = {json.dumps([root, epoch, topics], sort_keys=True)
                  for root, epoch, topics in run["final"].values()}
        assert len(states) == 1, (seed, run["final"])
        assert run["outsider"] == (None, {}), (seed, run["outsider"])
        # every change acknowledged is kept (only the topic's own group is declared)
        (_, _, topics), *_ = run["final"].values()
        assert run["acknowledged"] <= set(topics), (seed, run["acknowledged"] - set(topics))


#: Seeds of the simulation with messages the suite runs (more: RDVPUMP_CLUSTER_SEEDS).
MESSAGE_SEEDS = int(os.environ.get("RDVPUMP_CLUSTER_SEEDS", "12"))
SERVERS = [f"{s}:15555" for s in IDS]
TIMING: dict[str, Any] = {"report_interval": 5.0, "expiry": 12.0, "scan_interval": 2.0,
                          "retry": 0.5}


async def one_run_with_messages(seed: int, store: pathlib.Path) -> dict[str, Any]:
    """The same faults, with an MQ server on every server of the cluster (its topics in
    a directory of its own, kept across its restarts): a shared topic with two consume
    groups, a producer publishing throughout and a consumer of each group, each client
    given every server's address (the producer in one order, each consumer in another);
    once the faults stop, the run waits until every group had every acknowledged
    message and every server but the root had sent it what it held for the groups."""
    from brokermgr.tracking import TrackNode
    from mq import MqClient, MqServer, declare_on

    rng = random.Random(seed)
    claims: dict[int, set[str]] = {}
    nodes: dict[str, ClusterNode] = {}
    servers: dict[str, MqServer] = {}
    acked: list[bytes] = []
    got: dict[str, set[bytes]] = {"orders": set(), "audit": set()}
    consumers: dict[str, Any] = {}
    async with open_simulation("sim", seed=seed, partition_timeout=1.0) as faults:
        universe = faults.universe

        def start(broker: Any) -> None:
            def changed() -> None:
                node = nodes[broker.id]
                if node.root == node.me.id:
                    claims.setdefault(node.epoch, set()).add(node.me.id)

            server = servers[broker.id] = MqServer(
                TrackNode(broker, role="server", **TIMING), store / broker.id,
                fsync_thread=False)
            nodes[broker.id] = ClusterNode(broker, CLUSTER, not_ready_wait=2.0,
                                           on_change=changed, store=store / broker.id,
                                           on_state=declare_on(server))
            server.join_cluster(nodes[broker.id])

        def crash(broker_id: str) -> None:
            nodes[broker_id].close()
            servers[broker_id].close()

        for server in IDS:
            start(universe.add_broker(server))
        faults.on_crash.append(crash)
        faults.on_restart.append(start)
        admin = MqClient(universe.add_broker("admin"), SERVERS, timeout=5)
        with trio.fail_after(60):
            while True:
                with contextlib.suppress(ServiceError):
                    await admin.declare("orders", shared=True)
                    await admin.declare("orders", group="audit", shared=True)
                    break
        chaos = Chaos(faults, rng, IDS)
        stop = trio.Event()

        async def produce() -> None:
            client = MqClient(universe.add_broker("p"), SERVERS[::-1], timeout=5)
            for n in itertools.count():
                if stop.is_set():
                    return
                body, sequence = b"%d" % n, client.sequence
                while True:
                    try:
                        await client.publish("orders", body)
                        break
                    except ServiceError:
                        client.sequence = sequence  # a retry keeps its sequence
                        await trio.sleep(0.2)
                acked.append(body)
                await trio.sleep(0.05)

        async def consume(group: str, order: list[str]) -> None:
            broker = universe.add_broker(f"c-{group}")
            while True:  # a consume refused (no root yet, say): a new client, again
                client = consumers[group] = MqClient(broker, order, timeout=5)
                with contextlib.suppress(ServiceError, trio.EndOfChannel):
                    subscription = await client.subscribe("orders", group=group, window=16)
                    async for message in subscription:
                        got[group].add(bytes(message.body))
                        await message.ack()
                client.close()
                await trio.sleep(0.2)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(consume, "orders", SERVERS[3:] + SERVERS[:3])
            nursery.start_soon(consume, "audit", SERVERS[4:] + SERVERS[:4])
            async with trio.open_nursery() as producing:
                producing.start_soon(produce)
                for _ in range(10):
                    await trio.sleep(rng.uniform(0.1, 2.0))
                    action = rng.choice(("partition", "heal", "crash", "restart"))
                    if action == "partition":
                        side = rng.sample(IDS, rng.randint(1, 2))
                        chaos.partition(side, [s for s in IDS if s not in side])
                    else:
                        chaos.apply(action)
                chaos.end()
                stop.set()
            with trio.move_on_after(120):  # virtual seconds: it settles or fails
                while not all(set(acked) <= seen for seen in got.values()) or len(
                        {(n.root, n.epoch) for n in nodes.values()}) != 1 or undrained(
                        servers, nodes):
                    await trio.sleep(0.5)
            # what a former root held for the groups reached the root, and it stopped
            # sending it there
            assert not undrained(servers, nodes), (seed, "not drained", undrained(
                servers, nodes), {k: _diagnosis(srv) for k, srv in servers.items()})
            missing = {g: sorted(set(acked) - seen)[:5] for g, seen in got.items()}
            assert not any(missing.values()), (
                seed, "not delivered", missing, {k: (n.root, n.epoch, dict(n.state.topics))
                                                 for k, n in nodes.items()},
                {k: _diagnosis(srv) for k, srv in servers.items()},
                {g: (c.server.address, c.link.queue is not None, c.link.last_refusal,
                     {k: v.active for k, v in c.subscriptions.items()})
                 for g, c in consumers.items()})
            nursery.cancel_scope.cancel()
        for node in nodes.values():
            node.close()
        for mq_server in servers.values():
            mq_server.close()
    return {"claims": claims, "acked": len(acked),
            "relayed": sum(s.relay.counts["relayed"] for s in servers.values() if s.relay)}


#: Seeds past :data:`MESSAGE_SEEDS` the suite runs too: each once found a former root
#: that never finished sending the next what it held (its group's floor held back).
FOUND_SEEDS = (14, 22)


@pytest.mark.parametrize("seed", sorted({*range(MESSAGE_SEEDS), *FOUND_SEEDS}))
def test_every_acknowledged_message_reaches_each_group_through_faults(seed: int) -> None:
    with memory_dir("rdvpump-cluster-") as store:
        run = run_simulation(one_run_with_messages, seed, store, seed=seed)
    twice = {epoch: roots for epoch, roots in run["claims"].items() if len(roots) > 1}
    assert not twice, (seed, twice)
    assert run["acked"] > 0, run


def undrained(servers: dict[str, Any], nodes: dict[str, ClusterNode]) -> dict[str, int]:
    """The messages of the shared topic each server but the root holds that its groups
    have not handled (what it stored as root and has not sent the root yet)."""
    out = {}
    for server_id, server in servers.items():
        if nodes[server_id].root == server_id:
            continue
        state = server.catalogue.topics.get("orders")
        if state is not None and state.topic.groups:
            topic = state.topic
            left = topic.log.next_offset - min(g.floor for g in topic.groups.values())
            if left:
                out[server_id] = left
    return out


def _diagnosis(server: Any) -> dict[str, Any]:
    """Where a server's messages of the shared topic are, for a failure's message."""
    state = server.catalogue.topics.get("orders")
    out: dict[str, Any] = {}
    if state is not None:
        out["next"] = state.topic.log.next_offset
        out["groups"] = {g.name: (g.floor, len(g.in_flight), len(g.redeliver),
                                  [(c.name, c.credits) for c in g.consumers])
                         for g in state.topic.groups.values()}
    relay = server.relay
    if relay is not None and relay.upstream is not None:
        out["upstream"] = (relay.upstream.root, relay.upstream.queue is not None)
        out["relayed"] = {f"{t}/{g}": (r.subscribed, len(r.pending),
                                       [(len(c.held), c.credits) for c in r.consumers])
                          for (t, g), r in relay.groups.items()}
    return out
