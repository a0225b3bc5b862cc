"""Producers and consumers that follow tracking's route tables, on the virtual clock:
spread over servers, keys keep their server, a server that leaves, a publish retried."""

from __future__ import annotations

import pathlib
from collections import Counter
from typing import Any

import pytest
import trio

from brokermgr import open_universe
from brokermgr.tracking import RouteClient, TrackNode, by_key_hash
from mq import Consumer, MqServer, Producer, ServiceError

TIMING: dict[str, Any] = {"report_interval": 5.0, "expiry": 12.0, "scan_interval": 2.0,
                          "retry": 0.5}


async def test_producers_and_consumers_follow_the_route_table(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    with trio.fail_after(600):
        async with open_universe("mq") as universe:
            TrackNode(universe.add_broker("t1"), role="tracker", **TIMING)
            servers = {}
            for name in ("s1", "s2"):
                node = TrackNode(universe.add_broker(name), role="server",
                                 trackers=["t1:15555"], **TIMING)
                servers[name] = MqServer(node, tmp_path / name, fsync_thread=False)
                servers[name].handle_local({"cmd": "declare", "topic": "orders"})
            routes = RouteClient(universe.add_broker("app"), retry=0.5)
            routes.add_tracker("t1:15555")
            await trio.sleep(1)
            assert sorted(routes.routes.servers_of("orders")) == ["s1:15555", "s2:15555"]

            consumer = Consumer(routes, "orders", window=100)
            async with trio.open_nursery() as nursery:
                await nursery.start(consumer.run)
                await trio.sleep(1)  # consumers on both servers: both are picked
                producer = Producer(routes, "orders")
                stored = [await producer.publish(b"m%d" % i) for i in range(10)]
                assert Counter(s.server for s in stored) == {"s1:15555": 5, "s2:15555": 5}
                got: set[bytes] = set()
                while len(got) < 10:
                    message = await consumer.receive()
                    got.add(message.body)
                    await message.ack()
                assert got == {b"m%d" % i for i in range(10)}

                keyed = Producer(routes, "orders", selector=by_key_hash)
                where = {(await keyed.publish(b"k", key="cust-42")).server for _ in range(5)}
                assert len(where) == 1  # one key, one server

                # a server whose MQ server stops answering: the publish goes elsewhere
                servers["s1"].close()
                again = [await producer.publish(b"after") for _ in range(4)]
                assert {s.server for s in again} == {"s2:15555"}
                assert producer.retried >= 1  # (it may have duplicated: the docs say so)

                # a server that leaves the route table is let go
                servers["s1"].node.broker.close("gone")
                await trio.sleep(1)
                assert list(consumer.clients) == ["s2:15555"]
                consumer.close()
                producer.close()
                keyed.close()
            for server in servers.values():
                server.close()


async def test_no_server_for_the_topic_is_a_clear_error(autojump_clock: object) -> None:
    async with open_universe("mq") as universe:
        routes = RouteClient(universe.add_broker("app"))
        with pytest.raises(ServiceError, match="no server holds topic 'orders'"):
            await Producer(routes, "orders").publish(b"x")


async def test_producers_and_consumers_move_to_the_member_promoted(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    """A replicated group (``sync``): s1 master, s2 and s3 its slaves.  Consumers read
    from the master only; producers write there.  A publish is in flight when s1 dies:
    s2 and s3 had stored it, s1's answer never came (s2's acknowledgement was lost).
    The producer tries s2 (a slave: refused), waits for the route table, and once s2 is
    promoted (s3 copying it) sends the same numbers there: s2 answers with where it
    stored the message, without storing it again.  The consumer moves to s2, where the
    group's position is the one s1 sent: every message published comes, and none that
    the group had handled on s1 comes again."""
    from brokermgr import GroupMember

    with trio.fail_after(600):
        async with open_universe("mq") as universe:
            TrackNode(universe.add_broker("t1"), role="tracker", **TIMING)
            members = (("s1", "master"), ("s2", "slave"), ("s3", "slave"))
            nodes = {name: TrackNode(universe.add_broker(name), role="server",
                                     trackers=["t1:15555"],
                                     group=GroupMember("a", i, role, epoch=1), **TIMING)
                     for i, (name, role) in enumerate(members)}
            s1, s2, s3 = (MqServer(nodes[n], tmp_path / n, fsync_thread=False,
                                   replication="sync", insync_lag=60.0) for n in nodes)
            s1.confirm()
            s1.handle_local({"cmd": "declare", "topic": "orders"})
            follower = s2.follow("s1:15555", retry=0.5)
            third = s3.follow("s1:15555", retry=0.5)
            while not ("orders" in follower.followed and "orders" in third.followed):
                await follower.changed.wait()
            routes = RouteClient(universe.add_broker("app"), retry=0.5)
            routes.add_tracker("t1:15555")
            while sorted(routes.routes.servers_of("orders")) != [
                    "s1:15555", "s2:15555", "s3:15555"]:
                await routes.changed()
            consumer = Consumer(routes, "orders", window=100)
            producer = Producer(routes, "orders", failover=60.0)
            got: list[bytes] = []

            async def consume() -> None:
                async for message in consumer:
                    got.append(message.body)
                    await message.ack()

            async with trio.open_nursery() as nursery:
                await nursery.start(consumer.run)
                nursery.start_soon(consume)
                assert list(consumer.clients) == ["s1:15555"]  # not the slave
                before = [await producer.publish(b"m%d" % i) for i in range(5)]
                assert {s.server for s in before} == {"s1:15555"}
                # consumed and acknowledged on s1, whose group's position reaches s2
                groups2 = s2.catalogue.topics["orders"].topic.groups
                while groups2["orders"].floor < 5:
                    await trio.sleep(0.5)
                # s2 stores the next one, and its acknowledgement is lost (it is sent once
                # s2's commit made the copy durable): s1 holds the publish's answer (sync)
                # until it dies
                copies = follower.copies

                def store_and_lose_the_ack(link: Any, obj: dict[str, Any]) -> None:
                    send = link.send

                    def lost(message: Any, *args: Any, **kwargs: Any) -> None:
                        if message.get("cmd") != "copied":
                            send(message, *args, **kwargs)

                    link.send = lost
                    copies(link, obj)

                follower.copies = store_and_lose_the_ack  # type: ignore[method-assign]
                stored: list[Any] = []

                async def in_flight() -> None:
                    stored.append(await producer.publish(b"in flight"))

                nursery.start_soon(in_flight)
                log2 = s2.replica_logs()["orders"]
                while log2.next_offset < 6:
                    await follower.changed.wait()
                s1.close()
                nodes["s1"].broker.close("killed")
                while producer.retried < 2:  # s1 did not answer, s2 refused (a slave)
                    await trio.sleep(0.1)
                assert not stored
                s2.promote(2)  # as the name service would, its master lost
                s3.follow("s2:15555", retry=0.5)  # and s3 copies the new master
                while not stored:
                    await trio.sleep(0.5)
                assert stored[0].server == "s2:15555" and stored[0].offset == 5
                assert s2.counts["duplicates"] == 1 and log2.next_offset == 6
                after = await producer.publish(b"after")
                assert (after.server, after.offset) == ("s2:15555", 6)
                while not {b"in flight", b"after"} <= set(got):
                    await trio.sleep(0.5)
                assert list(consumer.clients) == ["s2:15555"]
                # what the group had handled on s1 is not given again on s2
                assert [got.count(b"m%d" % i) for i in range(5)] == [1] * 5
                nursery.cancel_scope.cancel()
            consumer.close()
            producer.close()
            routes.close()
            s2.close()
            s3.close()


async def test_a_publish_refused_for_too_few_replicas_in_sync_goes_as_soon_as_one_is(
        tmp_path: pathlib.Path, autojump_clock: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server under ``sync`` that no replica copies yet refuses a publish (503), and a
    replica that starts copying it changes no route: the producer tries again once the
    server says it has a replica in sync (its ``writable`` push), not at its next pause
    (made 30 s here)."""
    from mq import TopicLog
    from mq.client import _routed
    from mq.replication._follower import Follower

    monkeypatch.setattr(_routed, "FIRST_RECHECK", 30.0)
    monkeypatch.setattr(_routed, "RECHECK", 30.0)
    with trio.fail_after(600):
        async with open_universe("mq") as universe:
            TrackNode(universe.add_broker("t1"), role="tracker", **TIMING)
            node = TrackNode(universe.add_broker("s1"), role="server",
                             trackers=["t1:15555"], **TIMING)
            server = MqServer(node, tmp_path / "s1", fsync_thread=False, replication="sync")
            server.handle_local({"cmd": "declare", "topic": "orders"})
            routes = RouteClient(universe.add_broker("app"), retry=0.5)
            routes.add_tracker("t1:15555")
            while "s1:15555" not in routes.routes.servers_of("orders"):
                await routes.changed()
            producer = Producer(routes, "orders", failover=60.0)
            stored: list[Any] = []
            done = trio.Event()

            async def publish() -> None:
                stored.append(await producer.publish(b"m"))
                done.set()

            replica = TopicLog(tmp_path / "r1" / "orders")
            async with trio.open_nursery() as nursery:
                nursery.start_soon(publish)
                while producer.retried < 1:  # refused: no replica in sync
                    await trio.sleep(0.01)
                follower = Follower(universe.add_broker("r1"), "s1:15555",
                                    {"orders": replica}, retry=0.5)
                with trio.move_on_after(1.0):
                    await done.wait()
                assert [s.server for s in stored] == ["s1:15555"]
                assert replica.next_offset == 1
            follower.close()
            replica.close()
            producer.close()
            routes.close()
            server.close()


async def test_a_consumer_waits_for_the_member_promoted_and_reads_slaves_only_later(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    """s1 master, s2 and s3 slaves.  s1 dies: for ``slaves_after`` (2 s) the consumer
    reads from no slave, so when s2 is promoted 1 s later the consumer has acknowledged
    nothing on a slave, and moves to s2.  s2 dies in turn and nobody is promoted: 2 s
    after the table lost its last master, the consumer reads from s3, the slave left."""
    from brokermgr import GroupMember

    with trio.fail_after(600):
        async with open_universe("mq") as universe:
            TrackNode(universe.add_broker("t1"), role="tracker", **TIMING)
            members = (("s1", "master"), ("s2", "slave"), ("s3", "slave"))
            nodes = {name: TrackNode(universe.add_broker(name), role="server",
                                     trackers=["t1:15555"],
                                     group=GroupMember("a", i, role, epoch=1), **TIMING)
                     for i, (name, role) in enumerate(members)}
            s1, s2, s3 = (MqServer(nodes[n], tmp_path / n, fsync_thread=False)
                          for n in nodes)
            s1.confirm()
            s1.handle_local({"cmd": "declare", "topic": "orders"})
            s2.follow("s1:15555", retry=0.5)
            s3.follow("s1:15555", retry=0.5)
            routes = RouteClient(universe.add_broker("app"), retry=0.5)
            routes.add_tracker("t1:15555")
            while sorted(routes.routes.servers_of("orders")) != [
                    "s1:15555", "s2:15555", "s3:15555"]:
                await routes.changed()
            consumer = Consumer(routes, "orders", window=100)
            attached: list[tuple[float, str]] = []
            attach = consumer._attach

            def seen(address: str) -> None:
                if address not in consumer.clients:
                    attached.append((trio.current_time(), address))
                attach(address)

            consumer._attach = seen  # type: ignore[method-assign]

            async def lost(name: str) -> float:
                while f"{name}:15555" in routes.routes.servers_of("orders"):
                    await routes.changed()
                return trio.current_time()

            async with trio.open_nursery() as nursery:
                await nursery.start(consumer.run)
                assert [a for _, a in attached] == ["s1:15555"]
                s1.close()
                nodes["s1"].broker.close("killed")
                gone = await lost("s1")
                await trio.sleep(1)
                assert list(consumer.clients) == []  # no slave read meanwhile
                s2.promote(2)
                s3.follow("s2:15555", retry=0.5)
                while "s2:15555" not in consumer.clients:
                    await routes.changed()
                assert [a for _, a in attached] == ["s1:15555", "s2:15555"]
                s2.close()
                nodes["s2"].broker.close("killed")
                gone = await lost("s2")
                while "s3:15555" not in consumer.clients:
                    await trio.sleep(0.05)
                when, address = attached[-1]
                assert address == "s3:15555" and 2.0 <= when - gone < 2.1, (when - gone)
                nursery.cancel_scope.cancel()
            consumer.close()
            routes.close()
            s3.close()
