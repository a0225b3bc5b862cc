"""The replay job on real Spark (local mode): clean traces pass, edited ones are caught exactly."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
from typing import Any

import pytest
import trio

from rdvpump.workloads import load_universe, run_in_process
from replay import TraceError, analyze

pytestmark = pytest.mark.spark
ROOT = pathlib.Path(__file__).resolve().parents[2]


def record_echo(directory: pathlib.Path, fmt: str = "jsonl") -> pathlib.Path:
    """The echo example in one process, traced; return the trace file."""
    spec = load_universe(ROOT / "examples/echo.toml")
    reports = trio.run(lambda: run_in_process(spec, trace_dir=str(directory), trace_format=fmt))
    assert all(r.verified for r in reports)
    (path,) = directory.glob(f"*.{fmt}")
    return path


@pytest.fixture(scope="module")
def clean_jsonl(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return record_echo(tmp_path_factory.mktemp("clean"))


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_a_clean_trace_has_no_violations(spark: Any, tmp_path: pathlib.Path, fmt: str) -> None:
    trace = record_echo(tmp_path / "traces", fmt)
    summary = analyze(spark, str(trace.parent), str(tmp_path / "out"))
    assert summary["violation_count"] == 0
    assert summary["messages_sent"] == summary["messages_delivered"] == 8000
    assert summary["messages_matched"] == 8000 and summary["undelivered_count"] == 0
    assert summary["links"] == 2 and summary["latency_s"]["p50"] > 0
    assert summary["message_size"] == {"min": 64, "mean": 544.0, "max": 1024}
    out = tmp_path / "out"
    for table in ("links", "violations", "undelivered", "latency", "throughput", "refusals",
                  "sizes"):
        assert any((out / table).glob("*.parquet")), table
    assert json.loads((out / "summary.json").read_text())["violation_count"] == 0
    for plot in ("throughput.png", "latency.png"):
        assert (out / plot).read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_edited_trace_is_flagged_exactly(spark: Any, clean_jsonl: pathlib.Path,
                                         tmp_path: pathlib.Path) -> None:
    rows = [json.loads(line) for line in clean_jsonl.read_text().splitlines()]
    deliver = [i for i, r in enumerate(rows) if r["kind"] == "deliver" and r["link"] ==
               "server/1" and r["dir"] == "ca"]
    send = [i for i, r in enumerate(rows) if r["kind"] == "send" and r["link"] == "server/2"
            and r["dir"] == "ac"]
    # Swap the sequence numbers of two consecutive deliveries (delivered out of order) ...
    a, b = deliver[100], deliver[101]
    rows[a]["seq"], rows[b]["seq"] = rows[b]["seq"], rows[a]["seq"]
    swapped = rows[a]["seq"]
    # ... drop one send (its delivery was never sent) and deliver one message twice.
    dropped = rows[send[50]]["seq"]
    dup = deliver[300]
    edited = [*rows[:dup + 1], dict(rows[dup]), *rows[dup + 1:]]
    edited = [r for i, r in enumerate(edited) if i != (send[50] if send[50] <= dup
                                                        else send[50] + 1)]
    traces = tmp_path / "edited"
    traces.mkdir()
    (traces / "edited.echo.jsonl").write_text("".join(json.dumps(r) + "\n" for r in edited))
    summary = analyze(spark, str(traces))
    found = {(v["violation"], v["link"], v["dir"], v["seq"]) for v in summary["violations"]}
    assert found == {
        ("out of order", "server/1", "ca", swapped - 1),
        ("delivered but never sent", "server/2", "ac", dropped),
        ("duplicate delivery", "server/1", "ca", rows[dup]["seq"]),
    }
    assert summary["violation_count"] == 3


def test_a_corrupt_line_is_reported_and_the_rest_analysed(
        spark: Any, clean_jsonl: pathlib.Path, tmp_path: pathlib.Path) -> None:
    lines = clean_jsonl.read_text().splitlines(keepends=True)
    lines.insert(41, '{"v":3,"run":"echo-1","pump":"echo","step":\n')
    traces = tmp_path / "corrupt"
    traces.mkdir()
    (traces / "t.echo.jsonl").write_text("".join(lines))
    summary = analyze(spark, str(traces))
    assert summary["corrupt_line_count"] == 1
    (bad,) = summary["corrupt_lines"]
    assert bad["file"].endswith("t.echo.jsonl") and bad["line"] == 42
    assert summary["violation_count"] == 0 and summary["messages_matched"] == 8000


def test_clear_errors_for_missing_empty_and_other_versions(
        spark: Any, clean_jsonl: pathlib.Path, tmp_path: pathlib.Path) -> None:
    with pytest.raises(TraceError, match="no such trace directory"):
        analyze(spark, str(tmp_path / "nowhere"))
    (tmp_path / "none").mkdir()
    with pytest.raises(TraceError, match=r"no trace files \(\*.jsonl, \*.parquet\)"):
        analyze(spark, str(tmp_path / "none"))
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "e.p.jsonl").write_text("")
    with pytest.raises(TraceError, match="hold no events"):
        analyze(spark, str(tmp_path / "empty"))
    old = tmp_path / "old"
    old.mkdir()
    shutil.copy(clean_jsonl, old / "new.echo.jsonl")
    (old / "old.echo.jsonl").write_text(
        '{"v":2,"step":0,"time":0.0,"kind":"clock","reason":"12.5"}\n')
    with pytest.raises(TraceError, match=r"version 3 expected: .*old\.echo\.jsonl has version 2"
                                         r".*record the run again"):
        analyze(spark, str(old))


@pytest.mark.slow
def test_a_multi_process_universe_is_joined_across_its_traces(
        spark: Any, tmp_path: pathlib.Path) -> None:
    traces = tmp_path / "traces"
    proc = subprocess.run([sys.executable, "-m", "rdvpump",
                           "universe", "up", str(ROOT / "examples/echo.toml"),
                           "--trace", str(traces), "--run", "mp"],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "COLUMNS": "160"})
    assert proc.returncode == 0, proc.stderr
    files = sorted(p.name for p in traces.iterdir())
    assert files == ["mp.client1.jsonl", "mp.client2.jsonl", "mp.manager.jsonl",
                     "mp.server.jsonl"]
    summary = analyze(spark, str(traces))
    assert summary["violation_count"] == 0
    assert summary["pumps"] == ["client1", "client2", "manager", "server"]
    # every echo crossed processes twice: client -> server, and back
    assert summary["messages_across_pumps"] >= 2 * 4000
    assert summary["latency_s"]["p50"] > 0  # clocks aligned: no negative latencies
    assert summary["latency_s"]["p50"] < 1.0


@pytest.mark.slow
def test_spark_submit_runs_the_job_file_unchanged(clean_jsonl: pathlib.Path,
                                                  tmp_path: pathlib.Path) -> None:
    pyspark = pytest.importorskip("pyspark")
    submit = pathlib.Path(pyspark.__file__).parent / "bin" / "spark-submit"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1",
           "PYSPARK_DRIVER_PYTHON": sys.executable}
    proc = subprocess.run([str(submit), "--master", "local[2]",
                           "--conf", "spark.ui.enabled=false",
                           "--driver-java-options",
                           f"-Dlog4j.configurationFile=file:{ROOT / 'tests/log4j2.properties'}",
                           str(ROOT / "replay/job.py"), "--traces", str(clean_jsonl.parent),
                           "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["violation_count"] == 0 and summary["messages_matched"] == 8000
