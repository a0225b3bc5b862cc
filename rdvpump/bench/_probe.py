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

    from brokermgr import BrokerManager, NameClient, ServiceError
    from mq import MqClient
    from pump import Pump
    from rdv import Address

    async def main() -> None:
        side = BrokerManager(universe, pump=Pump(name="probe"))
        async with trio.open_nursery() as nursery:
            await nursery.start(side.pump.serve)
            await nursery.start(side.serve_network, sys.argv[4], 0)
            names = NameClient(side, [Address.parse(manager)], lookup_timeout=0.5)
            names.start()
            count = 0

            async def master(not_: str | None, insync: int) -> str:
                with trio.fail_after(DEADLINE):
                    while True:
                        try:
                            group = await names.group("a")
                        except ServiceError:
                            group = {}
                        found = group.get("master")
                        if found not in (None, not_) and len(group.get("insync") or []
                                                             ) >= insync:
                            return str(found)
                        await trio.sleep(0.005)

            async def publish(to: str) -> None:
                nonlocal count
                count += 1
                client = MqClient(side.add_broker(f"p{count}"), f"{to}:15555", timeout=1)
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

            async def ready() -> None:
                with trio.fail_after(DEADLINE):
                    while True:
                        first = await master(None, 2)
                        try:
                            with trio.fail_after(5):
                                await publish(first)
                            _say(f"ready {first}")
                            return
                        except trio.TooSlowError:
                            continue

            declarer = MqClient(side.add_broker("declare"), f"{await master(None, 0)}:15555",
                                timeout=10)
            with trio.fail_after(DEADLINE):
                while True:
                    try:  # once the name service confirmed the master
                        await declarer.declare("bench")
                        break
                    except ServiceError:
                        await trio.sleep(0.05)
            declarer.close()
            await ready()
            async for line in _stdin_lines():
                words = line.decode().split()
                if words[0] == "cut":
                    began = time.perf_counter()
                    successor = await master(words[1], 0)
                    await publish(successor)
                    _say(f"acked {time.perf_counter() - began:.4f}")
                else:
                    await ready()
            nursery.cancel_scope.cancel()

    trio.run(main)


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

    import nats
    from nats.js.api import StreamConfig

    async def main() -> None:
        async def quiet(*_: Any) -> None:
            """Reconnects to the cut-off server are the scenario, not news."""

        nc = await nats.connect(servers=urls.split(","), reconnect_time_wait=0.05,
                                max_reconnect_attempts=-1, connect_timeout=2,
                                ping_interval=1, max_outstanding_pings=2,
                                error_cb=quiet, disconnected_cb=quiet, reconnected_cb=quiet)
        js = nc.jetstream(timeout=2)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DEADLINE
        while True:
            try:
                await js.add_stream(StreamConfig(name="bench", subjects=["bench"],
                                                 num_replicas=3))
                break
            except Exception:  # noqa: BLE001 - the cluster still electing: bounded
                if loop.time() > deadline:
                    raise
                await asyncio.sleep(0.1)

        async def current() -> str:
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

        _say(f"ready {await current()}")
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader),
                                     sys.stdin)
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
                _say(f"ready {await current()}")
        await nc.close()

    asyncio.run(main())


if __name__ == "__main__":
    if sys.argv[1] == "rdvpump":
        rdvpump_probe(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "cluster":
        cluster_probe(*sys.argv[2:6])
    else:
        nats_probe(sys.argv[2])
