"""Messages through a cluster, on the virtual clock: a shared topic's messages published
on any server are stored in the root's queue and reach the consumers of every server,
each server subscribed once per group at the root; when the root crashes, another takes
over, the consumers keep receiving, and what the old root held is sent to the new one
when it is back."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest
import trio

from brokermgr import BrokerManager, ServiceError, Status, open_universe
from brokermgr.tracking import TrackNode
from mq import Message, MqClient, MqServer, Subscription, declare_on
from mq.cluster._file import ClusterConfig
from mq.cluster._node import ClusterNode
from mq.cluster._relay import Relay
from tests.mq.test_cluster import config, until

#: Three primaries, a backup and two fanout servers.
SIX = config(("a", "primary"), ("b", "primary"), ("c", "primary"), ("d", "backup"),
             ("e", "fanout"), ("f", "fanout"))
TIMING: dict[str, Any] = {"report_interval": 5.0, "expiry": 12.0, "scan_interval": 2.0,
                          "retry": 0.5}


class Cluster:
    """The servers of ``config`` in one universe, each an MQ server on its directory."""

    def __init__(self, universe: BrokerManager, config: ClusterConfig, root: pathlib.Path
                 ) -> None:
        self.universe, self.config, self.root = universe, config, root
        self.servers: dict[str, MqServer] = {}
        self.nodes: dict[str, ClusterNode] = {}
        for server in config.servers:
            self.start(server.id)

    def start(self, server_id: str) -> None:
        broker = self.universe.add_broker(server_id)
        server = MqServer(TrackNode(broker, role="server", **TIMING), self.root / server_id,
                          fsync_thread=False)
        node = ClusterNode(broker, self.config, on_state=declare_on(server),
                           store=self.root / server_id)
        server.join_cluster(node)
        self.servers[server_id], self.nodes[server_id] = server, node

    def crash(self, server_id: str) -> None:
        self.nodes.pop(server_id).close()
        self.servers.pop(server_id).close()
        self.universe.broker(server_id).close("crashed")

    def roots(self) -> set[str | None]:
        return {node.root for node in self.nodes.values()}

    def close(self) -> None:
        for node in self.nodes.values():
            node.close()
        for server in self.servers.values():
            server.close()


async def with_orders(universe: BrokerManager, root: pathlib.Path, client: str
                      ) -> tuple[Cluster, MqClient]:
    """:data:`SIX` with root a, and shared topic ``orders`` declared on every server by
    a client on d (named ``client``), which is returned with the cluster."""
    cluster = Cluster(universe, SIX, root)
    await until(lambda: cluster.roots() == {"a"})
    on_d = MqClient(universe.add_broker(client), "d:15555", timeout=30)
    await on_d.declare("orders", shared=True)
    await until(lambda: all("orders" in s.catalogue.topics for s in cluster.servers.values()))
    return cluster, on_d


async def relay_on_e(cluster: Cluster, groups: int) -> Relay:
    """Server e's relay, once it serves ``groups`` groups, each subscribed at the root."""
    relay = cluster.servers["e"].relay
    assert relay is not None
    await until(lambda: all(g.subscribed for g in relay.groups.values())
                and len(relay.groups) == groups)
    return relay


async def _published_to_one_on_e(universe: BrokerManager, tmp_path: pathlib.Path, *,
                                  window: int, count: int
                                  ) -> tuple[Cluster, MqClient, MqClient, Subscription, Relay,
                                             list[bytes]]:
    """A consumer on e of ``orders`` with ``window``, and ``count`` messages published
    to it in one batch: the cluster, the producer, the consumer's client and
    subscription, e's relay and what was sent."""
    cluster, producer = await with_orders(universe, tmp_path, "p")
    client = MqClient(universe.add_broker("c1"), "e:15555", timeout=30)
    subscription = await client.subscribe("orders", window=window)
    relay = await relay_on_e(cluster, 1)
    sent = [b"m%03d" % i for i in range(count)]
    await producer.publish_many("orders", sent)
    return cluster, producer, client, subscription, relay, sent


async def take(subscription: Subscription, into: list[bytes]) -> None:
    """Consume and acknowledge every message, keeping its body (until cancelled)."""
    async for message in subscription:
        into.append(message.body)
        await message.ack()


async def test_a_shared_topic_s_messages_go_through_the_root_to_every_server_s_consumers(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    async with open_universe("u") as universe, trio.open_nursery() as nursery:
        cluster = Cluster(universe, SIX, tmp_path)
        await until(lambda: cluster.roots() == {"a"})
        admin = MqClient(universe.add_broker("admin"), "e:15555", timeout=30)
        await admin.declare("orders", shared=True)
        await admin.declare("orders", group="audit", shared=True)
        await until(lambda: all("audit" in s.catalogue.topics["orders"].topic.groups
                                for s in cluster.servers.values() if "orders" in
                                s.catalogue.topics) and all(
            "orders" in s.catalogue.topics for s in cluster.servers.values()))
        got: dict[str, list[bytes]] = {"orders": [], "audit": []}
        clients = {}
        # c5 is given a list of servers: it consumes on the first that answers
        for name, servers, group in (("c1", "e", "orders"), ("c2", "e", "orders"),
                                     ("c3", "b", "orders"), ("c4", "f", "audit"),
                                     ("c5", "nobody,f", "orders")):
            clients[name] = MqClient(universe.add_broker(name),
                                     [f"{s}:15555" for s in servers.split(",")], timeout=30)
            subscription = await clients[name].subscribe("orders", group=group, window=8)
            nursery.start_soon(take, subscription, got[group])
        assert clients["c5"].server.address == "f:15555"
        producer = MqClient(universe.add_broker("p"), "d:15555", timeout=30)
        sent = [b"m%03d" % i for i in range(100)]
        stored = [await producer.publish("orders", body) for body in sent]
        # stored at the root, in its queue's order, whichever server took them
        assert {s.server for s in stored} == {"a:15555"}
        assert [s.offset for s in stored] == list(range(100))
        await until(lambda: len(got["orders"]) >= 100 and len(got["audit"]) >= 100)
        assert sorted(got["orders"]) == sent and sorted(got["audit"]) == sent
        # the root serves each group once per server that consumes it, not per consumer
        groups = cluster.servers["a"].catalogue.topics["orders"].topic.groups
        assert (len(groups["orders"].consumers), len(groups["audit"].consumers)) == (3, 1)
        assert cluster.servers["a"].counts["delivered"] == 200
        relay = cluster.servers["e"].relay
        assert relay is not None and relay.counts["relayed"] > 0
        # a query on e says the queue is the root's and what e's consumers hold
        shown = (await admin.query("orders"))["orders"]
        assert (shown["shared"], shown["root"]) == (True, "a")
        assert (shown["groups"]["orders"]["consumers"],
                shown["groups"]["orders"]["status"]) == (2, "served from root a")
        # nothing is stored anywhere else
        for server_id in "bcdef":
            assert cluster.servers[server_id].catalogue.topics["orders"].topic.log.next_offset == 0

        # the root crashes: b takes over; the consumers keep receiving, the producer's
        # publishes wait for the new root and are stored there (the audit group has no
        # consumer meanwhile: what b stores stays in b's queue for it)
        await clients.pop("c4").aclose()
        cluster.crash("a")
        await until(lambda: cluster.roots() == {"b"})
        more = [b"n%03d" % i for i in range(100)]
        stored = [await producer.publish("orders", body) for body in more]
        assert {s.server for s in stored} == {"b:15555"}
        await until(lambda: set(more) <= set(got["orders"]))
        assert cluster.servers["b"].catalogue.topics["orders"].topic.lag("audit") == 100

        # a comes back, the most senior primary: root again; b sends it what it stored
        # meanwhile, so none of it is stranded in b's queue
        cluster.start("a")
        await until(lambda: cluster.roots() == {"a"})
        await until(lambda: cluster.servers["b"].catalogue.topics["orders"].topic.lag(
            "audit") == 0)
        drained = cluster.servers["b"].relay
        assert drained is not None and drained.counts["drained"] == 100
        clients["c4"] = MqClient(universe.add_broker("c4b"), "f:15555", timeout=30)
        nursery.start_soon(take, await clients["c4"].subscribe("orders", group="audit"),
                           got["audit"])
        last = [b"o%03d" % i for i in range(20)]
        for body in last:
            await producer.publish("orders", body)
        await until(lambda: set(last) <= set(got["orders"]) and set(last) <= set(got["audit"]))
        assert set(got["orders"]) == set(got["audit"]) == set(sent + more + last)
        nursery.cancel_scope.cancel()
        for client in (admin, producer, *clients.values()):
            client.close()
        cluster.close()


async def test_a_server_that_stops_redirects_its_clients_to_the_root(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    """A consumer given only fanout server f: f stops (cleanly) and tells its clients
    where to go, the root; the consumer goes there and receives what is published next."""
    async with open_universe("u") as universe, trio.open_nursery() as nursery:
        cluster, producer = await with_orders(universe, tmp_path, "p")
        consumer = MqClient(universe.add_broker("cons"), "f:15555", timeout=30)
        got: list[bytes] = []
        nursery.start_soon(take, await consumer.subscribe("orders"), got)
        await producer.publish("orders", b"before")
        await until(lambda: got == [b"before"])
        cluster.servers.pop("f").close()  # stops: says where to go, then its links close
        cluster.nodes.pop("f").close()
        await universe.broker("f").aclose("stopped")  # as broker run stops
        await producer.publish("orders", b"after")
        await until(lambda: b"after" in got)
        assert consumer.server.address == "a:15555"
        # a redirect that names no server is ignored (and logged)
        consumer.link.pushed({"cmd": "redirect", "server": "no port"})
        assert consumer.link.redirected is None
        nursery.cancel_scope.cancel()
        producer.close()
        consumer.close()
        cluster.close()


async def test_a_no_local_consumer_skips_its_own_messages_through_the_cluster(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    """A client publishing on e and consuming on e with no_local, another publishing on
    d: the first receives every message of the second and none of its own (its own
    acknowledged, so the group moves past them)."""
    async with open_universe("u") as universe, trio.open_nursery() as nursery:
        cluster, other = await with_orders(universe, tmp_path, "other")
        me = MqClient(universe.add_broker("me"), "e:15555", timeout=30)
        got: list[bytes] = []
        nursery.start_soon(take, await me.subscribe("orders", no_local=True), got)
        for i in range(20):
            await me.publish("orders", b"mine %d" % i)
            await other.publish("orders", b"theirs %d" % i)
        await until(lambda: len(got) == 20)
        assert sorted(got) == sorted(b"theirs %d" % i for i in range(20))
        await until(lambda: cluster.servers["a"].catalogue.topics["orders"].topic.lag(
            "orders") == 0)
        nursery.cancel_scope.cancel()
        for client in (me, other):
            client.close()
        cluster.close()


async def test_an_immediate_message_no_consumer_takes_is_returned_to_its_producer(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    """A producer on fanout server e publishes ``immediate``: with no consumer anywhere
    the root returns it (410, through e, to the producer) and stores nothing; once a
    consumer on f consumes the shared topic, the same publish is stored and reaches it;
    a group whose filter leaves the message out does not take it."""
    async with open_universe("u") as universe, trio.open_nursery() as nursery:
        cluster, on_d = await with_orders(universe, tmp_path, "admin")
        producer = MqClient(universe.add_broker("producer"), "e:15555", timeout=30)
        root_topic = cluster.servers["a"].catalogue.topics["orders"].topic
        with pytest.raises(ServiceError) as returned:
            await producer.publish_many("orders", [b"1", b"2"], immediate=True)
        assert returned.value.status == Status.GONE
        assert returned.value.detail["returned"] == 2
        assert "returned: no consumer of topic 'orders' on a:15555" in returned.value.reason
        assert root_topic.log.next_offset == 0 and cluster.servers["a"].counts["returned"] == 2
        await producer.publish("orders", b"kept")  # not immediate: stored for later
        assert root_topic.log.next_offset == 1

        await on_d.declare("orders", shared=True, group="blue", filter="blue")
        consumer = MqClient(universe.add_broker("consumer"), "f:15555", timeout=30)
        nursery.start_soon(take, await consumer.subscribe("orders", group="blue"), [])
        await until(lambda: root_topic.groups["blue"].consumers != [])
        with pytest.raises(ServiceError):  # blue's filter does not take untagged ones
            await producer.publish("orders", b"untagged", immediate=True)

        got: list[bytes] = []
        nursery.start_soon(take, await consumer.subscribe("orders"), got)
        await until(lambda: root_topic.groups["orders"].consumers != [])
        stored = await producer.publish("orders", b"now", immediate=True)
        assert stored.offset == 1
        await until(lambda: got == [b"kept", b"now"])
        nursery.cancel_scope.cancel()
        for client in (producer, consumer, on_d):
            client.close()
        cluster.close()


async def test_the_root_sends_a_message_once_to_a_server_for_all_its_groups(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    """Four groups consumed on fanout server e: each message reaches every group there,
    and the root's link to e carries one frame per dispatch for the four (a server's
    share of the root's sending does not grow with its groups)."""
    async with open_universe("u") as universe, trio.open_nursery() as nursery:
        cluster, producer = await with_orders(universe, tmp_path, "p")
        groups = ["g0", "g1", "g2", "g3"]
        for group in groups:
            await producer.declare("orders", group=group, shared=True)
        got: dict[str, list[bytes]] = {group: [] for group in groups}
        for group in groups:
            client = MqClient(universe.add_broker(f"c-{group}"), "e:15555", timeout=30)
            nursery.start_soon(take, await client.subscribe("orders", group=group), got[group])
        relay = await relay_on_e(cluster, 4)
        upstream = relay.upstream
        assert upstream is not None and upstream.queue is not None
        before = upstream.queue.statistics().messages_received
        sent = [b"m%03d" % i for i in range(50)]
        for body in sent:
            await producer.publish("orders", body)
        await until(lambda: all(len(got[group]) == 50 for group in groups))
        assert all(sorted(got[group]) == sent for group in groups)
        # 200 deliveries to e's groups, in at most one frame per published message
        assert upstream.queue.statistics().messages_received - before <= 50
        nursery.cancel_scope.cancel()
        producer.close()
        cluster.close()


async def test_what_a_leaving_consumer_held_of_a_whole_frame_goes_to_the_group_s_other(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    """A frame from the root that a consumer on e takes whole goes on to it as it came;
    when that consumer leaves without acknowledging, each message it held goes to the
    group's other consumer on e, once, counted as a second delivery."""
    async with open_universe("u") as universe, trio.open_nursery() as nursery:
        cluster, producer, first, holding, relay, sent = await _published_to_one_on_e(
            universe, tmp_path, window=100, count=20)
        held: list[Message] = []
        while len(held) < 20:  # the whole batch, none acknowledged
            held += await holding.receive_many()
        assert [m.body for m in held] == sent and {m.deliveries for m in held} == {1}
        (local,) = relay.groups[("orders", "orders")].consumers
        assert len({id(frame) for frame in local.held.values()}) == 1  # passed on whole
        second = MqClient(universe.add_broker("c2"), "e:15555", timeout=30)
        other = await second.subscribe("orders", window=100)
        await holding.close()
        again: list[Message] = []
        while len(again) < 20:
            again += await other.receive_many()
        assert [m.body for m in again] == sent
        assert [m.offset for m in again] == [m.offset for m in held]
        assert {m.deliveries for m in again} == {2}
        await other.ack([m.offset for m in again])
        with trio.move_on_after(5):  # nothing more comes: each message went once
            extra = await other.receive_many()
            raise AssertionError(f"delivered again: {extra}")
        nursery.cancel_scope.cancel()
        for client in (producer, first, second):
            client.close()
        cluster.close()


async def test_a_relaying_server_takes_an_ack_of_first_and_count_for_what_is_held(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    """An ack naming a first offset and a count, past what the consumer on e holds: the
    held ones are taken and passed on to the root (which then holds none of them in
    flight), the rest refused by number; the same ack again is refused whole."""
    async with open_universe("u") as universe:
        cluster, producer = await with_orders(universe, tmp_path, "p")
        client = MqClient(universe.add_broker("c1"), "e:15555", timeout=30)
        subscription = await client.subscribe("orders", window=100)
        await relay_on_e(cluster, 1)
        await producer.publish_many("orders", [b"m%02d" % i for i in range(20)])
        held: list[Message] = []
        while len(held) < 20:
            held += await subscription.receive_many()
        first = held[0].offset
        assert [m.offset for m in held] == list(range(first, first + 20))
        root_group = cluster.servers["a"].catalogue.topics["orders"].topic.group("orders")
        assert len(root_group.in_flight) == 20
        ack = {"cmd": "ack", "topic": "orders", "offsets": first, "count": 25}
        with pytest.raises(ServiceError, match=rf"5 offsets of orders/orders are not held by "
                                               rf"this consumer: {first + 20}, .*; 20 "
                                               rf"acknowledged") as info:
            await client.request(ack)
        assert info.value.status == Status.CONFLICT
        await until(lambda: not root_group.in_flight)  # the 20, as one range, at the root
        with pytest.raises(ServiceError, match=r"25 offsets .*; 0 acknowledged"):
            await client.request(ack)
        for c in (producer, client):
            c.close()
        cluster.close()


async def test_a_root_s_error_to_a_relaying_server_is_logged_with_its_text(
        tmp_path: pathlib.Path, autojump_clock: object,
        caplog: pytest.LogCaptureFixture) -> None:
    """An ack the root does not hold (redelivered after its ack timeout, say): the root
    says why in the error envelope's ``error``, and the relaying server logs that text."""
    import logging

    caplog.set_level(logging.INFO, logger="rdvpump.mq.cluster")
    async with open_universe("u") as universe, trio.open_nursery() as nursery:
        cluster, producer = await with_orders(universe, tmp_path, "p")
        client = MqClient(universe.add_broker("c-e"), "e:15555", timeout=30)
        nursery.start_soon(take, await client.subscribe("orders"), [])
        relay = await relay_on_e(cluster, 1)
        upstream = relay.upstream
        assert upstream is not None
        upstream.send({"cmd": "ack", "topic": "orders", "group": "orders", "offsets": [999]})
        await until(lambda: any("root a:" in r.getMessage() and "999" in r.getMessage()
                                for r in caplog.records))
        nursery.cancel_scope.cancel()
        client.close()
        producer.close()
        cluster.close()


async def _behind(universe: BrokerManager, tmp_path: pathlib.Path, nursery: trio.Nursery
                  ) -> tuple[Cluster, MqClient, Relay, Subscription, list[bytes], list[bytes]]:
    """Groups ``fast`` and ``slow`` consumed on e, each holding at most 40 there: 200
    messages published, every one taken by ``fast``'s consumer, the first 40 held by
    ``slow``'s, not acknowledged.  The cluster, the producer, e's relay, ``slow``'s
    subscription, what was sent and what ``fast`` got."""
    cluster, producer = await with_orders(universe, tmp_path, "p")
    for group in ("fast", "slow"):
        await producer.declare("orders", group=group, shared=True)
    relay = cluster.servers["e"].relay
    assert relay is not None
    relay.window = 40  # what each group may hold at e, not acknowledged by its consumer
    got_fast: list[bytes] = []
    fast = MqClient(universe.add_broker("c-fast"), "e:15555", timeout=30)
    nursery.start_soon(take, await fast.subscribe("orders", group="fast"), got_fast)
    slow = MqClient(universe.add_broker("c-slow"), "e:15555", timeout=30)
    holding = await slow.subscribe("orders", group="slow", window=1000)
    await relay_on_e(cluster, 2)
    sent = [b"%04d" % i + b"x" * 996 for i in range(200)]
    await producer.publish_many("orders", sent)
    await until(lambda: len(got_fast) == 200)
    return cluster, producer, relay, holding, sent, got_fast


async def _all_of(holding: Subscription, count: int) -> list[Message]:
    """``count`` messages of ``holding``, each batch acknowledged as it comes."""
    got: list[Message] = []
    while len(got) < count:
        batch = await holding.receive_many()
        got += batch
        await holding.ack([m.offset for m in batch])
    return got


async def test_a_group_behind_is_sent_by_name_what_the_root_sent_its_server_before(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    """Of two groups on e, one waits for its consumer while the other is handed every
    message: when it goes on, the root names the messages it sent e before (``cached``)
    instead of sending their bodies again, and e takes them from what it kept.  Each
    group gets every message once, in order, as a first delivery; the root's link to e
    carried each body about once, not once for each group."""
    async with open_universe("u") as universe, trio.open_nursery() as nursery:
        cluster, producer, relay, holding, sent, got_fast = await _behind(
            universe, tmp_path, nursery)
        upstream = relay.upstream
        assert upstream is not None and upstream.queue is not None
        before = upstream.queue.statistics().bytes_received
        got_slow = await _all_of(holding, 200)
        assert got_fast == sent
        assert [m.body for m in got_slow] == sent
        assert {m.deliveries for m in got_slow} == {1}
        assert relay.counts["named"] == 160  # all but the 40 the two groups shared
        # the 160 came as a few frames of a header each
        assert upstream.queue.statistics().bytes_received - before < 2_000
        nursery.cancel_scope.cancel()
        producer.close()
        cluster.close()


async def test_a_relaying_server_keeps_what_its_root_may_name_within_one_budget(
        tmp_path: pathlib.Path, autojump_clock: object, monkeypatch: pytest.MonkeyPatch
        ) -> None:
    """Four shared topics consumed on e, each sent 60 messages of 1,000 bytes: e keeps
    what the root may name of them within the link's budget (50,000 bytes here), letting
    go of the topics sent to least recently, as the root does: each topic's consumer
    gets every message, and both ends name the same stretches."""
    from mq.topics import _stretch

    monkeypatch.setattr(_stretch, "LINK_STRETCH_BYTES", 50_000)
    topics = ["orders", "t1", "t2", "t3"]
    async with open_universe("u") as universe, trio.open_nursery() as nursery:
        cluster, producer = await with_orders(universe, tmp_path, "p")
        for topic in topics[1:]:
            await producer.declare(topic, shared=True)
        await until(lambda: all(t in s.catalogue.topics for t in topics
                                for s in cluster.servers.values()))
        got: dict[str, list[bytes]] = {topic: [] for topic in topics}
        client = MqClient(universe.add_broker("c-e"), "e:15555", timeout=30)
        for topic in topics:
            nursery.start_soon(take, await client.subscribe(topic), got[topic])
        relay = await relay_on_e(cluster, len(topics))
        upstream = relay.upstream
        assert upstream is not None
        sizes = []
        for i in range(0, 60, 10):
            for topic in topics:
                await producer.publish_many(topic, [b"%s %03d " % (topic.encode(), i + k)
                                                    + b"x" * 990 for k in range(10)])
                await until(lambda topic=topic, n=i + 10: len(got[topic]) == n)
                sizes.append(upstream.stretches.size)
        for topic in topics:
            assert got[topic] == [b"%s %03d " % (topic.encode(), n) + b"x" * 990
                                  for n in range(60)]
        # four topics of 60,000 bytes each: at most the budget, and some of each sent
        assert max(sizes) <= 50_000 and max(sizes) >= 40_000
        links = [link for link in cluster.servers["a"].links if link.named_runs]
        assert [link.sent.describe() for link in links] == [upstream.stretches.describe()]
        nursery.cancel_scope.cancel()
        client.close()
        producer.close()
        cluster.close()


async def test_a_run_named_that_the_server_does_not_hold_closes_only_the_root_s_link(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    """A ``cached`` frame naming messages e does not hold (here: e lost what it kept) is
    the root's protocol error: e closes that link with the reason, links again, and the
    root delivers the group's messages again, bodies and all; none is lost."""
    async with open_universe("u") as universe, trio.open_nursery() as nursery:
        cluster, producer, relay, holding, sent, _ = await _behind(universe, tmp_path,
                                                                   nursery)
        upstream = relay.upstream
        assert upstream is not None and upstream.queue is not None
        broken = upstream.queue
        upstream.stretches.clear()  # what the root believes e holds, e no longer does
        got_slow = await _all_of(holding, 200)
        assert "not held" in (broken.close_reason or ""), broken.close_reason
        assert upstream.queue is not broken
        assert sorted({m.body for m in got_slow}) == sent
        nursery.cancel_scope.cancel()
        producer.close()
        cluster.close()


async def test_a_frame_a_consumer_has_too_little_room_for_goes_on_in_parts(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    """A frame of 100 messages from the root for a consumer on e with room for 30: the
    consumer is passed it in parts as its acks make room, as the root framed it (e holds
    each part whole, no message taken apart), every message once, in order."""
    from mq.cluster._relay_groups import RelayedFrame

    async with open_universe("u") as universe:
        cluster, producer, client, subscription, relay, sent = await _published_to_one_on_e(
            universe, tmp_path, window=30, count=100)
        got: list[Message] = []
        while len(got) < 100:
            batch = await subscription.receive_many()
            (local,) = relay.groups[("orders", "orders")].consumers
            assert local.held and all(type(v) is RelayedFrame for v in local.held.values())
            got += batch
            await subscription.ack([m.offset for m in batch])
        assert [m.body for m in got] == sent and {m.deliveries for m in got} == {1}
        for c in (producer, client):
            c.close()
        cluster.close()


@pytest.mark.parametrize("acknowledged", [0, 99])
async def test_what_a_former_root_s_consumers_left_unhandled_is_drained_once_and_only_that(
        tmp_path: pathlib.Path, autojump_clock: object, acknowledged: int) -> None:
    """A root's consumer takes 100 messages, acknowledges the last ``acknowledged`` of
    them and leaves: the rest wait in the root's copy to be delivered again (the group's
    position held at the first).  Once another server is root, the former one sends it
    those, not the ones acknowledged, and its group moves past them all: each reaches the
    cluster's consumers, none of the acknowledged ones again, and nothing is sent again
    every second."""
    async with open_universe("u") as universe, trio.open_nursery() as nursery:
        cluster, producer = await with_orders(universe, tmp_path, "p")
        cluster.crash("a")
        await until(lambda: cluster.roots() == {"b"})
        on_b = MqClient(universe.add_broker("c1"), "b:15555", timeout=30)
        subscription = await on_b.subscribe("orders", window=500)
        sent = [b"m%03d" % i for i in range(100)]
        left = sent[:100 - acknowledged]
        await producer.publish_many("orders", sent)
        messages = await subscription.receive_many(200)
        assert len(messages) == 100
        if acknowledged:
            await subscription.ack([m.offset for m in messages[len(left):]])
        group = cluster.servers["b"].catalogue.topics["orders"].topic.group("orders")
        await until(lambda: group.in_flight_count == len(left))
        on_b.close()  # what it held waits at b to be delivered again
        copy = cluster.servers["b"].catalogue.topics["orders"].topic
        await until(lambda: copy.lag("orders") == 100 and not group.in_flight_count)

        cluster.start("a")  # the most senior primary: root again; b drains to it
        await until(lambda: cluster.roots() == {"a"})
        got: list[bytes] = []
        consumer = MqClient(universe.add_broker("c2"), "e:15555", timeout=30)
        nursery.start_soon(take, await consumer.subscribe("orders"), got)
        await until(lambda: copy.lag("orders") == 0 and sorted(got) == left)
        drained = cluster.servers["b"].relay
        assert drained is not None and drained.counts["drained"] == len(left)
        await trio.sleep(5)  # five drains later: nothing more went, nothing came again
        assert drained.counts["drained"] == len(left) and sorted(got) == left
        nursery.cancel_scope.cancel()
        for client in (producer, consumer):
            client.close()
        cluster.close()
