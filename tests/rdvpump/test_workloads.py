"""Universe files: every example runs, bad files get one clear line, `up` reaps its children."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from rdvpump.cli import app
from rdvpump.testing import run_simulation
from rdvpump.universe_file import UniverseFileError, load_universe
from rdvpump.workloads import run_in_process

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.toml"))
runner = CliRunner()


def test_there_are_examples() -> None:
    assert {p.name for p in EXAMPLES} >= {"echo.toml", "stream.toml", "fanout.toml"}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_runs_in_one_process_and_checks_out(path: pathlib.Path) -> None:
    spec = load_universe(path)
    simulated = bool(spec.faults or spec.explore)  # faults act on virtual time
    reports = run_simulation(run_in_process, spec, seed=spec.seed,
                             clock="virtual" if simulated else "real")
    assert [r.label for r in reports] == [w.label for w in spec.workloads]
    for r, w in zip(reports, spec.workloads, strict=True):
        assert r.verified
        assert r.messages == w.messages * len(w.targets)
        assert r.bytes == r.messages * w.size


def test_universe_run_prints_the_reports() -> None:
    result = runner.invoke(app, ["universe", "run", str(ROOT / "examples/stream.toml")])
    assert result.exit_code == 0, result.output
    assert "stream producer->sink:7" in result.output and "ok" in result.output


BAD = [
    ("[universe\n", "not valid TOML"),
    ('[universe]\nname = "u"\ncolour = "red"\n[[broker]]\nid = "a"\n', "unknown field 'colour'"),
    ('[universe]\nname = "u"\n', "at least one [[broker]]"),
    ('[universe]\nname = "u"\n[[broker]]\nid = "a"\n[[workload]]\nkind = "echo"\nfrom = "a"\n'
     'to = "b"\nmessages = 1\nsize = 1\n', "unknown broker 'b'"),
    ('[universe]\nname = "u"\n[[broker]]\nid = "a"\n[[workload]]\nkind = "teleport"\n',
     "kind must be one of"),
    ('[universe]\nname = "u"\n[[broker]]\nid = "a"\n[[workload]]\nkind = "stream"\nfrom = "a"\n'
     'to = "a"\nsize = 1\n', "missing field 'messages'"),
    ('[universe]\nname = "u"\nring_capacity = 1000\n[[broker]]\nid = "a"\n', "power of two"),
    ('[universe]\nname = "u"\n[[broker]]\nid = "a"\n[[broker]]\nid = "a"\n', "duplicate"),
    ('[universe]\nname = "u"\n[[broker]]\nid = "a"\n[[fault]]\nat = 1\naction = "melt"\n',
     "[[fault]] #1: action must be one of partition, heal, hold, release, delay, drop, crash, "
     "restart, got 'melt'"),
    ('[universe]\nname = "u"\n[[broker]]\nid = "a"\n[[fault]]\nat = -1\naction = "crash"\n'
     'broker = "a"\n', "at must be a number of seconds >= 0, got -1"),
    ('[universe]\nname = "u"\n[[broker]]\nid = "a"\n[[fault]]\nat = 0\naction = "crash"\n'
     'broker = "b"\n', "[[fault]] #1: unknown broker 'b'"),
    ('[universe]\nname = "u"\n[[broker]]\nid = "a"\n[[fault]]\nat = 0\naction = "hold"\n'
     'link = ["a"]\n', 'link must name two brokers, ["from", "to"]'),
    ('[universe]\nname = "u"\n[[broker]]\nid = "a"\n[[fault]]\nat = 0\naction = "drop"\n'
     'link = ["a", "a"]\n', "drop needs 'probability'"),
    ('[universe]\nname = "u"\n[[broker]]\nid = "a"\n[[fault]]\nat = 0\naction = "crash"\n'
     'broker = "a"\nlink = ["a", "a"]\n', "[[fault]] #1: unknown field 'link'"),
    ('[universe]\nname = "u"\n[[broker]]\nid = "a"\n[explore]\nactions = ["heal"]\n',
     "[explore]: actions must be a list of partition, hold, delay, drop or crash"),
]


@pytest.mark.parametrize(("text", "message"), BAD)
def test_bad_universe_files_name_the_problem(tmp_path: pathlib.Path, text: str,
                                             message: str) -> None:
    path = tmp_path / "u.toml"
    path.write_text(text)
    with pytest.raises(UniverseFileError, match=message.replace("[", r"\[")):
        load_universe(path)
    result = runner.invoke(app, ["universe", "run", str(path)])
    assert result.exit_code == 1
    assert result.output.startswith(f"error: {path}")
    assert message in result.output


def test_a_file_that_is_not_text_is_named_so(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "u.toml"
    path.write_bytes(b'[universe]\nname = "\xa7"\n')  # not UTF-8
    result = runner.invoke(app, ["universe", "run", str(path)])
    assert result.exit_code == 1
    assert result.output == (f"error: {path}: not valid TOML: not UTF-8 text (byte 0xa7 at "
                             "offset 19)\n")


def test_missing_file(tmp_path: pathlib.Path) -> None:
    result = runner.invoke(app, ["universe", "up", str(tmp_path / "nope.toml")])
    assert result.exit_code == 1 and "no such file" in result.output


@pytest.mark.slow
@pytest.mark.parametrize("name, label", [("fanout.toml", "fanout faucet->q1,q2,q3,q4:5672"),
                                         ("mq.toml", "mq app->server:15555")])
def test_universe_up_runs_one_process_per_broker(name: str, label: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "rdvpump",
                           "universe", "up", str(ROOT / "examples" / name)],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "COLUMNS": "160"})
    assert proc.returncode == 0, proc.stderr
    assert label in proc.stdout
    assert "exited 0" in proc.stdout and "FAILED" not in proc.stdout


def _children(pid: int) -> set[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True,
                         text=True).stdout
    return {int(x) for x in out.split()}


@pytest.mark.slow
def test_ctrl_c_on_universe_up_stops_and_reaps_every_child(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "long.toml"
    path.write_text('[universe]\nname = "long"\n[[broker]]\nid = "p"\n[[broker]]\nid = "s"\n'
                    '[[workload]]\nkind = "stream"\nfrom = "p"\nto = "s"\nport = 1\n'
                    'messages = 100000000\nsize = 100\n')
    proc = subprocess.Popen([sys.executable, "-m", "rdvpump",
                             "universe", "up", str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while len(_children(proc.pid)) < 3:  # the manager and two brokers
            assert time.monotonic() < deadline, "children did not start"
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.05)  # polling the OS for processes, bounded by the deadline
        kids = _children(proc.pid)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 130  # the shell's convention for Ctrl-C
        assert "interrupted; finished before it: no workload" in stderr
        for kid in kids:  # every child was reaped, none left behind
            with pytest.raises(ProcessLookupError):
                os.kill(kid, 0)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_run_stopped_at_its_limit_reports_what_finished_and_what_did_not(
        tmp_path: pathlib.Path) -> None:
    """One stream done and checked at its sink, one whose link is held from the start
    still waiting at the limit: the run reports both (the second "did not finish"), on
    the virtual clock."""
    import functools

    from rdvpump.workloads import run_universe

    path = tmp_path / "two.toml"
    path.write_text('[universe]\nname = "two"\n'
                    + "".join(f'[[broker]]\nid = "{b}"\n' for b in ("a", "b", "c", "d"))
                    + '[[workload]]\nkind = "stream"\nfrom = "a"\nto = "b"\nport = 7\n'
                      'messages = 10\nsize = 64\n'
                      '[[workload]]\nkind = "stream"\nfrom = "c"\nto = "d"\nport = 8\n'
                      'messages = 100000\nsize = 64\n'
                      '[[fault]]\nat = 0.0\naction = "hold"\nlink = ["c", "d"]\n')
    spec = load_universe(path)
    result = run_simulation(functools.partial(run_universe, spec, limit=0.5), seed=1)
    short, long = result.reports
    assert short.verified, short.error
    assert not long.verified and long.error == "did not finish within 0.5 s"
