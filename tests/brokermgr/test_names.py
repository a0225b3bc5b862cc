"""The name service over memory streams on trio's mock clock: no real sleeps anywhere.

Each "process" is a BrokerManager on its own pump; they reach each other only
through the MemoryNetwork, as they would through TCP.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from brokermgr import BrokerManager, NameClient, NameService
from brokermgr._liveness import DEFAULT_SCAN_INTERVAL
from brokermgr._names.service import DEFAULT_BROKER_EXPIRY
from channels import AsyncMessageQueue
from pump import Pump
from rdv import Address, RefusedError
from rdv.testing import MemoryNetwork

MANAGER = Address("10.0.0.1", 9876)
MANAGER2 = Address("10.0.0.2", 9876)


class Process:
    """A process: its universe half, its pump and its network, each cancellable."""

    def __init__(self, universe: BrokerManager) -> None:
        self.u = universe
        self.pump_scope = trio.CancelScope()  # cancel: the process hangs (no pump, links open)
        self.scope = trio.CancelScope()  # cancel: the process dies (every link drops)


class World:
    def __init__(self, nursery: trio.Nursery) -> None:
        self.net = MemoryNetwork()
        self.nursery = nursery
        self.hosts = 0

    async def process(self, name: str, address: tuple[str, int] | None = None) -> Process:
        if address is None:
            self.hosts += 1
            address = (f"10.0.1.{self.hosts}", 7000)
        proc = Process(BrokerManager("u", pump=Pump(name=name), token="t"))

        async def run(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            with proc.scope:
                async with trio.open_nursery() as n:

                    async def pump() -> None:
                        with proc.pump_scope:
                            await proc.u.pump.serve()

                    n.start_soon(pump)
                    await n.start(self.net.serve, proc.u.net, address)
                    task_status.started()
                    await trio.sleep_forever()

        await self.nursery.start(run)
        return proc

    async def manager(self, address: tuple[str, int], *,
                      expiry: float = DEFAULT_BROKER_EXPIRY,
                      scan_interval: float = DEFAULT_SCAN_INTERVAL
                      ) -> tuple[NameService, Process]:
        proc = Process(BrokerManager("u", pump=Pump(name="manager"), token="t"))
        service = NameService(proc.u, expiry=expiry, scan_interval=scan_interval)
        proc = await self._start(proc, address)
        return service, proc

    async def _start(self, proc: Process, address: tuple[str, int]) -> Process:
        async def run(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            with proc.scope:
                async with trio.open_nursery() as n:
                    await n.start(proc.u.pump.serve)
                    await n.start(self.net.serve, proc.u.net, address)
                    task_status.started()
                    await trio.sleep_forever()

        await self.nursery.start(run)
        return proc


@asynccontextmanager
async def world() -> AsyncIterator[World]:
    async with trio.open_nursery() as nursery:
        yield World(nursery)
        nursery.cancel_scope.cancel()


async def echo(queue: AsyncMessageQueue) -> None:
    async for message in queue:
        await queue.send(message)


async def wait_until(predicate: Callable[[], bool], *, limit: float = 600.0,
                     step: float = 0.1) -> float:
    """Advance the mock clock until predicate() holds; return the time it took."""
    start = trio.current_time()
    with trio.fail_after(limit):
        while not predicate():
            await trio.sleep(step)
    return trio.current_time() - start


async def test_connect_by_id_resolves_through_the_manager(autojump_clock: object) -> None:
    async with world() as w:
        service, _ = await w.manager(MANAGER)
        a, b = await w.process("A"), await w.process("B")
        for p in (a, b):
            NameClient(p.u, [MANAGER]).start()
        await w.nursery.start(b.u.add_broker("server").serve_queues, 80, echo)
        client = a.u.add_broker("client")
        await wait_until(lambda: "server" in service.table and "client" in service.table)
        q = await client.connect_queue("server", 80)
        await q.send(b"found you")
        assert await q.receive() == b"found you"
        with pytest.raises(RefusedError, match="unknown broker"):
            await client.connect_queue("nobody", 80)


async def test_a_hung_broker_expires_and_a_dead_one_goes_at_once(autojump_clock: object) -> None:
    async with world() as w:
        service, _ = await w.manager(MANAGER, expiry=120, scan_interval=10)
        a, b = await w.process("A"), await w.process("B")
        a.u.add_broker("hung")
        b.u.add_broker("dead")
        NameClient(a.u, [MANAGER], heartbeat=30).start()
        NameClient(b.u, [MANAGER], heartbeat=30).start()
        await wait_until(lambda: len(service.table) == 2)
        a.pump_scope.cancel()  # wedged: connected, but no heartbeat ever again
        took = await wait_until(lambda: "hung" not in service.table)
        assert 120 - 30 < took <= 120 + 10 + 0.2  # the expiry, caught by the next scan
        assert "dead" in service.table
        b.scope.cancel()  # killed: its connection drops
        took = await wait_until(lambda: "dead" not in service.table, step=0.001)
        assert took < 0.01  # at once, not after the expiry


async def test_a_restarted_manager_relearns_every_broker_at_once(autojump_clock: object) -> None:
    async with world() as w:
        service, manager = await w.manager(MANAGER, expiry=120, scan_interval=10)
        a = await w.process("A")
        a.u.add_broker("b1")
        a.u.add_broker("b2")
        NameClient(a.u, [MANAGER], heartbeat=30, retry=1).start()
        await wait_until(lambda: len(service.table) == 2)
        manager.scope.cancel()
        await trio.sleep(5)  # down for 5 s; the client retries every second
        service2, _ = await w.manager(MANAGER, expiry=120, scan_interval=10)
        took = await wait_until(lambda: len(service2.table) == 2, step=0.01)
        assert took <= 1.1  # within one retry, not a 30 s heartbeat


async def test_managers_that_disagree_are_tolerated(autojump_clock: object) -> None:
    async with world() as w:
        m1, _ = await w.manager(MANAGER)
        m2, _ = await w.manager(MANAGER2)
        a, b = await w.process("A"), await w.process("B")
        NameClient(a.u, [MANAGER, MANAGER2]).start()
        NameClient(b.u, [MANAGER2]).start()  # only the second manager knows B's brokers
        await w.nursery.start(b.u.add_broker("server").serve_queues, 80, echo)
        client = a.u.add_broker("client")
        await wait_until(lambda: "server" in m2.table and "client" in m1.table)
        assert "server" not in m1.table
        q = await client.connect_queue("server", 80)
        await q.send(b"via the second")
        assert await q.receive() == b"via the second"


async def test_a_stale_cached_address_is_refreshed_on_failure(autojump_clock: object) -> None:
    async with world() as w:
        service, _ = await w.manager(MANAGER)
        a = await w.process("A")
        b = await w.process("B")
        names_a = NameClient(a.u, [MANAGER])
        names_a.start()
        NameClient(b.u, [MANAGER]).start()
        await w.nursery.start(b.u.add_broker("server").serve_queues, 80, echo)
        client = a.u.add_broker("client")
        await wait_until(lambda: "server" in service.table)
        await client.connect_queue("server", 80)
        assert names_a.cache["server"] == ("10.0.1.2", 7000)
        b.scope.cancel()  # the server's process dies and comes back elsewhere
        await wait_until(lambda: "server" not in service.table)
        c = await w.process("C")
        NameClient(c.u, [MANAGER]).start()
        await w.nursery.start(c.u.add_broker("server").serve_queues, 80, echo)
        await wait_until(lambda: "server" in service.table)
        q = await client.connect_queue("server", 80)  # the cache is wrong; refreshed once
        await q.send(b"moved")
        assert await q.receive() == b"moved"
        assert names_a.cache["server"] == ("10.0.1.3", 7000)


async def test_clean_shutdown_unregisters(autojump_clock: object) -> None:
    async with world() as w:
        service, _ = await w.manager(MANAGER)
        a = await w.process("A")
        a.u.add_broker("b1")
        names = NameClient(a.u, [MANAGER])
        names.start()
        await wait_until(lambda: "b1" in service.table)
        names.close()
        took = await wait_until(lambda: "b1" not in service.table, step=0.001)
        assert took < 0.01


async def test_a_partition_between_the_manager_and_a_process(autojump_clock: object) -> None:
    """Partitioned from the manager, a process's heartbeats hang (TCP notices nothing):
    the manager expires its brokers, others cannot find them, and no new connection gets
    through; healed, the waiting heartbeat arrives and its brokers are found again."""
    async with world() as w:
        service, _ = await w.manager(MANAGER, expiry=60, scan_interval=5)
        a, b = await w.process("A"), await w.process("B")
        NameClient(a.u, [MANAGER], heartbeat=10, retry=1).start()
        NameClient(b.u, [MANAGER], heartbeat=10, retry=1).start()
        await w.nursery.start(a.u.add_broker("server").serve_queues, 80, echo)
        client = b.u.add_broker("client")
        await wait_until(lambda: "server" in service.table and "client" in service.table)
        w.net.partition(MANAGER[0], "10.0.1.1")  # A's host
        took = await wait_until(lambda: "server" not in service.table)
        assert 60 - 10 <= took <= 60 + 5 + 0.2  # the expiry, seen by a scan
        assert "client" in service.table  # B's heartbeats go on
        with pytest.raises(RefusedError, match="unknown broker"):
            await client.connect_queue("server", 80)
        with pytest.raises(OSError, match="partitioned"):
            w.net.open_stream(MANAGER, source="10.0.1.1")
        w.net.heal(MANAGER[0], "10.0.1.1")
        took = await wait_until(lambda: "server" in service.table, step=0.01)
        assert took <= 10  # the next heartbeat at the latest
        q = await client.connect_queue("server", 80)
        await q.send(b"found again")
        assert await q.receive() == b"found again"


async def test_a_broker_registering_again_from_its_own_address_replaces_its_silent_connection(
        ) -> None:
    """After a partition, a broker's process dials its manager again while the manager
    still holds its old connection, silent, open: a registration of the same broker id
    at the same address, from that address's host, takes over (the old connection is
    closed); one at another address is still a duplicate id."""
    from brokermgr import ServiceError, decode, encode

    server = BrokerManager("u", pump=Pump(name="manager"))
    client = BrokerManager("u", pump=Pump(name="client"))
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(server.pump.serve)
            await nursery.start(client.pump.serve)
            service = NameService(server)
            client.directory["@manager"] = await nursery.start(server.serve_network,
                                                               "127.0.0.1", 0)
            await nursery.start(client.serve_network, "127.0.0.1", 0)
            row = {"id": "x", "address": ["127.0.0.1", 4444], "version": 1}

            async def register(address: list[Any]) -> tuple[Any, dict[str, Any]]:
                queue = await client.add_broker(f"c{len(client.broker_ids)}").connect_queue(
                    "@manager", 0)
                await queue.send(encode({"cmd": "register", "seq": 1,
                                         "brokers": [{**row, "address": address}]}))
                return queue, decode(await queue.receive())

            first, said = await register(["127.0.0.1", 4444])
            assert said["cmd"] == "registered"
            second, said = await register(["127.0.0.1", 4444])  # the same broker, again
            assert said["cmd"] == "registered"
            with pytest.raises(trio.EndOfChannel, match="peer disconnected \\(broker x "
                               "registered again over a new connection\\)"):
                await first.receive()  # the old connection is closed, saying why
            entry = service.table.get("x")
            assert entry is not None and entry.connection is not None
            _, said = await register(["127.0.0.1", 5555])  # another process: refused
            error = ServiceError.of(said)
            assert error is not None and error.reason == (
                "duplicate id: x (held by 127.0.0.1:4444)")
            await second.aclose()
            nursery.cancel_scope.cancel()


async def test_a_witness_alone_drops_no_master_that_beats(autojump_clock: object) -> None:
    """A member in sync that says its master has been quiet for seconds (a lie, or a link
    of its own stalled) drops nothing while the master's own beats come: a master is
    dropped early only when it is silent for five of its beats too.  Once the master
    hangs (no beat, its connection open), that witness has it dropped after those five
    beats (0.5 s), not after the ten of the expiry."""
    from brokermgr import GroupMember, GroupProgress

    async with world() as w:
        service, _ = await w.manager(MANAGER)
        a, b = await w.process("A"), await w.process("B")
        a.u.add_broker("m0")
        b.u.add_broker("s1")
        NameClient(a.u, [MANAGER], heartbeat=0.1,
                   groups=lambda _: GroupMember("g", 0, "master", 1),
                   progress=lambda _: GroupProgress(10, ("s1",))).start()
        NameClient(b.u, [MANAGER], heartbeat=0.1,
                   groups=lambda _: GroupMember("g", 1, "slave", 1),
                   progress=lambda _: GroupProgress(10, (), quiet=5.0)).start()
        await wait_until(lambda: service.groups.master("g") is not None
                         and service.groups.insync.get("g") == ("s1",))
        await trio.sleep(3)  # thirty of the master's beats, each witnessed against
        assert service.groups.epochs["g"] == (1, "m0") and "m0" in service.table
        a.pump_scope.cancel()  # hung: connected, no beat ever again
        took = await wait_until(lambda: service.groups.epochs["g"][1] == "s1", step=0.01)
        # five beats from its last one (up to a beat before the hang) and a scan: not the
        # expiry's ten
        assert 0.4 <= took < 0.8, took


async def test_a_witness_counts_only_once_quiet_for_the_silence_it_states(
        autojump_clock: object) -> None:
    """A member in sync that states a silence of 2 s (``broker run --silence 2``) and has
    heard nothing from its master for 1 s is no witness yet: its master, hung, goes at
    its expiry (ten beats), not five beats after its last one."""
    from brokermgr import GroupMember, GroupProgress

    async with world() as w:
        service, _ = await w.manager(MANAGER)
        a, b = await w.process("A"), await w.process("B")
        a.u.add_broker("m0")
        b.u.add_broker("s1")
        NameClient(a.u, [MANAGER], heartbeat=0.1,
                   groups=lambda _: GroupMember("g", 0, "master", 1),
                   progress=lambda _: GroupProgress(10, ("s1",))).start()
        NameClient(b.u, [MANAGER], heartbeat=0.1,
                   groups=lambda _: GroupMember("g", 1, "slave", 1),
                   progress=lambda _: GroupProgress(10, (), quiet=1.0, silence=2.0)).start()
        await wait_until(lambda: service.groups.master("g") is not None
                         and service.groups.insync.get("g") == ("s1",))
        a.pump_scope.cancel()  # hung: connected, no beat ever again
        took = await wait_until(lambda: service.groups.epochs["g"][1] == "s1", step=0.01)
        assert 0.9 <= took < 1.3, took
