"""The event pump: FIFO, timers on the virtual clock, failure isolation, the trio driver."""

from __future__ import annotations

import logging

import pytest
import trio

from pump import DEFAULT_SERVE_BATCH, ListSink, Pump


class Owner:
    def __init__(self, name: str) -> None:
        self.name = name
        self.failed: list[BaseException] = []

    def task_failed(self, exc: BaseException) -> None:
        self.failed.append(exc)

    def trace_ids(self) -> tuple[str | None, str | None, int | None, str | None]:
        return self.name, None, None, None


def test_tasks_run_in_fifo_order_one_at_a_time() -> None:
    pump = Pump()
    order: list[str] = []

    def task(name: str) -> None:
        order.append(f"start {name}")
        if name == "a":
            pump.post("deliver", task, "c")  # posted from a task: runs after b, not inside a
        order.append(f"end {name}")

    pump.post("deliver", task, "a")
    pump.post("deliver", task, "b")
    assert pump.run_until_idle() == 3
    assert order == ["start a", "end a", "start b", "end b", "start c", "end c"]


def test_a_task_cannot_run_the_pump_reentrantly() -> None:
    pump = Pump()
    owner = Owner("x")
    pump.post("deliver", pump.run_until_idle, owner=owner)
    pump.run_until_idle()
    assert len(owner.failed) == 1
    assert "already running" in str(owner.failed[0])


def test_virtual_clock_jumps_to_the_next_timer() -> None:
    pump = Pump()
    seen: list[tuple[str, float]] = []
    pump.call_later(30.0, lambda: seen.append(("late", pump.now())))
    pump.call_later(10.0, lambda: seen.append(("early", pump.now())))
    cancelled = pump.call_later(20.0, lambda: seen.append(("cancelled", pump.now())))
    cancelled.cancel()
    pump.post("deliver", lambda: seen.append(("now", pump.now())))
    pump.run_until_idle()
    assert seen == [("now", 0.0), ("early", 10.0), ("late", 30.0)]
    assert pump.now() == 30.0


def test_run_until_stops_at_the_deadline_with_periodic_timers() -> None:
    pump = Pump()
    ticks: list[float] = []

    def tick() -> None:
        ticks.append(pump.now())
        pump.call_later(10.0, tick)

    pump.call_later(10.0, tick)
    pump.run_until(35.0)
    assert ticks == [10.0, 20.0, 30.0]
    assert pump.now() == 35.0
    pump.run_for(10.0)
    assert ticks[-1] == 40.0


def test_call_every_runs_until_cancelled_and_survives_a_failing_run(
        caplog: pytest.LogCaptureFixture) -> None:
    from pump import NeverIdleError

    pump = Pump()
    ran: list[float] = []

    def report() -> None:
        ran.append(pump.now())
        if len(ran) == 2:
            raise OSError("disk full")  # logged by the pump; the next run comes all the same

    handle = pump.call_every(10.0, report)
    with caplog.at_level(logging.ERROR):
        pump.run_until(35.0)
    assert ran == [10.0, 20.0, 30.0] and "disk full" in caplog.text
    with pytest.raises(NeverIdleError, match=r"\(.*report\)"):  # named, not the wrapper
        pump.run_until_idle()
    handle.cancel()
    pump.run_until_idle()  # nothing left
    assert ran == [10.0, 20.0, 30.0]
    with pytest.raises(ValueError, match="interval must be a positive number"):
        pump.call_every(0, report)


def test_max_steps_bounds_a_run() -> None:
    pump = Pump()

    def forever() -> None:
        pump.post("deliver", forever)

    pump.post("deliver", forever)
    assert pump.run_until_idle(max_steps=100) == 100
    assert pump.pending() == 1


def test_negative_delay_is_an_error() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        Pump().call_later(-1, lambda: None)


def test_an_exception_fails_only_its_owner_and_the_pump_goes_on(
        caplog: pytest.LogCaptureFixture) -> None:
    sink = ListSink()
    pump = Pump(trace=sink)
    bad, good = Owner("bad"), Owner("good")
    ran: list[str] = []

    def boom() -> None:
        raise ValueError("bad task")

    pump.post("deliver", boom, owner=bad)
    pump.post("deliver", ran.append, "good ran", owner=good)
    pump.post("deliver", boom)  # no owner: logged and traced only
    with caplog.at_level(logging.ERROR, logger="rdvpump.pump"):
        pump.run_until_idle()
    assert ran == ["good ran"]
    assert [type(e) for e in bad.failed] == [ValueError]
    assert good.failed == []
    assert pump.failures == 2
    fails = [e for e in sink.events if e.kind == "fail"]
    assert [e.broker for e in fails] == ["bad", None]
    assert "ValueError('bad task')" in (fails[0].reason or "")
    assert "deliver task failed" in caplog.text


def test_every_step_is_traced_with_its_kind_and_owner() -> None:
    sink = ListSink()
    pump = Pump(trace=sink)
    pump.post("accept", lambda: None, owner=Owner("srv"))
    pump.call_later(1.0, lambda: None)
    pump.run_until_idle()
    assert [(e.step, e.kind, e.outcome, e.broker, e.time) for e in sink.events] == [
        (1, "task", "accept", "srv", 0.0),
        (1, "timer", "timer", None, 1.0),  # fired after step 1; its task is step 2
        (2, "task", "timer", None, 1.0)]


def test_seed_drives_the_pump_random_source() -> None:
    assert Pump(seed=7).random.random() == Pump(seed=7).random.random()
    assert Pump(seed=7).random.random() != Pump(seed=8).random.random()


async def test_serve_runs_posted_tasks_and_timers_on_trio_time(autojump_clock: object) -> None:
    pump = Pump()
    done = trio.Event()
    seen: list[float] = []

    def later() -> None:
        seen.append(pump.now())
        done.set()

    async with trio.open_nursery() as nursery:
        await nursery.start(pump.serve)
        start = trio.current_time()
        pump.call_later(5.0, later)
        await done.wait()
        assert trio.current_time() - start == pytest.approx(5.0)
        assert seen == [pytest.approx(5.0)]
        # a task posted from a trio task wakes the idle pump
        woke = trio.Event()
        pump.post("deliver", woke.set)
        await woke.wait()
        with pytest.raises(RuntimeError, match="being served"):
            pump.run_until_idle()
        nursery.cancel_scope.cancel()
    # after serving, the virtual clock continues from where trio left it
    assert pump.now() == pytest.approx(5.0)


async def test_serve_lets_other_trio_tasks_run_between_batches(autojump_clock: object) -> None:
    pump = Pump()
    steps: list[int] = []

    def forever() -> None:
        pump.post("deliver", forever)

    async with trio.open_nursery() as nursery:
        await nursery.start(pump.serve)
        pump.post("deliver", forever)
        for _ in range(100):  # we get turns although the pump always has work ...
            await trio.lowlevel.checkpoint()
            steps.append(pump.step_number)
            if steps[-1] >= 10 * DEFAULT_SERVE_BATCH:
                break
        nursery.cancel_scope.cancel()
    assert steps[-1] >= 10 * DEFAULT_SERVE_BATCH  # ... and it keeps running between our turns
    assert max(b - a for a, b in zip(steps, steps[1:], strict=False)) <= 2 * DEFAULT_SERVE_BATCH


def test_run_until_idle_stops_loudly_when_only_periodic_timers_are_left() -> None:
    from pump import NeverIdleError

    pump = Pump()
    ran: list[float] = []

    def report() -> None:
        ran.append(pump.now())
        pump.call_later(1.0, report, periodic=True)

    pump.call_later(1.0, report, periodic=True)
    pump.call_later(2.5, lambda: ran.append(-1.0))  # one-shot work comes first
    with pytest.raises(NeverIdleError, match=r"only periodic timers are left at pump time 2\.5 "
                                             r"\(.*report.*\).*run_for"):
        pump.run_until_idle()
    assert ran == [1.0, 2.0, -1.0]
    assert pump.run_for(2.0) > 0 and ran[-2:] == [3.0, 4.0]  # driven for a time: fine
    assert pump.run_until_idle(max_steps=3) == 3  # a bounded run is the caller's choice
