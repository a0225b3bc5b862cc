"""Universe files as simulations: byte-identical traces from the command line, scripted
faults that every message survives, and a search by seed whose failures replay exactly."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from rdvpump.cli import app
from rdvpump.testing import run_simulation
from rdvpump.universe_file import load_universe, random_faults
from rdvpump.workloads import run_universe

from .procs import drain_pty

pytestmark = pytest.mark.slow  # real processes

ROOT = pathlib.Path(__file__).resolve().parents[2]
runner = CliRunner()


def rdvpump(*args: str, hashseed: str = "0") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rdvpump", *args], capture_output=True,
                          text=True, timeout=300,
                          env={**os.environ, "COLUMNS": "200", "PYTHONHASHSEED": hashseed})


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_universe_run_twice_writes_byte_identical_traces(tmp_path: pathlib.Path,
                                                         fmt: str) -> None:
    """Two processes, different hash seeds: the same file and seed give the same bytes."""
    traces = []
    for i, hashseed in enumerate(("1", "2", "2")):
        args = ["universe", "run", str(ROOT / "examples/echo.toml"), "--trace",
                str(tmp_path / str(i)), "--trace-format", fmt]
        if i == 2:
            args += ["--seed", "2"]
        proc = rdvpump(*args, hashseed=hashseed)
        assert proc.returncode == 0, proc.stderr
        (path,) = (tmp_path / str(i)).iterdir()
        traces.append(path.read_bytes())
    assert len(traces[0]) > 10_000
    assert traces[0] == traces[1]
    assert traces[2] != traces[0]  # --seed 2: another run (and another run id)


def test_the_faults_example_survives_its_faults_and_takes_their_time() -> None:
    spec = load_universe(ROOT / "examples/faults.toml")
    assert {f.action for f in spec.faults} == {"delay", "partition", "heal", "hold",
                                                "release"}
    result = run_simulation(run_universe, spec, seed=spec.seed)
    assert result.notes == []
    assert [r.verified for r in result.reports] == [True, True, True]
    echo1, echo2, stream = result.reports
    # client1 was partitioned from 0.05 s to 0.3 s, the stream held from 0.1 s to 0.4 s
    assert echo1.seconds > 0.3 > echo2.seconds
    assert stream.seconds > 0.4


def test_universe_run_names_the_clock_and_seed() -> None:
    result = runner.invoke(app, ["universe", "run", str(ROOT / "examples/faults.toml"),
                                 "--seed", "3"])
    assert result.exit_code == 0, result.output
    assert "virtual clock, seed 3" in result.output
    result = runner.invoke(app, ["universe", "run", str(ROOT / "examples/stream.toml"),
                                 "--clock", "real"])
    assert result.exit_code == 0 and "real clock" in result.output
    result = runner.invoke(app, ["universe", "run", str(ROOT / "examples/stream.toml"),
                                 "--clock", "wall"])
    assert result.exit_code == 1
    assert result.output == "error: --clock must be virtual or real, got 'wall'\n"


def test_random_faults_are_a_function_of_the_seed() -> None:
    spec = load_universe(ROOT / "examples/explore.toml")
    assert random_faults(spec, 5) == random_faults(spec, 5)
    assert random_faults(spec, 5) != random_faults(spec, 6)
    faults = random_faults(spec, 5)
    assert len(faults) == 4  # two faults, each undone
    assert all(0 <= f.at <= 0.6 for f in faults)


def test_explore_prints_failing_seeds_and_run_replays_one_exactly(
        tmp_path: pathlib.Path) -> None:
    proc = rdvpump("universe", "explore", str(ROOT / "examples/explore.toml"), "--seeds", "30")
    assert proc.returncode == 1, proc.stderr
    assert "rdvpump.link" not in proc.stderr  # the faults' link warnings are left out
    rows = [line.split("│")[1:3] for line in proc.stdout.splitlines()
            if line.startswith("│") and line.split("│")[1].strip().isdigit()]
    failing = {int(seed): why.strip() for seed, why in rows}
    assert failing, proc.stdout
    assert "of 30 seeds failed" in proc.stdout
    assert "crashed" in " ".join(failing.values())
    seed, why = next(iter(failing.items()))
    assert f"replay one: rdvpump universe run {ROOT / 'examples/explore.toml'} --seed {seed}" \
        in proc.stdout
    traces = []
    for i in range(2):
        run = rdvpump("universe", "run", str(ROOT / "examples/explore.toml"), "--seed",
                      str(seed), "--trace", str(tmp_path / str(i)), hashseed=str(i))
        assert run.returncode == 1
        assert why in run.stderr  # the same workload fails, the same way
        traces.append(next((tmp_path / str(i)).iterdir()).read_bytes())
    assert traces[0] == traces[1]
    passing = next(s for s in range(30) if s not in failing)
    run = rdvpump("universe", "run", str(ROOT / "examples/explore.toml"), "--seed",
                  str(passing))
    assert run.returncode == 0, run.stderr


def test_explore_needs_an_explore_table() -> None:
    result = runner.invoke(app, ["universe", "explore", str(ROOT / "examples/echo.toml")])
    assert result.exit_code == 1
    assert "no [explore] table" in result.output


def test_ctrl_c_stops_explore_and_keeps_the_failing_seeds_found_so_far() -> None:
    """Ctrl-C during a long search: the table of the seeds that failed so far, how many
    ran, "interrupted" last and exit 130; the progress bar (at a terminal: a pty here)
    is not broken into by the links' warnings."""
    import pty
    import re
    import signal
    import time

    terminal, tty = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "rdvpump", "universe", "explore",
         str(ROOT / "examples/explore.toml"), "--seeds", "100000"],
        stdout=subprocess.PIPE, stderr=tty, env={**os.environ, "COLUMNS": "200"})
    os.close(tty)
    try:
        shown = b""
        deadline = time.monotonic() + 120
        while not re.search(rb" [1-9]\d* failing", shown):  # a failing seed was found
            assert time.monotonic() < deadline and proc.poll() is None, shown[-2000:]
            shown += os.read(terminal, 65536)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        shown += drain_pty(terminal)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        os.close(terminal)
    said = shown.decode(errors="replace")
    assert proc.returncode == 130, said[-2000:]
    assert said.strip().splitlines()[-1].strip() == "interrupted"
    assert re.search(r"stopped after \d+ of 100000 seeds", said)
    assert "rdvpump.link" not in said and "Traceback" not in said
    rows = [line.split("│")[1] for line in out.decode().splitlines()
            if line.startswith("│") and line.split("│")[1].strip().isdigit()]
    assert rows, out.decode()
