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
                got = set()
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
