"""The client side of ``bench partition``, run on a host of its own: it publishes to a
replicated group (or a NATS JetStream stream) and, told the master was cut off, times
the first publish its successor acknowledges.

Lines on stdin: ``cut NAME`` (the master or leader ``NAME`` was just cut off: time the
first acknowledgement by another), ``wait`` (until a master with every member in sync,
or a leader with every replica current, is there).  Lines on stdout: ``ready NAME``
(the master or leader, in sync), ``acked SECONDS``.  ``python -m rdvpump.bench._probe
rdvpump MANAGER`` or ``... nats URL,URL,URL``.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

DEADLINE = 60.0
BODY = b"x" * 1024


def _say(line: str) -> None:
    print(line, flush=True)


def rdvpump_probe(manager: str, universe: str) -> None:
    import trio

    trio.run(_group_probe, manager, universe)


async def _group_probe(manager: str, universe: str) -> None:
    import trio

    from brokermgr import BrokerManager, NameClient
    from pump import Pump
    from rdv import Address

    side = BrokerManager(universe, pump=Pump(name="probe"))
    async with trio.open_nursery() as nursery:
        await nursery.start(side.pump.serve)
        await nursery.start(side.serve_network, sys.argv[4], 0)
        names = NameClient(side, [Address.parse(manager)], lookup_timeout=0.5)
        names.start()
        probe = _GroupProbe(side, names)
        await probe.declare()
        await probe.ready()
        async for line in _stdin_lines():
            words = line.decode().split()
            if words[0] == "cut":
                began = time.perf_counter()
                successor = await probe.master(words[1], 0)
                await probe.publish(successor)
                _say(f"acked {time.perf_counter() - began:.4f}")
            else:
                await probe.ready()
        nursery.cancel_scope.cancel()


class _GroupProbe:
    """A replicated group's client: its master found through the name service, published
    to until one is acknowledged."""

    def __init__(self, side: Any, names: Any) -> None:
        self.side = side
        self.names = names
        self.count = 0

    async def master(self, not_: str | None, insync: int) -> str:
        """The master named, other than ``not_``, with at least ``insync`` in sync."""
        import trio

        from brokermgr import ServiceError

        with trio.fail_after(DEADLINE):
            while True:
                try:
                    group = await self.names.group("a")
                except ServiceError:
                    group = {}
                found = group.get("master")
                if found not in (None, not_) and len(group.get("insync") or []) >= insync:
                    return str(found)
                await trio.sleep(0.005)

    async def publish(self, to: str) -> None:
        import trio

        from brokermgr import ServiceError
        from mq import MqClient

        self.count += 1
        client = MqClient(self.side.add_broker(f"p{self.count}"), f"{to}:15555", timeout=1)
        try:
            with trio.fail_after(DEADLINE):
                while True:
                    try:
                        await client.publish("bench", BODY)
                        return
                    except ServiceError:
                        await trio.sleep(0.005)
        finally:
            client.close()

    async def ready(self) -> None:
        """A master with every member in sync that acknowledges a publish: said."""
        import trio

        with trio.fail_after(DEADLINE):
            while True:
                first = await self.master(None, 2)
                try:
                    with trio.fail_after(5):
                        await self.publish(first)
                    _say(f"ready {first}")
                    return
                except trio.TooSlowError:
                    continue

    async def declare(self) -> None:
        """The topic, declared once the name service confirmed the master."""
        import trio

        from brokermgr import ServiceError
        from mq import MqClient

        declarer = MqClient(self.side.add_broker("declare"),
                            f"{await self.master(None, 0)}:15555", timeout=10)
        with trio.fail_after(DEADLINE):
            while True:
                try:
                    await declarer.declare("bench")
                    break
                except ServiceError:
                    await trio.sleep(0.05)
        declarer.close()


def cluster_probe(manager: str, universe: str, listen: str, via: str) -> None:
    """The cluster's case: publishes to a shared topic through the server ``via`` (never
    the one cut off), which relays it to the root; each try waits 0.25 s at most, as
    NATS's do."""
    import trio

    from brokermgr import BrokerManager, NameClient, ServiceError
    from mq import MqClient
    from pump import Pump
    from rdv import Address

    async def main() -> None:
        side = BrokerManager(universe, pump=Pump(name="probe"))
        async with trio.open_nursery() as nursery:
            await nursery.start(side.pump.serve)
            await nursery.start(side.serve_network, listen, 0)
            names = NameClient(side, [Address.parse(manager)], lookup_timeout=0.5)
            names.start()
            client = MqClient(side.add_broker("p"), f"{via}:15555", timeout=0.25)

            async def publish() -> None:
                with trio.fail_after(DEADLINE):
                    while True:
                        try:
                            await client.publish("bench", BODY)
                            return
                        except ServiceError as exc:
                            if exc.status == 404:  # declared through the root, once
                                with contextlib.suppress(ServiceError):
                                    await client.declare("bench", shared=True)
                            await trio.sleep(0.005)

            async for line in _stdin_lines():
                began = time.perf_counter()
                await publish()
                _say(f"acked {time.perf_counter() - began:.4f}" if line.startswith(b"cut")
                     else "ready root")
            client.close()
            nursery.cancel_scope.cancel()

    trio.run(main)


async def _stdin_lines() -> AsyncIterator[bytes]:
    """The lines of stdin, without their newlines, until it ends."""
    import trio

    stdin = trio.lowlevel.FdStream(0)
    buffer = b""
    while True:
        while b"\n" not in buffer:
            chunk = await stdin.receive_some(4096)
            if not chunk:
                return
            buffer += chunk
        line, buffer = buffer.split(b"\n", 1)
        yield line


def nats_probe(urls: str) -> None:
    import asyncio

    asyncio.run(_nats_probe(urls))


async def _nats_probe(urls: str) -> None:
    import asyncio

    import nats

    async def quiet(*_: Any) -> None:
        """Reconnects to the cut-off server are the scenario, not news."""

    nc = await nats.connect(servers=urls.split(","), reconnect_time_wait=0.05,
                            max_reconnect_attempts=-1, connect_timeout=2,
                            ping_interval=1, max_outstanding_pings=2,
                            error_cb=quiet, disconnected_cb=quiet, reconnected_cb=quiet)
    js = nc.jetstream(timeout=2)
    loop = asyncio.get_running_loop()
    await _js_stream(js)
    _say(f"ready {await _js_current(js)}")
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        words = line.decode().split()
        if words[0] == "cut":
            began = time.perf_counter()
            while True:
                try:
                    await js.publish("bench", BODY, timeout=0.25)
                    break
                except Exception:  # noqa: BLE001 - no leader yet: bounded
                    if time.perf_counter() - began > DEADLINE:
                        raise
            _say(f"acked {time.perf_counter() - began:.4f}")
        else:
            _say(f"ready {await _js_current(js)}")
    await nc.close()


async def _js_stream(js: Any) -> None:
    """The bench stream, R = 3, once the cluster has elected (bounded)."""
    import asyncio

    from nats.js.api import StreamConfig

    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE
    while True:
        try:
            await js.add_stream(StreamConfig(name="bench", subjects=["bench"],
                                             num_replicas=3))
            return
        except Exception:  # noqa: BLE001 - the cluster still electing: bounded
            if loop.time() > deadline:
                raise
            await asyncio.sleep(0.1)


async def _js_current(js: Any) -> str:
    """The stream's leader, once both its replicas are current (and a publish went)."""
    import asyncio

    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE
    while True:
        try:
            cluster = (await js.stream_info("bench")).cluster
            replicas = [] if cluster is None else cluster.replicas or []
            if cluster is not None and cluster.leader and len(replicas) == 2 and all(
                    r.current and not r.offline for r in replicas):
                await js.publish("bench", BODY)
                return str(cluster.leader)
        except Exception:  # noqa: BLE001 - electing: asked again, bounded
            pass
        if loop.time() > deadline:
            raise TimeoutError("the stream's replicas did not become current")
        await asyncio.sleep(0.05)


if __name__ == "__main__":
    if sys.argv[1] == "rdvpump":
        rdvpump_probe(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "cluster":
        cluster_probe(*sys.argv[2:6])
    else:
        nats_probe(sys.argv[2])
