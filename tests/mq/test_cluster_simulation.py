"""A cluster under random faults, on the virtual clock, one run per seed: partitions
between any servers, crashes and restarts of any of them (the root too), changes of the
shared state asked of any server meanwhile.  Checked each run: no epoch ever has two
roots; once the faults stop, every server follows one root at one epoch and holds the
same state.  Each server keeps its epoch and ballot in a directory of its own, as on
disk, across its restarts."""

from __future__ import annotations

import contextlib
import json
import pathlib
import random
from typing import Any

import pytest
import trio

from mq import ServiceError
from mq._cluster import ClusterNode
from mq._cluster_file import parse_cluster
from rdvpump.testing import open_simulation, run_simulation

from .chaos import Chaos

pytestmark = pytest.mark.slow

CLUSTER = parse_cluster({"cluster": {"name": "sim"}, "server": [
    {"id": i, "address": f"127.0.0.1:{9901 + n}", "type": t} for n, (i, t) in enumerate(
        (("a", "primary"), ("b", "primary"), ("c", "primary"), ("d", "backup"),
         ("e", "fanout")))]})
IDS = [s.id for s in CLUSTER.servers]
SEEDS = 200


async def one_run(seed: int, store: pathlib.Path) -> dict[str, Any]:
    rng = random.Random(seed)
    claims: dict[int, set[str]] = {}  # epoch -> servers that were root in it
    nodes: dict[str, ClusterNode] = {}
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

        async def change(node: ClusterNode, topic: str) -> None:
            with contextlib.suppress(ServiceError):  # not ready, or the root went
                await node.change("declare", topic)

        async with trio.open_nursery() as nursery:  # each change ends within its wait
            for step in range(12):
                await trio.sleep(rng.uniform(0.1, 2.0))
                action = rng.choice(("partition", "heal", "crash", "restart", "change",
                                     "change"))
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
                    or next(iter(nodes.values())).root is None:
                await trio.sleep(0.5)
        final = {n.me.id: (n.root, n.epoch, dict(n.state.topics)) for n in nodes.values()}
        for node in nodes.values():
            node.close()
    return {"claims": claims, "final": final}


@pytest.mark.parametrize("first", range(0, SEEDS, 50))
def test_no_epoch_has_two_roots_and_the_cluster_settles_on_one_state(
        first: int, tmp_path: pathlib.Path) -> None:
    for seed in range(first, first + 50):
        store = tmp_path / str(seed)
        store.mkdir()
        run = run_simulation(one_run, seed, store, seed=seed)
        twice = {epoch: roots for epoch, roots in run["claims"].items() if len(roots) > 1}
        assert not twice, (seed, twice)
        states = {json.dumps([root, epoch, topics], sort_keys=True)
                  for root, epoch, topics in run["final"].values()}
        assert len(states) == 1, (seed, run["final"])
