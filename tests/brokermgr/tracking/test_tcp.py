"""Tracking over real TCP on 127.0.0.1: three pumps (tracker, server, client), TLS per server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from brokermgr import BrokerManager
from brokermgr.tracking import RouteClient, TrackNode
from pump import Pump
from rdv import tls_contexts

Worlds = tuple[BrokerManager, BrokerManager, BrokerManager]


@asynccontextmanager
async def three_pumps() -> AsyncIterator[Worlds]:
    """A tracker, a server and a client universe-half, each on its own pump and TCP port."""
    ut, us, uc = (BrokerManager("u", pump=Pump(name=n)) for n in ("T", "S", "C"))
    async with trio.open_nursery() as nursery:
        for u in (ut, us, uc):
            await nursery.start(u.pump.serve)
        addresses = [await nursery.start(u.serve_network) for u in (ut, us, uc)]
        for u in (us, uc):
            u.directory["t1"] = addresses[0]
        uc.directory["s1"] = addresses[1]
        yield ut, us, uc
        nursery.cancel_scope.cancel()


async def until(client: RouteClient, condition: Callable[[], bool]) -> None:
    with trio.fail_after(5):
        while not condition():
            await client.changed()


async def test_routes_over_tcp_and_a_server_that_drops(pki: dict[str, str]) -> None:
    async with three_pumps() as (ut, us, uc):
        TrackNode(ut.add_broker("t1"), role="tracker")
        server = TrackNode(us.add_broker("s1"), role="server", trackers=["t1:15555"])
        server.declare_topic("orders")
        client = RouteClient(uc.add_broker("c"))
        client.add_tracker("t1:15555")
        await until(client, lambda: "orders" in client.routes.topic_table)
        assert list(client.routes.server_table) == ["s1:15555"]
        server.broker.close("killed")  # its TCP link to the tracker goes down
        await until(client, lambda: not client.routes.server_table)


async def test_add_ssl_cert_file_reaches_a_tls_server(pki: dict[str, str]) -> None:
    async with three_pumps() as (ut, us, uc):
        # only the server's inbound links are TLS (no client certificates asked)
        us.net.tls_server = tls_contexts(pki["cert"], pki["key"], None)[0]
        TrackNode(ut.add_broker("t1"), role="tracker")
        server = TrackNode(us.add_broker("s1"), role="server", trackers=["t1:15555"])
        assert server.address.ssl_enabled
        client = RouteClient(uc.add_broker("c"), retry=0.05)
        client.add_tracker("t1:15555")
        await until(client, lambda: bool(client.routes.server_table))
        assert client.routes.server_table["s1:15555"].server_address.ssl_enabled
        # a static link to the server: plain TCP is refused, a wrong certificate too
        async def attempt() -> Any:
            client.add_server("s1:15555")
            with trio.fail_after(5):
                await client.servers["s1:15555"].attempted()
            return client.servers["s1:15555"]

        query = await attempt()
        assert query.last_refusal is not None and "unreachable" in query.last_refusal
        client.remove_server("s1:15555")
        client.add_ssl_cert_file("s1:15555", pki["other_ca"])
        query = await attempt()
        assert query.last_refusal is not None and "tls handshake failed" in query.last_refusal
        client.remove_server("s1:15555")
        client.add_ssl_cert_file("s1:15555", pki["ca"])
        query = await attempt()
        await until(client, lambda: bool(client.routes.static))
        assert query.connects == 1
        assert set(client.routes.static) == {"s1:15555"} and query.queue is not None
        with pytest.raises(FileNotFoundError):
            client.add_ssl_cert_file("s1:15555", "/nonexistent.pem")
