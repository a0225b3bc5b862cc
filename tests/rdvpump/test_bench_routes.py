"""The route benchmarks at a small scale: what they report holds (not how fast)."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from rdvpump.bench import routes


def test_churn_traffic_compares_deltas_with_full_snapshots_on_the_same_churn() -> None:
    (result,) = routes.churn_traffic(servers=8, trackers=3, clients=3, seconds=60, seed=2)
    d = result.to_dict()
    assert d["baseline"] == "churn-subscriber-bytes-full-snapshots"
    assert d["detail"]["tables_equal"] and d["detail"]["churn_steps"] > 10
    assert d["detail"]["messages"] == d["detail"]["baseline_messages"]
    assert d["value"] < d["baseline_value"] and d["ratio"] > 1


def test_one_change_reaches_every_subscriber_and_costs_one_delta() -> None:
    wall, traffic = routes.one_change(servers=20, topics=5, subscribers=3, changes=3)
    assert wall.unit == "s" and wall.value > 0
    # one server's ServerInfo per subscriber per change, against the whole table
    assert traffic.ratio is not None and traffic.ratio > 3  # a full snapshot would be ~1


def test_one_change_counts_its_bytes_once_for_all_its_subscribers() -> None:
    _, one = routes.one_change(servers=4, topics=5, subscribers=1, changes=2)
    _, three = routes.one_change(servers=4, topics=5, subscribers=3, changes=2)
    assert three.value == 3 * one.value  # each subscriber is sent the same delta
    assert three.baseline_value == 3 * one.baseline_value and three.ratio == one.ratio


@pytest.mark.slow
def test_bench_mq_moves_every_message_end_to_end(tmp_path: pathlib.Path) -> None:
    from rdvpump.bench import mq

    for durability in ("sync", "interval:1"):
        assert mq.ours(1024, 300, durability, tmp_path) > 0  # raises if any went missing
    assert mq.plain_append(1024, 300, "sync", tmp_path) > 0
    if shutil.which("nats-server") is not None:  # the NATS JetStream peer, to the end
        assert mq.nats_jetstream(1024, 300, tmp_path) > 0
    assert list(tmp_path.iterdir()) == []  # every temporary file removed


@pytest.mark.slow
@pytest.mark.parametrize("sink", ["batch", "messages"])
def test_bench_cluster_gives_every_client_every_message(sink: str) -> None:
    """Two fanout servers with two groups each: every one of the four clients received
    all 300 messages (the run waits for that), and the figure says so."""
    proc = subprocess.run([sys.executable, "-m", "rdvpump", "bench", "cluster", "--brokers",
                           "2", "--queues", "2", "--messages", "300", "--no-isr", "--json",
                           "--sink", sink], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (result,) = [json.loads(line) for line in proc.stdout.splitlines()]
    assert (result["case"], result["brokers"], result["queues"], result["messages"],
            result["in_flight"], result["sink"]) == ("cluster-xsr", 2, 2, 300, 2, sink)
    # the CPU of each kind of process over the run, and a delivery's share of it
    assert set(result["cpu_s"]) == {"root", "fanout", "clients", "faucet"}
    # (a run this short may use less than the clock's tick of CPU: zeros are fine here)
    assert all(seconds >= 0 for seconds in result["cpu_s"].values())
    assert result["cpu_us_per_delivery"] >= 0
    assert result["deliveries_per_s"] > 0 and result["ratio"] == round(
        result["deliveries_per_s"] / 480_000, 3)


def test_a_clients_process_that_says_nothing_is_named_not_a_timeout() -> None:
    """``bench cluster`` waits for each clients process's ``done`` within its deadline: a
    process silent past it is an error saying so (not trio's bare TooSlowError), and it
    is reaped."""
    import trio
    import trio.testing

    from rdvpump._errors import RunError
    from rdvpump.bench.cluster import DEADLINE, _expect, _Lines

    async def main() -> None:
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-c", "import time; time.sleep(600)"], stdout=subprocess.PIPE)
        try:
            with pytest.raises(RunError) as info:
                await _expect(_Lines(proc), "done")
        finally:
            proc.kill()
            await proc.wait()
            assert proc.stdout is not None
            await proc.stdout.aclose()  # its pipe too: this process's descriptors are counted
        assert str(info.value) == (f"a clients process said nothing for {DEADLINE:.0f} s "
                                   "(waiting for 'done'): the cluster stopped delivering "
                                   "to it")

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_cpu_seconds_counts_what_a_process_used_until_it_is_reaped() -> None:
    from rdvpump.bench.cluster import cpu_seconds

    spin = subprocess.Popen([sys.executable, "-c", "import time\nend = time.process_time() "
                             "+ 0.3\nwhile time.process_time() < end: pass"])
    try:
        # ended, not reaped yet (WNOWAIT): its times are still there
        os.waitid(os.P_PID, spin.pid, os.WEXITED | os.WNOWAIT)
        used = cpu_seconds({"spin": [spin.pid], "none": []})
    finally:
        spin.kill()
        spin.wait(timeout=30)
    assert used is not None and used["none"] == 0 and 0.25 <= used["spin"] < 5  # (ticks)
    assert cpu_seconds({"gone": [2 ** 22 + 7]}) is None  # no such process
