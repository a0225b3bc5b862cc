"""The same program with the same seed gives the identical sequence of pump events."""

from __future__ import annotations

import pathlib

import pytest
import trio
import trio.testing

from brokermgr import BrokerManager, open_universe
from channels import AsyncMessageQueue
from pump import ListSink, Pump, TraceEvent, open_trace

from .brokermgr.test_echo import EchoClient, EchoServer


def echo_events(seed: int) -> list[TraceEvent]:
    sink = ListSink()
    pump = Pump(seed=seed, trace=sink)
    universe = BrokerManager("det", pump=pump, ring_capacity=64, high_water=8192)
    universe.add_broker("Server").listen(80, EchoServer())
    clients = [EchoClient(universe.add_broker(f"c{i}"), 2, 5, 2000) for i in range(3)]
    for c in clients:
        c.start()
    pump.call_later(1.5, lambda: None)  # a timer in the mix
    pump.run_until_idle()
    assert all(not c.mismatches for c in clients)
    return sink.events


def test_same_seed_same_events() -> None:
    first, second = echo_events(7), echo_events(7)
    assert len(first) > 1000
    assert first == second


def test_another_seed_gives_another_run() -> None:
    assert echo_events(7) != echo_events(8)


def async_echo_events(seed: int) -> list[TraceEvent]:
    sink = ListSink()

    async def main() -> None:
        async with open_universe("det", seed=seed, trace=sink, ring_capacity=64) as u:
            server, client = u.add_broker("Server"), u.add_broker("client")

            async def echo(q: AsyncMessageQueue) -> None:
                async for m in q:
                    await q.send(m)

            async with trio.open_nursery() as nursery:
                await nursery.start(server.serve_queues, 80, echo)
                rng = u.pump.random
                for _ in range(2):
                    q = await client.connect_queue("Server", 80)
                    for _ in range(20):
                        m = rng.randbytes(rng.randint(1, 500))
                        await q.send(m)
                        assert await q.receive() == m
                    await trio.sleep(0.25)
                    await q.aclose()
                nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return sink.events


def test_served_pump_under_mock_clock_is_deterministic_too() -> None:
    first, second = async_echo_events(3), async_echo_events(3)
    assert len(first) > 100
    assert first == second


def write_echo_trace(directory: str, fmt: str, seed: int) -> bytes:
    recorder = open_trace(directory, pump="det", run="det", format=fmt)
    pump = Pump(seed=seed, trace=recorder)
    universe = BrokerManager("det", pump=pump, ring_capacity=64, high_water=8192)
    universe.add_broker("Server").listen(80, EchoServer())
    clients = [EchoClient(universe.add_broker(f"c{i}"), 2, 5, 2000) for i in range(3)]
    for c in clients:
        c.start()
    pump.run_until_idle()
    pump.close_trace()
    return (pathlib.Path(directory) / f"det.det.{fmt}").read_bytes()


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_same_seed_writes_byte_identical_trace_files(tmp_path: pathlib.Path, fmt: str) -> None:
    if fmt == "parquet":
        pytest.importorskip("pyarrow")
    first = write_echo_trace(str(tmp_path / "one"), fmt, 7)
    second = write_echo_trace(str(tmp_path / "two"), fmt, 7)
    if fmt == "parquet":
        import pyarrow.parquet as pq

        assert pq.read_metadata(tmp_path / "one" / "det.det.parquet").num_rows > 1000
    else:
        assert first.count(b"\n") > 1000
    assert first == second
    assert write_echo_trace(str(tmp_path / "three"), fmt, 8) != first
