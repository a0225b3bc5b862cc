"""Forged and malformed member messages at a cluster of MQ servers while a producer
publishes (Hypothesis draws them): from a fanout server, a backup, a broker of no
cluster, or a junior primary to the senior one; claims of the next epochs, states that
leave the shared topic out or say it was removed, epochs at and past the bound, fields
of the wrong type.  Whatever is sent: the root keeps every message it acknowledged, no
epoch passes the bound, and every server still answers.  (A broker that speaks as the
root itself is what member credentials are for; it is not drawn here.)"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from brokermgr import MAX_EPOCH, decode, encode, open_universe
from brokermgr.tracking import TrackNode
from mq import MqClient, MqServer, declare_on
from mq.cluster._file import parse_cluster
from mq.cluster._node import CLUSTER_PORT, ClusterNode
from rdvpump.testing import run_simulation

pytestmark = pytest.mark.slow

CONFIG = parse_cluster({"cluster": {"name": "shop"}, "server": [
    {"id": i, "address": "127.0.0.1:1", "type": t}
    for i, t in (("a", "primary"), ("b", "primary"), ("c", "backup"), ("e", "fanout"))]})
#: Acknowledged messages of the shared topic before the forged ones come.
STORED = 20


def forged() -> st.SearchStrategy[dict[str, Any]]:
    """One member message as a liar would send it: as the junior primary, the backup,
    the fanout server or a broker of no cluster, to any server.  (Speaking as the root
    is not drawn: a server cannot tell it from the root's own messages; member
    credentials keep anyone else from doing so.)"""
    epoch = st.sampled_from(["E", "E+1", "E+7", MAX_EPOCH - 1, MAX_EPOCH, 2**63 - 1, -1, 0,
                             "1"])
    return st.fixed_dictionaries({
        "sender": st.sampled_from(["b", "c", "e", "x"]),
        "to": st.sampled_from(["a", "b", "c", "e"]),
        "cmd": st.sampled_from(["root", "state", "hello", "beat", "change", "fetch"]),
        "root": st.sampled_from([None, "a", "b", "c", "e", "x", 5]),
        "epoch": epoch, "vote_epoch": epoch, "state_epoch": epoch,
        "vote": st.sampled_from([None, "b", "e"]),
        "version": st.sampled_from([0, 1, 50, 2**63 - 1, -3]),
        "topics": st.sampled_from([{}, {"orders": {"orders": None}},
                                   {"other": {"other": None}}, 5, None]),
        "removed": st.sampled_from([None, [], [["orders", None]], [["orders", "orders"]],
                                    "x"]),
        "change": st.sampled_from([None, ["remove", "orders", None, None],
                                   ["declare", "other", None, None]]),
    })


async def run(messages: list[dict[str, Any]], directory: Path) -> None:
    async with open_universe("u") as universe:
        brokers = {s.id: universe.add_broker(s.id) for s in CONFIG.servers}
        liar = universe.add_broker("x")
        servers, nodes = {}, {}
        for s in CONFIG.servers:
            servers[s.id] = MqServer(TrackNode(brokers[s.id], role="server"),
                                     directory / s.id, fsync_thread=False)
            nodes[s.id] = ClusterNode(brokers[s.id], CONFIG, on_state=declare_on(servers[s.id]))
            servers[s.id].join_cluster(nodes[s.id])
        with trio.fail_after(60):
            while not all(n.root == "a" for n in nodes.values()):
                await trio.sleep(0.05)
        producer = MqClient(universe.add_broker("app"), "e:15555", timeout=30)
        await producer.declare("orders", shared=True)
        acknowledged = [b"m%d" % i for i in range(STORED)]
        await producer.publish_many("orders", acknowledged)
        epoch = nodes["a"].epoch
        # a consumer on the backup receives throughout, and acknowledges
        consumer = MqClient(universe.add_broker("reader"), "c:15555", timeout=30)
        received: set[bytes] = set()
        subscription = await consumer.subscribe("orders", window=100)

        async def consume() -> None:
            async for message in subscription:
                received.add(bytes(message.body))
                await message.ack()

        def value(v: Any) -> Any:
            return {"E": epoch, "E+1": epoch + 1, "E+7": epoch + 7}.get(v, v) \
                if isinstance(v, str) else v

        async with trio.open_nursery() as nursery:
            nursery.start_soon(consume)
            for i, m in enumerate(messages):
                # a producer goes on between the forged messages, each publish acknowledged
                await producer.publish("orders", b"f%d" % i)
                acknowledged.append(b"f%d" % i)
                sender = liar if m["sender"] == "x" else brokers[m["sender"]]
                fields = {k: value(v) for k, v in m.items() if k not in ("sender", "to")
                          and v is not None}
                try:
                    queue = await sender.connect_queue(m["to"], CLUSTER_PORT)
                except ConnectionRefusedError:
                    continue
                await queue.send(encode({**fields, "cluster": "shop", "id": m["sender"],
                                         "checksum": CONFIG.checksum, "seq": 1}))
                with trio.move_on_after(5):
                    decode(await queue.receive())  # an answer, whatever it says
                await queue.aclose()
            with trio.fail_after(60):  # the cluster settles again
                while True:
                    await trio.sleep(1)
                    roots = {n.root for n in nodes.values()}
                    if len(roots) == 1 and None not in roots:
                        break
            # nothing changed: a is root at its epoch, and the consumer gets every message
            # acknowledged, the forged messages' time included, and one published after
            assert all((n.root, n.epoch) == ("a", epoch) for n in nodes.values()), [
                (n.root, n.epoch) for n in nodes.values()]
            await producer.publish("orders", b"last")
            acknowledged.append(b"last")
            with trio.fail_after(60):
                while not received >= set(acknowledged):
                    await trio.sleep(0.1)
            nursery.cancel_scope.cancel()
            consumer.close()
        for s_id, node in nodes.items():
            assert 0 <= node.epoch < MAX_EPOCH and 0 <= node.ballot[1] < MAX_EPOCH, s_id
            assert "topics" in servers[s_id].handle_local({"cmd": "query"})
        producer.close()
        for s_id in nodes:
            nodes[s_id].close()
            servers[s_id].close()


#: The junior primary claims the next epoch to the backup, then to the fanout server.
JUNIOR_CLAIMS = [{"sender": "b", "to": to, "cmd": "root", "root": "b", "epoch": "E+1",
                  "vote_epoch": "E+1", "state_epoch": "E", "vote": "b", "version": 1,
                  "topics": None, "removed": None, "change": None} for to in ("c", "e")]


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(forged(), min_size=1, max_size=6), st.integers(0, 2**16))
@example(JUNIOR_CLAIMS, 0)
def test_forged_member_messages_lose_nothing_the_root_acknowledged(
        messages: list[dict[str, Any]], seed: int) -> None:
    with tempfile.TemporaryDirectory() as directory:
        run_simulation(run, messages, Path(directory), seed=seed)
