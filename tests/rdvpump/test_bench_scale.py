"""``rdvpump bench scale``: its steps, a stopped step reported with its step, and the
command's errors in one line.  (Its figures come from full runs: bench/RESULTS.md; the
benchmark page's block runs it whole at a smoke size.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rdvpump.bench import scale


def test_a_smoke_run_shrinks_each_dimension_by_its_fraction() -> None:
    assert scale.steps_at("topics", 1.0) == [1, 100, 1000, 10000]
    assert scale.steps_at("topics", 0.1) == [1, 10, 100, 1000]
    assert scale.steps_at("groups", 0.01) == [1, 10]  # steps that meet are one


def test_a_step_is_measured_against_the_smallest_and_a_stopped_one_says_so() -> None:
    first = scale.ScaleResult("groups", 1, operations=1000, seconds=1.0,
                              latencies=[0.001] * 99 + [0.05], memory_bytes=100_000)
    later = scale.ScaleResult("groups", 10, operations=1500, seconds=1.0,
                              latencies=[0.002] * 100, memory_bytes=500_000,
                              baseline_per_s=first.per_s,
                              baseline_memory_per_unit=first.memory_per_unit)
    row = later.to_dict()
    assert (row["groups"], row["per_s"], row["ratio"]) == (10, 1500.0, 1.5)
    assert row["memory_per_unit_ratio"] == 0.5  # 50 KB a group against 100 KB: sublinear
    assert first.to_dict()["p99_ms"] == 1.0 and first.to_dict()["p50_ms"] == 1.0
    stopped = scale.ScaleResult("topics", 10000, error="stopped: not done within 300 s")
    assert stopped.to_dict() == {"case": "scale-topics", "dimension": "topics",
                                 "topics": 10000, "operations": "publishes",
                                 "error": "stopped: not done within 300 s"}


def test_a_topics_step_counts_the_files_it_holds_open_one_a_topic() -> None:
    one, twenty = (scale._step("topics", n, 200, 60.0) for n in (1, 20))
    assert one.error is None and twenty.error is None
    assert one.open_files is not None and twenty.open_files is not None
    assert twenty.open_files - one.open_files == 19  # each topic's last segment
    assert twenty.to_dict()["open_files"] == twenty.open_files


def test_a_replicated_step_publishes_to_a_master_whose_slave_holds_every_topic() -> None:
    """Every publish of the step answered (each waits for the slave under ``sync``), and
    each topic holds a file on the master and one on its slave."""
    one, three = (scale._step("replicated", n, 200, 60.0) for n in (1, 3))
    assert one.error is None and three.error is None
    assert one.operations == three.operations == 200
    assert one.open_files is not None and three.open_files is not None
    assert three.open_files - one.open_files == 4
    assert three.to_dict()["topics"] == 3


@pytest.mark.slow  # a process; 1,000 topics declared, each durable, take seconds
def test_a_step_past_its_deadline_is_reported_with_its_step_and_fails_the_command() -> None:
    proc = subprocess.run([sys.executable, "-m", "rdvpump", "bench", "scale", "--json",
                           "--dimension", "topics", "--deadline", "1"],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "RDVPUMP_BENCH_SCALE": "0.1"})
    assert proc.returncode == 1, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [r["topics"] for r in rows] == [1, 10, 100, 1000]
    assert all("per_s" in r for r in rows[:2])  # a topic or ten: measured in time
    assert rows[-1]["error"] == "stopped: not done within 1 s"  # a thousand: not
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and last.endswith(
        "topics at 1,000: stopped: not done within 1 s")


@pytest.mark.slow  # a process
def test_an_unknown_dimension_is_one_line_and_exit_1() -> None:
    proc = subprocess.run([sys.executable, "-m", "rdvpump", "bench", "scale",
                           "--dimension", "queues"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "error: --dimension must be one of brokers, topics, groups, consumers, replicated, "
        "servers, got 'queues'"]
