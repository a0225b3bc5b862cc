"""rdvpump trace analyze and trace diagram, as a user runs them: one file or a directory,
clear errors before anything starts, and no Spark noise on the terminal."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import types
from typing import Any

import pytest
from typer.testing import CliRunner

from rdvpump.cli import app

ROOT = pathlib.Path(__file__).resolve().parents[2]
runner = CliRunner()


def rdvpump(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rdvpump", *args], capture_output=True,
                          text=True, timeout=300, env=env or {**os.environ, "COLUMNS": "120"})


def echo_trace(directory: pathlib.Path) -> pathlib.Path:
    proc = rdvpump("universe", "run", str(ROOT / "examples/echo.toml"), "--trace",
                   str(directory))
    assert proc.returncode == 0, proc.stderr
    (path,) = directory.glob("*.jsonl")
    return path


def one_send(directory: pathlib.Path) -> pathlib.Path:
    """A trace directory of one event (a message sent): enough for Spark to start on."""
    from replay import SCHEMA_VERSION

    directory.mkdir()
    (directory / "t.p.jsonl").write_text(json.dumps(
        {"v": SCHEMA_VERSION, "run": "r", "pump": "p", "step": 0, "time": 0.0,
         "kind": "send", "broker": "b", "link": "b/1", "dir": "ca", "seq": 0,
         "size": 8}) + "\n")
    return directory


@pytest.mark.slow  # starts processes
def test_analyze_one_file_writes_beside_it_in_this_process(tmp_path: pathlib.Path) -> None:
    """A small trace is analysed without a JVM (--engine auto), beside the file."""
    trace = echo_trace(tmp_path / "traces")
    proc = rdvpump("trace", "analyze", str(trace), "--json", "--verbose")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["engine"] == "local" and summary["spark_jobs"] == 0
    assert summary["messages_matched"] == 8000 and summary["violation_count"] == 0
    out = trace.with_name("echo-1.echo.analysis")
    assert (out / "summary.json").is_file() and (out / "links.png").is_file()
    assert not (out / "spark.log").exists() and "Spark" not in proc.stderr

    # the CLI's process leaves pandas out (pyarrow would import it for nothing), and
    # gives what the analysis gives in a process with pandas loaded
    import pandas  # noqa: F401

    from replay.analysis import analyze

    again = subprocess.run([sys.executable, "-c", _SAYS_IF_PANDAS_WAS_LOADED, "trace",
                            "analyze", str(trace), "--out", str(tmp_path / "cli")],
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert again.stderr.splitlines()[-1] == "pandas loaded: False"
    here = analyze(str(trace), str(tmp_path / "here"))
    cli = json.loads((tmp_path / "cli" / "summary.json").read_text())
    assert {k: v for k, v in cli.items() if k != "out"} == {
        k: v for k, v in json.loads(json.dumps(here, default=str)).items() if k != "out"}
    for plot in ("throughput.png", "latency.png", "links.png"):
        assert (tmp_path / "cli" / plot).read_bytes() == (tmp_path / "here" / plot
                                                          ).read_bytes()


#: ``rdvpump ARGS``, then a last line on stderr: whether pandas was loaded by the end.
_SAYS_IF_PANDAS_WAS_LOADED = """
import atexit, runpy, sys
atexit.register(lambda: print("pandas loaded:", "pandas" in sys.modules, file=sys.stderr))
sys.argv = ["rdvpump", *sys.argv[1:]]
runpy.run_module("rdvpump", run_name="__main__")
"""


@pytest.mark.slow  # starts processes
def test_runs_on_two_clocks_in_one_directory_are_analysed_each_on_its_own_axis(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The traces guide's recipe: a run on the virtual clock and one on the real clock (a
    process per broker, found through the name service), their traces in one directory.
    Each run's times start at its own first event: the analysis spans the longer run
    (not the hours between them), names each run with its clock and figures, gives no
    rate over both, and plots each run's brokers and links apart, the name service's
    left out."""
    traces = tmp_path / "traces"
    echo_trace(traces)  # the virtual clock
    real = rdvpump("universe", "up", str(ROOT / "examples/echo.toml"), "--trace",
                   str(traces), "--run", "r2")  # a process per broker, and a manager
    assert real.returncode == 0, real.stderr
    out = tmp_path / "analysis"
    proc = rdvpump("trace", "analyze", str(traces), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    runs = summary["by_run"]
    assert sorted(runs) == sorted(summary["runs"]) and len(runs) == 2 and "r2" in runs
    (virtual,) = [name for name in runs if name != "r2"]
    assert runs["r2"]["clock"] == "real" and runs[virtual]["clock"] == "virtual"
    assert summary["duration_s"] == max(r["duration_s"] for r in runs.values()) < 60
    assert summary["delivered_per_s"] is None and runs["r2"]["delivered_per_s"] > 0
    assert runs["r2"]["latency_s"]["p50"] > 0
    assert sum(r["messages_matched"] for r in runs.values()) == summary["messages_matched"]
    for name in runs:
        assert f"run {name} ({runs[name]['clock']} clock" in proc.stdout, proc.stdout
    # the plots: each run's brokers apart, the name service's links and messages left out
    from replay import analyze, plots

    drawn: dict[str, Any] = {}
    monkeypatch.setattr(plots, "throughput", lambda *a, **k: drawn.update(brokers=a[1]))
    monkeypatch.setattr(plots, "timeline", lambda *a, **k: drawn.update(links=a[1]))
    analyze(str(traces), str(tmp_path / "again"))
    assert set(drawn["brokers"]) == {f"{run}:{broker}" for run in runs
                                     for broker in ("server", "client1", "client2")}
    assert {x["link"] for x in drawn["links"]} == {f"{run}:server/{n}" for run in runs
                                                   for n in (1, 2)}


@pytest.mark.spark
def test_analyze_on_spark_keeps_spark_quiet(tmp_path: pathlib.Path) -> None:
    trace = echo_trace(tmp_path / "traces")
    proc = rdvpump("trace", "analyze", str(trace), "--json", "--engine", "spark")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["engine"] == "spark" and summary["spark_jobs"] > 0
    assert summary["messages_matched"] == 8000 and summary["violation_count"] == 0
    out = trace.with_name("echo-1.echo.analysis")
    assert (out / "summary.json").is_file() and (out / "links.png").is_file()
    # the JVM's and Spark's own lines go to the log, not to the terminal
    for noise in ("Using incubator modules", "log4j", "setLogLevel", "NativeCodeLoader"):
        assert noise not in proc.stderr and noise not in proc.stdout, noise
    assert "Using incubator modules" in (out / "spark.log").read_text()


@pytest.mark.slow  # starts processes
@pytest.mark.parametrize("command", ["trace analyze", "bench replay"])
def test_a_spark_that_will_not_start_is_one_line_saying_why(tmp_path: pathlib.Path,
                                                         command: str) -> None:
    """Spark's JVM refusing an option (here one JAVA_TOOL_OPTIONS gives it), and Spark
    refusing the master, are each one line with the JVM's or Spark's own reason (and,
    for ``trace analyze``, where the rest of their output is), exit 1."""
    pytest.importorskip("pyspark")
    if shutil.which("java") is None:
        pytest.skip("needs Java: the JVM is to be started and refuse")
    traces = one_send(tmp_path / "traces")
    out = tmp_path / "out"

    def run(master: str, env: dict[str, str]) -> str:
        args = (["trace", "analyze", str(traces), "--engine", "spark", "--out", str(out),
                 "--master", master] if command == "trace analyze" else
                ["bench", "replay", "--events", "10000", "--master", master, "--no-floor"])
        proc = rdvpump(*args, env={**os.environ, **env})
        assert proc.returncode == 1 and proc.stdout == "", proc.stderr
        return proc.stderr.strip()

    def said(master: str, reason: str) -> str:
        return (f"error: {reason} (all it printed is in {out}/spark.log)"
                if command == "trace analyze" else
                f"error: the Spark run (job, {master}) failed: {reason}")

    assert run("local[1]", {"JAVA_TOOL_OPTIONS": "-XX:CICompilerCount=1"}) == said(
        "local[1]", "Spark's JVM ended before it started: CICompilerCount (1) must be at "
        "least 2")
    # Spark refusing the master once its JVM is up: Spark's own reason (``bench replay``
    # refuses a master Spark would not parse before it generates a trace: there, one that
    # Spark parses and refuses, a spark:// URL without a port)
    bad, reason = (("local[x]", "Could not parse Master URL: 'local[x]'")
                   if command == "trace analyze" else
                   ("spark://127.0.0.1", "Invalid master URL: spark://127.0.0.1"))
    assert run(bad, {}) == said(bad, f"Spark did not start on {bad}: {reason}")


def test_bench_replay_refuses_a_master_spark_would_not_parse_before_anything_runs() -> None:
    result = runner.invoke(app, ["bench", "replay", "--master", "local[2]", "--master",
                                 "local[x]", "--no-floor"])
    assert result.exit_code == 1
    assert " ".join(result.output.split()) == (
        "error: 'local[x]' is no Spark master: local, local[N], local[*], local[N,F], "
        "local-cluster[...], spark://HOST:PORT, yarn or k8s://...")


@pytest.mark.spark
def test_a_job_that_fails_on_spark_is_one_line_saying_why(tmp_path: pathlib.Path) -> None:
    """The workers' Python without pyarrow (here a Python that refuses to import it): the
    failed job is one line with the worker's error, exit 1."""
    blocked = tmp_path / "blocked"
    (blocked / "pyarrow").mkdir(parents=True)
    (blocked / "pyarrow" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'pyarrow'\")\n")
    worker = tmp_path / "python"
    worker.write_text(f"#!/bin/sh\nPYTHONPATH={blocked}${{PYTHONPATH:+:$PYTHONPATH}} "
                      f"exec {sys.executable} \"$@\"\n")
    worker.chmod(0o755)
    traces = one_send(tmp_path / "traces")
    out = tmp_path / "out"
    proc = rdvpump("trace", "analyze", str(traces), "--engine", "spark", "--out", str(out),
                   env={**os.environ, "PYSPARK_PYTHON": str(worker)})
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.strip() == (
        "error: the analysis failed on Spark: ModuleNotFoundError: No module named "
        f"'pyarrow' (all Spark printed is in {out}/spark.log)"), proc.stderr


@pytest.mark.slow  # starts processes
def test_a_file_that_is_not_a_trace_is_named_so(tmp_path: pathlib.Path) -> None:
    other = tmp_path / "notes.jsonl"
    other.write_text("hello\n")
    proc = rdvpump("trace", "analyze", str(other), "--out", str(tmp_path / "out"))
    assert proc.returncode == 1
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"error: no trace events in {other}: none of its 1 lines is a "
                           "trace row")


@pytest.mark.slow  # starts processes
def test_a_trace_of_another_version_is_refused_before_spark_starts(
        tmp_path: pathlib.Path) -> None:
    """The version is read from the first row of each file before an engine starts: on
    Spark the error comes without a JVM (which takes seconds to start)."""
    old = tmp_path / "old"
    old.mkdir()
    (old / "old.echo.jsonl").write_text(
        '{"v":2,"step":0,"time":0.0,"kind":"clock","reason":"12.5"}\n')
    out = tmp_path / "out"
    proc = rdvpump("trace", "analyze", str(old), "--engine", "spark", "--out", str(out))
    assert proc.returncode == 1
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"error: trace schema version 3 expected: {old}/old.echo.jsonl has "
                           "version 2; traces of an older schema are not read"), line
    assert not out.exists()  # nothing started: Spark's log would be there


@pytest.mark.slow  # starts processes
def test_a_parquet_file_that_is_no_trace_is_one_clear_line(tmp_path: pathlib.Path) -> None:
    """pyarrow reads the Parquet traces: a file it cannot read, and a Parquet file
    without the trace's columns (an older schema), are each one line, exit 1."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "a.p.parquet").write_bytes(b"PAR1 this is not Parquet")
    old = tmp_path / "old"
    old.mkdir()
    pq.write_table(pa.table({"v": pa.array([2], pa.int32()), "step": [0], "time": [0.0],
                             "kind": ["clock"]}), old / "o.p.parquet")
    line = ""
    for traces, start in ((broken, f"error: cannot read the Parquet trace {broken}/a.p.parquet"),
                          (old, "error: Parquet traces lack the columns run, pump, ")):
        proc = rdvpump("trace", "analyze", str(traces), "--out", str(tmp_path / "out"))
        assert proc.returncode == 1, proc.stderr
        (line,) = proc.stderr.strip().splitlines()
        assert line.startswith(start), line
        assert "Traceback" not in proc.stderr
    assert "found 2; traces of an older schema are not read" in line


@pytest.mark.slow  # starts processes
def test_without_java_analyze_says_so_before_starting(tmp_path: pathlib.Path) -> None:
    (tmp_path / "t.p.jsonl").write_text("{}\n")
    bare = {**os.environ, "PATH": str(pathlib.Path(sys.executable).parent)}
    for args in (["--engine", "spark"], ["--master", "local[1]"]):
        proc = rdvpump("trace", "analyze", str(tmp_path), *args, env=bare)
        assert proc.returncode == 1
        assert proc.stderr.strip() == (
            "error: trace analyze --engine spark runs Spark, which needs Java 17 or 21 on "
            "PATH (for example: apt-get install openjdk-17-jre-headless)")
    # without Java, a small trace is still analysed, in this process
    proc = rdvpump("trace", "analyze", str(tmp_path), env=bare)
    assert proc.returncode == 1 and "none of its 1 lines is a trace row" in proc.stderr


def test_traces_too_large_for_this_process_without_spark_name_both_ways(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--engine auto`` picked Spark by the traces' size (here made small): without
    pyspark, or without Java, the error says why Spark and offers ``--engine local``."""
    from replay import sources

    (tmp_path / "t.p.jsonl").write_text("{}\n")
    monkeypatch.setattr(sources, "LOCAL_BYTES", {"jsonl": 1, "parquet": 1})
    why = ("error: traces this large (over about 400,000 events: 64 MB of JSON Lines, 8 MB "
           "of Parquet) are analysed on Spark")
    instead = "; or --engine local, with every row in this process's memory"
    monkeypatch.setitem(sys.modules, "pyspark", None)  # import pyspark fails
    result = runner.invoke(app, ["trace", "analyze", str(tmp_path)])
    assert result.exit_code == 1
    assert " ".join(result.output.split()) == f"{why}: pip install 'rdvpump[spark]'{instead}"
    # pyspark found (the import is all the check does), no java on PATH
    monkeypatch.setitem(sys.modules, "pyspark", types.ModuleType("pyspark"))
    monkeypatch.setattr(shutil, "which", lambda name: None)
    result = runner.invoke(app, ["trace", "analyze", str(tmp_path)])
    assert result.exit_code == 1
    assert " ".join(result.output.split()) == (
        f"{why}, which needs Java 17 or 21 on PATH (for example: apt-get install "
        f"openjdk-17-jre-headless){instead}")


def test_engine_and_master_are_checked_before_anything_starts(tmp_path: pathlib.Path) -> None:
    (tmp_path / "t.p.jsonl").write_text("{}\n")
    for args, why in ((["--engine", "gpu"], "--engine must be auto, local or spark, got 'gpu'"),
                      (["--engine", "local", "--master", "local[2]"],
                       "--master runs the analysis on Spark: it cannot go with --engine local")):
        result = runner.invoke(app, ["trace", "analyze", str(tmp_path), *args])
        assert result.exit_code == 1
        assert " ".join(result.output.split()) == f"error: {why}"


def test_without_the_spark_extra_analyze_names_it(tmp_path: pathlib.Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "t.p.jsonl").write_text("{}\n")
    monkeypatch.setitem(sys.modules, "pyspark", None)  # import pyspark fails
    result = runner.invoke(app, ["trace", "analyze", str(tmp_path), "--engine", "spark"])
    assert result.exit_code == 1
    assert "pip install 'rdvpump[spark]'" in result.output
    assert "Traceback" not in result.output


def test_without_the_replay_extra_analyze_names_it(tmp_path: pathlib.Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The local engine needs pyarrow and matplotlib, not pyspark: the smaller extra."""
    (tmp_path / "t.p.jsonl").write_text("{}\n")
    monkeypatch.setitem(sys.modules, "replay", None)  # its imports (pyarrow, ...) fail
    result = runner.invoke(app, ["trace", "analyze", str(tmp_path)])
    assert result.exit_code == 1
    assert result.output == ("error: trace analyze needs pyarrow and matplotlib: pip install "
                             "'rdvpump[replay]'\n")


def test_diagram_of_a_directory_names_a_file_in_it(tmp_path: pathlib.Path) -> None:
    (tmp_path / "r.p.jsonl").write_text("")
    result = runner.invoke(app, ["trace", "diagram", str(tmp_path), "--link", "a/1"])
    assert result.exit_code == 1
    assert f"{tmp_path} is a directory: trace diagram reads one trace file, for example " \
           f"{tmp_path / 'r.p.jsonl'}" in " ".join(result.output.split())
