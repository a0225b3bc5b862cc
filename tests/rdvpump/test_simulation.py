"""Faults on simulated links (rdvpump.testing): partitions, hold and release, delay, loss,
crash and restart; and runs that are a pure function of their seed."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio

from channels import AsyncMessageQueue, CloseCause
from pump import ListSink, TraceEvent
from rdv import RefusedError
from rdvpump.testing import Faults, SimulationError, open_simulation, run_simulation

MESSAGES = [bytes([i]) * (1 + i * 7 % 50) for i in range(60)]


async def _collect(q: AsyncMessageQueue, into: list[bytes]) -> None:
    try:
        async for m in q:
            into.append(m)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


@contextlib.asynccontextmanager
async def collected(faults: Faults) -> AsyncIterator[tuple[AsyncMessageQueue, list[bytes]]]:
    """Broker "client" linked to broker "server", which collects what arrives."""
    u = faults.universe
    server, client = u.add_broker("server"), u.add_broker("client")
    got: list[bytes] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve_queues, 80, lambda q: _collect(q, got))
        yield await client.connect_queue("server", 80), got
        nursery.cancel_scope.cancel()


def test_a_partition_refuses_connects_and_stalls_links_until_healed() -> None:
    async def main() -> tuple[list[bytes], float, str, list[bytes], bool]:
        async with open_simulation("p", seed=1, ring_capacity=64) as faults, \
                collected(faults) as (q, got):
            client = faults.universe.broker("client")
            await q.send_many(MESSAGES[:10])
            await trio.sleep(0.1)
            before = list(got)
            faults.partition("client", "server")
            with pytest.raises(RefusedError) as refused:
                await client.connect_queue("server", 80)
            await q.send_many(MESSAGES[10:])  # the sender has room: rings and the line
            await trio.sleep(5)
            stalled = list(got)
            faults.heal("client", "server")
            t0 = trio.current_time()
            while len(got) < len(MESSAGES):
                await trio.sleep(0.01)
            took = trio.current_time() - t0
            closed = q.close_reason is not None
            return before, took, str(refused.value.reason), stalled, closed

    before, took, reason, stalled, closed = run_simulation(main, seed=1)
    assert before == MESSAGES[:10]
    assert reason == "unreachable: partitioned"
    assert stalled == MESSAGES[:10]  # nothing crossed the partition in 5 s
    assert took < 0.1 and not closed


def test_a_link_across_a_partition_closes_as_partitioned_after_the_timeout() -> None:
    async def main() -> tuple[str | None, CloseCause | None, float]:
        async with open_simulation("p", seed=1, partition_timeout=3.0) as faults:
            u = faults.universe
            server, client = u.add_broker("server"), u.add_broker("client")
            async with trio.open_nursery() as nursery:
                await nursery.start(server.serve_queues, 80, lambda q: _collect(q, []))
                q = await client.connect_queue("server", 80)
                faults.partition(["client"], ["server", "other"])
                t0 = trio.current_time()
                with pytest.raises(trio.BrokenResourceError):
                    await q.receive()
                nursery.cancel_scope.cancel()
            return q.close_reason, q.close_cause, trio.current_time() - t0

    reason, cause, after = run_simulation(main, seed=2)
    assert reason == "partitioned" and cause is CloseCause.LOST
    assert after == pytest.approx(3.0, abs=0.01)


def test_hold_and_release_with_rings_of_four_bytes_lose_and_reorder_nothing() -> None:
    async def main() -> tuple[list[bytes], list[bytes]]:
        async with open_simulation("h", seed=3, ring_capacity=4) as faults, \
                collected(faults) as (q, got):
            async with trio.open_nursery() as nursery:
                faults.hold(q)

                async def send_all() -> None:
                    for m in MESSAGES:
                        await q.send(m)

                nursery.start_soon(send_all)
                await trio.sleep(2)
                held = list(got)
                faults.release(("client", "server"))
                while len(got) < len(MESSAGES):
                    await trio.sleep(0.01)
                nursery.cancel_scope.cancel()
            return held, got

    held, got = run_simulation(main, seed=3)
    assert held == []
    assert got == MESSAGES


def test_delay_with_jitter_keeps_order_and_takes_the_time() -> None:
    async def main() -> tuple[list[tuple[float, bytes]], float]:
        async with open_simulation("d", seed=4) as faults:
            u = faults.universe
            server, client = u.add_broker("server"), u.add_broker("client")
            got: list[tuple[float, bytes]] = []

            async def stamp(q: AsyncMessageQueue) -> None:
                async for m in q:
                    got.append((trio.current_time(), m))

            async with trio.open_nursery() as nursery:
                await nursery.start(server.serve_queues, 80, stamp)
                q = await client.connect_queue("server", 80)
                faults.delay(q, 0.5, jitter=0.2)
                t0 = trio.current_time()
                for m in MESSAGES:
                    await q.send(m)
                    await trio.sleep(0.01)
                while len(got) < len(MESSAGES):
                    await trio.sleep(0.01)
                nursery.cancel_scope.cancel()
            return got, t0

    got, t0 = run_simulation(main, seed=4)
    assert [m for _, m in got] == MESSAGES
    lags = [t - (t0 + 0.01 * i) for i, (t, _) in enumerate(got)]
    assert min(lags) >= 0.5 - 1e-9 and max(lags) <= 0.71
    assert max(lags) - min(lags) > 0.05  # the jitter shows


def test_a_lossy_link_breaks_with_a_reason_and_delivers_a_prefix_in_order() -> None:
    async def main() -> tuple[list[bytes], str | None, CloseCause | None]:
        async with open_simulation("l", seed=5) as faults, collected(faults) as (q, got):
            faults.drop(q, 0.2)
            with pytest.raises(trio.BrokenResourceError):
                for m in MESSAGES * 10:
                    await q.send(m)
                    await trio.sleep(0.001)
            return got, q.close_reason, q.close_cause

    got, reason, cause = run_simulation(main, seed=5)
    assert reason is not None and reason.startswith("dropped: the link lost")
    assert cause is CloseCause.LOST
    assert got == (MESSAGES * 10)[:len(got)]  # a prefix: nothing reordered or skipped


def test_a_crashed_broker_is_unreachable_its_links_lost_and_it_restarts() -> None:
    async def main() -> tuple[str | None, CloseCause | None, str, bytes]:
        async with open_simulation("c", seed=6) as faults:
            u = faults.universe
            server, client = u.add_broker("server"), u.add_broker("client")
            async with trio.open_nursery() as nursery:

                async def echo(q: AsyncMessageQueue) -> None:
                    try:
                        async for m in q:
                            await q.send(m)
                    except trio.BrokenResourceError:
                        pass

                scope = trio.CancelScope()

                async def serve(broker: object) -> None:
                    with scope:
                        await broker.serve_queues(80, echo)  # type: ignore[attr-defined]

                faults.on_crash.append(lambda _: scope.cancel())
                faults.on_restart.append(lambda b: nursery.start_soon(
                    b.serve_queues, 80, echo))
                nursery.start_soon(serve, server)
                await trio.sleep(0.01)
                q = await client.connect_queue("server", 80)
                await q.send(b"before")
                assert await q.receive() == b"before"
                faults.crash("server")
                with pytest.raises(trio.BrokenResourceError):
                    await q.receive()
                with pytest.raises(RefusedError) as refused:
                    await client.connect_queue("server", 80)
                faults.restart("server")
                await trio.sleep(0.01)
                q2 = await client.connect_queue("server", 80)
                await q2.send(b"after")
                echoed = await q2.receive()
                nursery.cancel_scope.cancel()
            return q.close_reason, q.close_cause, str(refused.value.reason), echoed

    reason, cause, refused, echoed = run_simulation(main, seed=6)
    assert (reason, cause) == ("server crashed", CloseCause.LOST)
    assert refused == "unreachable: server crashed"
    assert echoed == b"after"


def test_faults_name_what_they_cannot_find() -> None:
    async def main() -> list[str]:
        errors = []
        async with open_simulation("e") as faults:
            faults.universe.add_broker("a")
            cases: list[tuple[str, dict[str, Any]]] = [
                ("hold", {"link": ["a", "b"]}), ("crash", {"broker": "zz"}),
                ("restart", {"broker": "a"}), ("explode", {}), ("partition", {"a": "a", "b": "a"})]
            for action, args in cases:
                with pytest.raises(SimulationError) as exc:
                    faults.apply(action, **args)
                errors.append(str(exc.value))
            with pytest.raises(SimulationError, match="already has faults"):
                Faults(faults.universe)
        return errors

    assert run_simulation(main) == [
        "universe 'e' has no broker 'b'",
        "universe 'e' has no broker 'zz'",
        "broker 'a' has not crashed",
        "unknown fault action 'explode' (one of partition, heal, hold, release, delay, drop, "
        "crash, restart)",
        "nothing to partition between 'a' and 'a'",
    ]


def _scenario(seed: int) -> list[TraceEvent]:
    """Echo over three clients with a partition, a hold, a delay and jitter; the trace."""
    sink = ListSink()

    async def main() -> None:
        async with open_simulation("s", seed=seed, trace=sink, ring_capacity=256) as faults:
            u = faults.universe
            server = u.add_broker("server")
            rng = u.pump.random
            async with trio.open_nursery() as nursery:
                await nursery.start(server.serve_queues, 80, lambda q: _echo(q))

                linked = trio.Semaphore(0)
                faulted = trio.Event()

                async def client(name: str) -> None:
                    q = await u.add_broker(name).connect_queue("server", 80)
                    linked.release()
                    await faulted.wait()
                    for _ in range(30):
                        m = rng.randbytes(rng.randint(1, 300))
                        await q.send(m)
                        assert await q.receive() == m
                    await q.aclose()

                async with trio.open_nursery() as clients:
                    for i in range(3):
                        clients.start_soon(client, f"c{i}")
                    for _ in range(3):
                        await linked.acquire()
                    faults.delay(("c0", "server"), 0.01, jitter=0.01)
                    faults.partition("c1", "server")
                    faults.hold(("c2", "server"))
                    faulted.set()
                    await trio.sleep(0.5)
                    faults.heal("c1", "server")
                    faults.release(("c2", "server"))
                nursery.cancel_scope.cancel()

    run_simulation(main, seed=seed)
    return sink.events


async def _echo(q: AsyncMessageQueue) -> None:
    try:
        async for m in q:
            await q.send(m)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


def test_a_seeded_scenario_replays_to_the_identical_trace() -> None:
    first, second = _scenario(11), _scenario(11)
    assert len(first) > 1000
    assert any(e.kind == "fault" for e in first)
    assert first == second
    assert _scenario(12) != first


def test_bench_sim_runs_the_same_universe_three_ways() -> None:
    import json

    from typer.testing import CliRunner

    from rdvpump.cli import app

    result = CliRunner().invoke(app, ["bench", "sim", "--json", "--brokers", "10", "--links",
                                      "20", "--interval", "0.05", "--duration", "0.5"])
    assert result.exit_code == 0, result.output
    rows = {r["case"]: r for r in map(json.loads, result.output.splitlines())}
    assert set(rows) == {"virtual clock (pump)", "virtual clock (trio)", "real clock (trio)"}
    pump, served = rows["virtual clock (pump)"], rows["virtual clock (trio)"]
    # 20 links, a message every 0.05 s for 0.5 s, each echoed: the same on both clocks
    assert pump["messages"] == served["messages"] == 20 * 10 * 2
    assert rows["real clock (trio)"]["messages"] > 0
    assert all(r["baseline"] == "real clock (trio)" and r["links"] == 20 for r in rows.values())


def test_bench_fanout_switches_every_message_into_every_sink() -> None:
    import json

    from typer.testing import CliRunner

    from rdvpump.cli import app

    result = CliRunner().invoke(app, ["bench", "fanout", "--json", "--sinks", "1,3",
                                      "--messages", "3000", "--size", "100", "--repeat", "1"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.output.splitlines()]
    assert [(r["case"], r["sinks"], r["baseline"]) for r in rows] == [
        (case, q, base) for q in (1, 3) for case, base in (
            ("universe-workload", "openamq-25k-msg-s"),
            ("listener", "openamq-25k-msg-s"),
            ("universe-workload", "listener"))]
    assert all(r["messages"] == 3000 and r["deliveries_per_s"] > 0 for r in rows)
    bad = CliRunner().invoke(app, ["bench", "fanout", "--sinks", "0"])
    assert bad.exit_code == 1
    assert "--sinks must be positive integers" in bad.output


@pytest.mark.slow
def test_bench_tcp_has_the_async_face_rows_beside_the_listener_rows() -> None:
    import json

    from typer.testing import CliRunner

    from rdvpump.cli import app

    result = CliRunner().invoke(app, ["bench", "tcp", "--json", "--sizes", "64",
                                      "--scale", "0.002", "--repeat", "1"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.output.splitlines()]
    cases = {(r["case"], r["baseline"]) for r in rows}
    for case in ("rdvpump-tcp", "rdvpump-tcp-async-await-each", "rdvpump-tcp-async-send-many"):
        assert (case, "pyzmq-tcp-push-pull") in cases
        assert (case, "trio-batched-framing") in cases
    round_trips = {r["case"] for r in rows if r["baseline"] == "pyzmq-tcp-req-rep"}
    assert round_trips >= {"rdvpump-tcp-round-trip", "rdvpump-tcp-round-trip-no-polling"}
    assert all(r["msgs_per_s"] > 0 for r in rows)
