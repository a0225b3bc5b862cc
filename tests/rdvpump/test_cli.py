"""The rdvpump CLI, through typer's runner and once for real in a subprocess."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from rdv import state_diagram
from rdvpump.cli import app

ROOT = pathlib.Path(__file__).resolve().parents[2]

runner = CliRunner()


def test_version_and_help() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.startswith("rdvpump ")
    result = runner.invoke(app, ["-h"])
    assert result.exit_code == 0
    for verb in ("demo", "bench", "diagram"):
        assert verb in result.output


def test_demo_runs_an_echo_universe_and_checks_every_echo() -> None:
    result = runner.invoke(app, ["demo", "--clients", "2", "--connects", "2", "--messages", "5",
                                 "--ring", "64"])
    assert result.exit_code == 0, result.output
    assert "client0" in result.output and "client1" in result.output
    assert result.output.count("all equal") == 2
    assert "differ" not in result.output


def test_demo_of_one_seed_sends_the_same_bytes_every_run() -> None:
    """The header names the seed: two runs of it are the same run, the same bytes sent
    and echoed in the same number of pump steps (a simulation, its scheduling drawn from
    the seed), and a message size above what a link carries is refused before anything
    runs."""
    args = ["demo", "--clients", "3", "--connects", "2", "--messages", "20"]
    tables = [runner.invoke(app, args).output for _ in range(3)]
    rows = [[line for line in t.splitlines() if "client" in line or "Server" in line]
            for t in tables]
    assert rows[0] == rows[1] == rows[2] and len(rows[0]) == 4, tables
    # the default demo, whose step count varied by scheduling on the real clock
    steps = {runner.invoke(app, ["demo"]).output.splitlines()[-1].split(" pump steps")[0]
             for _ in range(6)}
    assert len(steps) == 1, steps
    result = runner.invoke(app, ["demo", "--max-size", str(64 << 20)])
    assert result.exit_code == 1
    assert "error: max_size 67,108,864 is above the largest message a link carries" in \
        result.output


def test_bad_options_give_one_clear_line_and_exit_1() -> None:
    result = runner.invoke(app, ["demo", "--ring", "1000"])
    assert result.exit_code == 1
    assert "error: ring capacity must be a power of two" in result.output
    assert "Traceback" not in result.output
    result = runner.invoke(app, ["demo", "--clients", "0"])
    assert result.exit_code == 1 and "at least 1" in result.output
    result = runner.invoke(app, ["universe", "up", str(ROOT / "examples/echo.toml"),
                                 "--timeout", "0"])
    assert result.exit_code == 1 and "--timeout must be more than 0 seconds" in result.output
    in_the_way = ROOT / "README.md"  # a file where --out wants a directory
    result = runner.invoke(app, ["mq", "consume", "orders", "--server", "s1@127.0.0.1:1",
                                 "--out", str(in_the_way)])
    assert result.exit_code == 1 and "--out" in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    # a directory option that cannot be one names the option
    for option in ("--mq-dir", "--state-dir"):
        result = runner.invoke(app, ["broker", "run", "--id", "a", "--manager", "127.0.0.1:1",
                                     "--role", "server", option, str(in_the_way)])
        assert result.exit_code == 1
        assert result.output == (f"error: {option} {in_the_way} is in the way: a file where "
                                 "a directory is needed\n")
    result = runner.invoke(app, ["mq", "verify", str(in_the_way)])
    assert result.exit_code == 1 and result.output == (
        f"error: {in_the_way} is a file: give an --mq-dir, a broker's directory in it, or a "
        "topic's directory\n")
    result = runner.invoke(app, ["broker", "run", "-h"])
    assert "Default: 64 MiB (67.108864 MB)" in " ".join(result.output.split())
    assert "67.108864]" not in result.output
    result = runner.invoke(app, ["bench", "inproc", "--sizes", "64,big"])
    assert result.exit_code == 1 and "--sizes must be integers" in result.output
    result = runner.invoke(app, ["bench", "failover", "--trials", "0"])
    assert result.exit_code == 1 and "--trials and --publishers must be at least 1" in result.output
    result = runner.invoke(app, ["bench", "cluster", "--in-flight", "0"])
    assert result.exit_code == 1 and (
        "--brokers, --queues, --messages and --in-flight must be at least 1" in result.output)
    result = runner.invoke(app, ["bench", "cluster", "--sink", "each"])
    assert result.exit_code == 1 and result.output == (
        "error: --sink must be one of batch, messages, not 'each'\n")
    result = runner.invoke(app, ["broker", "run", "--id", "a", "--manager", "127.0.0.1:1",
                                 "--busy-poll-us", "-5"])
    assert result.exit_code == 1 and "busy_poll must be a non-negative" in result.output
    result = runner.invoke(app, ["broker", "run", "--id", "a", "--manager", "127.0.0.1:1",
                                 "--topic", "orders"])
    assert result.exit_code == 1 and "need a tracking --role" in result.output
    result = runner.invoke(app, ["broker", "run", "--id", "a", "--manager", "127.0.0.1:1",
                                 "--role", "king"])
    assert result.exit_code == 1 and "role must be one of" in result.output


def test_usage_errors_are_one_line_naming_the_command_and_exit_2() -> None:
    """What click says of a bad option, value, argument or command, in one line on
    stderr (not its usage, hint and error on four), with where to read the options."""
    for args, said in (
            (["broker", "run", "--bogus"],
             "error: rdvpump broker run: No such option: --bogus (see 'rdvpump broker run "
             "-h')"),
            (["bench", "mq", "--repeat", "x"],
             "error: rdvpump bench mq: Invalid value for '--repeat': 'x' is not a valid int "
             "(see 'rdvpump bench mq -h')"),
            (["bench", "routes", "--servers", "0"],  # a division by it, once
             "error: rdvpump bench routes: Invalid value for '--servers': 0 is not in the "
             "range x>=1 (see 'rdvpump bench routes -h')"),
            (["bench", "replay", "--events", "0"],  # was the smallest workload, run
             "error: rdvpump bench replay: Invalid value for '--events': 0 is not in the "
             "range x>=1 (see 'rdvpump bench replay -h')"),
            (["bench", "mq", "--recovery-gib", "-1"],  # was taken for 0
             "error: rdvpump bench mq: Invalid value for '--recovery-gib': -1.0 is not in the "
             "range x>=0.0 (see 'rdvpump bench mq -h')"),
            (["mq", "publish", "t", "--server", "a@127.0.0.1:1", "--timeout", "-1"],
             "error: rdvpump mq publish: Invalid value for '--timeout': -1 is not a number of "
             "seconds above 0 (see 'rdvpump mq publish -h')"),
            (["status", "--timeout", "0"],
             "error: rdvpump status: Invalid value for '--timeout': 0 is not a number of "
             "seconds above 0 (see 'rdvpump status -h')"),
            (["mq", "consume", "t", "--server", "a@127.0.0.1:1", "--idle", "-1"],
             "error: rdvpump mq consume: Invalid value for '--idle': -1.0 is not in the range "
             "x>=0.0 (see 'rdvpump mq consume -h')"),
            (["mq", "declare"],
             "error: rdvpump mq declare: Missing argument 'topic' (see 'rdvpump mq declare "
             "-h')"),
            (["bogus"], "error: rdvpump: No such command 'bogus' (see 'rdvpump -h')"),
            (["--bogus"], "error: rdvpump: No such option: --bogus (see 'rdvpump -h')")):
        result = runner.invoke(app, args, prog_name="rdvpump")
        assert result.exit_code == 2, (args, result.output)
        assert result.stdout == "" and result.stderr == said + "\n", (args, result.output)
    # a group without its command still shows what it holds
    result = runner.invoke(app, ["bench"])
    assert "Commands:" in result.output and "inproc" in result.output


@pytest.mark.slow  # starts a process
def test_a_usage_error_of_the_installed_command_is_one_line() -> None:
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "rdvpump", "broker", "run", "--repat", "3"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    # click names the program as it was started: ``python -m rdvpump`` here
    assert proc.stderr.startswith("error: python -m rdvpump broker run: No such option: "
                                  "--repat "), proc.stderr
    assert len(proc.stderr.splitlines()) == 1, proc.stderr


def test_bench_inproc_json_lines_have_the_documented_fields() -> None:
    result = runner.invoke(app, ["bench", "inproc", "--json", "--sizes", "64",
                                 "--scale", "0.005", "--repeat", "1"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert lines, result.output
    for line in lines:
        assert set(line) == {"case", "size", "msgs_per_s", "mb_per_s", "baseline",
                             "baseline_msgs_per_s", "ratio"}
        assert line["size"] == 64 and line["msgs_per_s"] > 0
        assert abs(line["ratio"] - line["msgs_per_s"] / line["baseline_msgs_per_s"]) < 0.01
    assert {"trio-memory-channel", "pyzmq-inproc-push-pull"} <= {x["baseline"] for x in lines}


def test_bench_of_empty_or_tiny_messages_moves_no_more_than_the_smallest_default() -> None:
    """A size without a default count moves about as many bytes as the others, but never
    more messages than the smallest size's count: an empty or one-byte message would
    otherwise be hundreds of millions (minutes of a bench that prints nothing)."""
    from rdvpump.bench import inproc, tcp
    from rdvpump.bench._result import messages_for

    for counts, nbytes in ((inproc.DEFAULT_COUNTS, 2**27), (tcp.DEFAULT_COUNTS, 2**25)):
        for size in (0, 1, 7, 63):
            assert messages_for(size, counts, nbytes, 1.0) == counts[64]
        assert messages_for(64, counts, nbytes, 0.5) == counts[64] // 2
        assert messages_for(1 << 24, counts, nbytes, 1.0) == 1000
    result = runner.invoke(app, ["bench", "inproc", "--json", "--sizes", "0",
                                 "--scale", "0.005", "--repeat", "1"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert lines and all(x["size"] == 0 and x["msgs_per_s"] > 0 for x in lines), lines


def test_diagram_states_writes_the_table_diagram(tmp_path: pathlib.Path) -> None:
    target = tmp_path / "states.mmd"
    result = runner.invoke(app, ["diagram", "states", "--out", str(target)])
    assert result.exit_code == 0
    assert target.read_text() == state_diagram()


@pytest.mark.slow
def test_the_installed_command_runs_for_real() -> None:
    exe = pathlib.Path(sys.executable).with_name("rdvpump")
    proc = subprocess.run([str(exe), "demo", "--clients", "1", "--connects", "1",
                           "--messages", "3"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "all equal" in proc.stdout
    proc = subprocess.run([str(exe), "demo", "--ring", "6"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "error: ring capacity must be a power of two from 1 to 1073741824, got 6"]


@pytest.mark.slow
def test_mq_and_broker_errors_are_one_line_and_exit_1(
        monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    monkeypatch.chdir(tmp_path)  # the directories the commands make, made there
    cases = [
        (["mq", "topics", "--server", "127.0.0.1:1"], "expected BROKER@HOST:PORT"),
        (["mq", "topics", "--server", "s1@127.0.0.1:1", "--timeout", "2"], "s1@127.0.0.1:1"),
        (["broker", "run", "--id", "b", "--manager", "127.0.0.1:1", "--role", "server",
          "--mq-dir", "x", "--durability", "often"], "expected sync, interval:SECONDS or none"),
        (["broker", "run", "--id", "b", "--manager", "127.0.0.1:1", "--mq-dir", "x"],
         "need a tracking --role"),
        (["broker", "run", "--id", "b", "--manager", "127.0.0.1:1", "--role", "tracker",
          "--mq-dir", "x"], "--mq-dir needs a server role"),
    ]
    for args, message in cases:
        result = runner.invoke(app, args)
        assert result.exit_code == 1, (args, result.output)
        assert message in result.output and "Traceback" not in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1, result.output


def _commands() -> list[list[str]]:
    """Every command path of the CLI, e.g. ["trace", "analyze"]."""
    import typer.main

    found: list[list[str]] = []

    def walk(command: Any, path: list[str]) -> None:
        found.append(path)
        for name, sub in getattr(command, "commands", {}).items():  # a group's commands
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return found


@pytest.mark.slow
def test_help_shows_no_type_for_flags_and_arguments_as_names() -> None:
    import re

    for path in _commands():
        result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
        assert result.exit_code == 0, (path, result.output)
        assert "<bool>" not in result.output, path
        usage = next(line for line in result.output.splitlines() if "Usage:" in line)
        assert not re.search(r"\{\w+\}", usage), (path, usage)
        # every word of the help text is shown, those in square brackets too
        # ("[[fault]] tables", "[explore]"), which a markup language would take for tags
        context = _context(path)
        shown = " ".join(result.output.split())
        texts = [context.command.help or "",
                 *(getattr(p, "help", None) or "" for p in context.command.params)]
        for text in texts:
            for bracketed in re.findall(r"\[+[a-z][^\]]*\]+", text):
                assert bracketed in shown, (path, bracketed)


def _context(path: list[str]) -> Any:
    """The click context of the command at ``path``."""
    import typer.main

    command: Any = typer.main.get_command(app)
    context = command.make_context("rdvpump", ["--help"], resilient_parsing=True)
    for name in path:
        command = command.get_command(context, name)
        context = command.make_context(name, [], parent=context, resilient_parsing=True)
    return context


def test_the_help_lists_each_command_as_the_command_says_itself() -> None:
    import click
    import typer.main

    from brokermgr import DEFAULT_MANAGER_PORT
    from rdvpump.cli import COMMANDS, SHORT_HELP
    from rdvpump.cli._common import MANAGER_PORT

    group: Any = typer.main.get_command(app)
    context = click.Context(group)
    said = {name: group.get_command(context, name).get_short_help_str(10**6)
            for name, _, _ in COMMANDS}
    assert said == SHORT_HELP
    assert MANAGER_PORT == DEFAULT_MANAGER_PORT


@pytest.mark.slow  # starts processes
def test_help_starts_without_trio_and_the_brokers() -> None:
    """``rdvpump --help`` and ``rdvpump status --help`` load no command module that
    pulls in trio, the pump or the brokers: what makes them start in a blink."""
    import subprocess
    import sys

    for args in ([], ["status"]):
        code = ("import sys\nfrom rdvpump.cli import app\n"
                "try:\n    app([*sys.argv[1:], '--help'])\nexcept SystemExit:\n    pass\n"
                "print(sorted(m for m in ('trio', 'pump', 'brokermgr', 'mq', 'rich.table') "
                "if m in sys.modules))")
        proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                              text=True, timeout=60, check=True)
        assert "Usage:" in proc.stdout
        assert proc.stdout.strip().splitlines()[-1] == "[]", (args, proc.stdout[-300:])


def test_every_top_level_command_is_in_the_guides() -> None:
    readme = "".join(page.read_text() for page in [ROOT / "README.md",
                                                   *(ROOT / "docs").rglob("*.md")])
    top = {path[0] for path in _commands() if len(path) == 1}
    assert top and not {c for c in top if f"rdvpump {c}" not in readme}


def test_bench_tables_fold_long_case_names_instead_of_cutting_them() -> None:
    from dataclasses import dataclass

    from rich.console import Console

    from rdvpump.cli._bench_common import show as _show

    @dataclass
    class Row:
        case: str
        baseline: str

    cases = ["rdvpump-inproc-traced-jsonl-send-many-1024", "rdvpump-inproc-traced-parquet-9"]
    console = Console(width=80, record=True)
    _show([Row(c, "trio-memory-channel-awaited") for c in cases], False, "t",
          ("case", "size", "msgs/s", "MB/s", "baseline", "baseline msgs/s", "ratio"),
          lambda r: [r.case, "1024", "1,000,000", "1,000.0", r.baseline, "900,000", "1.11x"],
          console=console)
    text = console.export_text()
    assert "…" not in text
    cells = "".join(line.split("│")[1].strip() for line in text.splitlines()
                    if line.count("│") > 2)
    for case in cases:
        assert case in cells, (case, text)


def test_result_tables_keep_every_figure_whole_in_80_columns() -> None:
    """The figure a command is run for is readable in 80 columns: long workload names
    wrap, numbers are never cut; a run where no time passed says why it has no rate."""
    from rich.console import Console

    from rdvpump.cli.universe import _reports_table

    reports: list[dict[str, object]] = [
        {"workload": "fanout faucet->q1,q2,q3,q4:5672", "messages": 20000,
         "bytes": 20_000_000, "seconds": 0.41, "verified": True},
        {"workload": "echo client1->server:80", "messages": 2000, "bytes": 2_048_000,
         "seconds": 0.0, "verified": True}]
    console = Console(width=80, record=True)
    console.print(_reports_table("universe 'fanout', one pump, real clock", reports))
    text = console.export_text()
    assert "…" not in text
    for figure in ("20,000", "20.0", "0.410", "48,780", "48.8", "2,000"):
        assert f" {figure} " in text, (figure, text)
    assert "no rate where no time passed" in " ".join(text.split())
    # bench tables: the figures whole however long the names beside them
    from dataclasses import dataclass

    from rdvpump.cli._bench_common import show as _show

    @dataclass
    class Row:
        case: str

    console = Console(width=80, record=True)
    _show([Row("rdvpump-inproc-traced-parquet-send-many-1024")], False, "t",
          ("case", "size", "msgs/s", "MB/s", "baseline", "baseline msgs/s", "ratio"),
          lambda r: [r.case, "1024", "12,345,678", "12,641.9", "pyzmq-inproc-push-pull",
                     "1,234,567", "10.000x"], console=console)
    text = console.export_text()
    for figure in ("12,345,678", "12,641.9", "1,234,567", "10.000x"):
        assert f" {figure} " in text, (figure, text)


def test_paths_in_the_way_are_one_line_naming_the_argument(tmp_path: pathlib.Path) -> None:
    a_file = tmp_path / "afile"
    a_file.write_text("")
    echo = str(ROOT / "examples/echo.toml")
    for command in ("run", "up"):  # up: before any process starts
        result = runner.invoke(app, ["universe", command, echo, "--trace", str(a_file)])
        assert result.exit_code == 1, result.output
        assert " ".join(result.output.split()) == (
            f"error: --trace {a_file} is a file: give a directory (a trace file per pump is "
            "written in it)")
    result = runner.invoke(app, ["universe", "run", str(tmp_path)])
    assert " ".join(result.output.split()) == \
        f"error: universe file {tmp_path} is a directory, not a file"


def test_os_errors_read_as_words() -> None:
    import errno

    from rdvpump.cli._common import os_message

    assert os_message(IsADirectoryError(errno.EISDIR, "Is a directory", "/tmp"), "--out") == \
        "--out /tmp is a directory, not a file"
    assert os_message(FileExistsError(errno.EEXIST, "File exists", "/x")) == \
        "/x is in the way: a file where a directory is needed"
    assert os_message(OSError(errno.EIO, "I/O error")) == "[Errno 5] I/O error"


def test_a_deadline_that_passes_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """A benchmark or command that gives up waiting (trio's ``TooSlowError``, which says
    nothing itself), bare or out of a nursery, ends in one line, not a traceback."""
    import trio
    import trio.testing

    from rdvpump.cli._common import TOO_SLOW, guard

    async def stalls() -> None:
        with trio.fail_after(120):
            await trio.sleep_forever()

    async def stalls_in_a_nursery() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stalls)

    for fn in (stalls, stalls_in_a_nursery):
        with pytest.raises(typer.Exit) as info:
            guard(lambda fn=fn: trio.run(  # type: ignore[misc]
                fn, clock=trio.testing.MockClock(autojump_threshold=0)))
        assert info.value.exit_code == 1
        assert capsys.readouterr().err == f"error: {TOO_SLOW}\n"


def test_run_and_up_refuse_an_unrunnable_file_alike_before_starting(
        tmp_path: pathlib.Path) -> None:
    base = (ROOT / "examples/echo.toml").read_text()
    big = tmp_path / "big.toml"
    big.write_text(base.replace("size = 1024", "size = 20000000"))
    clash = tmp_path / "clash.toml"
    clash.write_text(base + '\n[[workload]]\nkind = "stream"\nfrom = "client1"\nto = "server"'
                            '\nport = 80\nmessages = 10\nsize = 64\n')
    expected = {
        big: f"error: {big} [[workload]] #1: size 20000000 exceeds the largest message, "
             "16777216 bytes",
        clash: f"error: {clash} [[workload]] #3: server:80 already serves echo for workload "
               "#1; a port serves one kind: give this one another port",
    }
    for path, line in expected.items():
        for command in ("run", "up"):
            result = runner.invoke(app, ["universe", command, str(path)])
            assert result.exit_code == 1
            assert " ".join(result.output.split()) == line, (command, result.output)


def test_a_bug_keeps_its_traceback_and_a_bad_setting_is_one_line(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Only what users cause (rdvpump's own errors, the system's) becomes one line: a
    ValueError, TypeError or RuntimeError from inside is a bug, and its traceback stays."""
    import rdvpump.demo

    for bug in (ValueError("a bug"), TypeError("a bug"), RuntimeError("a bug")):
        async def broken(bug: Exception = bug, **kwargs: Any) -> None:
            raise bug

        monkeypatch.setattr(rdvpump.demo, "run_echo_demo", broken)
        result = runner.invoke(app, ["demo"])
        assert result.exit_code != 0 and result.exception is bug, result.output
        assert "error: a bug" not in result.output
    monkeypatch.undo()
    result = runner.invoke(app, ["demo", "--ring", "1000"])  # a ConfigError from the ring
    assert result.exit_code == 1 and result.exception is not None
    assert isinstance(result.exception, SystemExit)
    assert result.output.startswith("error: ring capacity must be a power of two")


def test_an_error_line_prints_addresses_and_brackets_as_they_are(
        capsys: pytest.CaptureFixture[str]) -> None:
    """rich's emoji codes would turn ``127.0.0.1:100:`` into a symbol, its markup would
    eat ``[[fault]]``: an error line says what the library said, unchanged."""
    from rdvpump.cli._common import fail

    said = "manager 127.0.0.1:100: unreachable (:1234: too); see the [[fault]] tables"
    with pytest.raises(typer.Exit):
        raise fail(said)
    assert capsys.readouterr().err == f"error: {said}\n"


def test_broker_run_refuses_group_options_it_cannot_use_in_one_line(
        tmp_path: pathlib.Path) -> None:
    base = ["broker", "run", "--id", "s1", "--manager", "127.0.0.1:1", "--role", "server"]
    for extra, says in (
            (["--group", "a"], "--group needs one --id and an --mq-dir"),
            (["--group", "a", "--mq-dir", str(tmp_path), "--id", "s2"],
             "--group needs one --id"),
            (["--group", "a", "--mq-dir", str(tmp_path), "--group-id", "-1"],
             "--group-id must be 0"),
            (["--replication", "maybe"], "--replication is async or sync, not 'maybe'"),
            (["--min-insync", "0"], "--min-insync must be 1 or more, got 0"),
            (["--insync-lag", "0"], "--insync-lag must be a positive number of seconds"),
            (["--silence", "1"], "--silence is a --group member's"),
            (["--group", "a", "--mq-dir", str(tmp_path), "--silence", "0.1"],
             "--silence must be at least two heartbeats (0.2 s), got 0.1"),
            (["--group", "a", "--mq-dir", str(tmp_path), "--heartbeat", "0.5", "--silence",
              "0.6"], "--silence must be at least two heartbeats (1 s), got 0.6")):
        result = runner.invoke(app, [*base, *extra])
        assert result.exit_code == 1, (extra, result.output)
        (line,) = result.output.strip().splitlines()
        assert line.startswith("error: ") and says in line, (extra, line)


def test_mq_failover_without_a_manager_is_one_line() -> None:
    result = runner.invoke(app, ["mq", "failover", "a", "--to", "1", "--manager",
                                 "127.0.0.1:1", "--timeout", "2"])
    assert result.exit_code == 1, result.output
    (line,) = result.output.strip().splitlines()
    assert line.startswith("error: manager 127.0.0.1:1: "), line


def test_bench_nemesis_refuses_a_group_option_for_a_cluster_in_one_line() -> None:
    result = runner.invoke(app, ["bench", "nemesis", "--cluster", "--insync-lag", "1"])
    assert result.exit_code == 1, result.output
    assert result.output == "error: --insync-lag is a group's: a cluster has none\n"


def test_a_bad_trace_format_names_the_option_given() -> None:
    """``bench inproc --trace`` and ``universe run --trace-format`` check the same formats;
    each error names its own option and what it takes."""
    result = runner.invoke(app, ["bench", "inproc", "--trace", "foo"])
    assert result.exit_code == 1
    assert result.output == "error: --trace must be one of jsonl, parquet, memory, got 'foo'\n"
    result = runner.invoke(app, ["universe", "run", str(ROOT / "examples/echo.toml"),
                                 "--trace-format", "foo"])
    assert result.exit_code == 1
    assert result.output == "error: --trace-format must be one of jsonl, parquet, got 'foo'\n"


def test_a_trace_directory_that_cannot_be_made_is_one_line_before_anything_starts(
        tmp_path: pathlib.Path) -> None:
    """``universe up`` makes ``--trace`` itself before its processes start (each of them
    would fail to, and say nothing the parent keeps), as ``universe run`` does."""
    (tmp_path / "file").write_text("")
    where = tmp_path / "file" / "traces"
    for command in ("up", "run"):
        result = runner.invoke(app, ["universe", command, str(ROOT / "examples/echo.toml"),
                                     "--trace", str(where)])
        assert result.exit_code == 1, result.output
        assert result.output == f"error: --trace {where} is under a file, not a directory\n"


def test_an_unknown_role_is_one_line_and_nothing_else() -> None:
    result = runner.invoke(app, ["broker", "run", "--id", "b", "--manager", "127.0.0.1:1",
                                 "--role", "bogus"])
    assert result.exit_code == 1
    assert result.output == "error: --role must be one of server, tracker, both, got 'bogus'\n"


#: A command's end as ``main`` gives it, with pyarrow loaded (so without the interpreter's
#: teardown): output not yet flushed, an ``atexit`` function, a message as the status.
_LEAVES_WITH_PYARROW = """
import atexit, pyarrow
from rdvpump.cli import _leave
atexit.register(print, "atexit ran")
print("the command's output, unflushed", end="; ")
_leave("error: a message")
"""

#: The same with a thread of the command (not a daemon) still at work: it prints once
#: the parent closes its stdin.
_LEAVES_WITH_A_THREAD_AT_WORK = """
import sys, threading, pyarrow
from rdvpump.cli import _leave
def late():
    sys.stdin.read()
    print("the thread's work", flush=True)
threading.Thread(target=late).start()
print("leaving", flush=True)
_leave(3)
"""


@pytest.mark.slow  # starts processes
def test_a_command_that_loaded_pyarrow_ends_with_its_output_status_and_exit_functions(
        ) -> None:
    """Ending without the interpreter's teardown loses nothing the command gave: the
    output is flushed, ``atexit`` functions run, ``sys.exit(message)`` is the message and
    status 1; a thread still at work is waited for, as a normal exit does."""
    done = subprocess.run([sys.executable, "-c", _LEAVES_WITH_PYARROW],
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (
        1, "the command's output, unflushed; atexit ran\n", "error: a message\n")
    with subprocess.Popen([sys.executable, "-c", _LEAVES_WITH_A_THREAD_AT_WORK],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        try:
            assert proc.stdout.readline() == "leaving\n"
            proc.stdin.close()
            assert proc.stdout.read() == "the thread's work\n"
            assert proc.wait(timeout=60) == 3
        finally:
            proc.kill()


def test_a_table_at_80_columns_breaks_no_word_or_figure() -> None:
    """A table wider than the terminal (``status`` of a group in a cluster, with metrics)
    keeps each word and figure whole, printed wider than 80 columns if it must; one that
    fits stays within them."""
    import io

    from rich.console import Console
    from rich.table import Table

    from rdvpump.cli._common import show_table

    def shown(rows: list[tuple[str, ...]], columns: tuple[str, ...]) -> str:
        buffer = io.StringIO()
        table = Table(title="universe 'shop' at 127.0.0.1:9876")
        for column in columns:
            table.add_column(column)
        for row in rows:
            table.add_row(*row)
        show_table(table, Console(file=buffer, width=80))
        return buffer.getvalue()

    wide = ("broker", "address", "version", "age (s)", "last heartbeat (s ago)", "group",
            "cluster", "metrics")
    rows = [("r0", "127.0.0.1:15672", "0", "3.4", "0.4", "gg/0 master@1",
             "shop primary, root a@3, state v5", "127.0.0.1:9100"),
            ("r1", "127.0.0.1:15673", "12", "1,203.4", "22.0", "gg/1 slave@1 lag 1,024",
             "", "127.0.0.1:39100"),
            ("c1", "127.0.0.1:15674", "0", "3.4", "0.4", "", "",
             "waiting for a consumer")]
    text = shown(rows, wide)
    cells = {word for row in rows for cell in row for word in cell.split()}
    found = {word for line in text.splitlines() for part in line.split("│")
             for word in part.split()}
    assert cells <= found, cells - found
    assert max(len(line) for line in text.splitlines()) > 80
    narrow = shown([("r0", "127.0.0.1:15672", "0")], ("broker", "address", "version"))
    assert max(len(line) for line in narrow.splitlines()) <= 80


def test_identity_new_appends_a_table_and_its_errors_are_one_line(
        tmp_path: pathlib.Path) -> None:
    """``identity new`` prints NAME:SECRET and appends a table the file's parser takes; a
    bad name, a name the file holds, a credential that is not NAME:SECRET and an
    identities file that cannot be read are each one line and exit 1."""
    from rdv import Credential, Identities

    ids = tmp_path / "ids.toml"
    made = runner.invoke(app, ["identity", "new", "alice", "--file", str(ids), "--publish",
                               "orders.*", "--admin"])
    assert made.exit_code == 0, made.output
    credential = Credential.parse(made.stdout.strip())
    identity = Identities.load(ids).verify("alice", credential.secret)
    assert identity is not None and identity.admin and identity.may("publish", "orders.x")
    for args, said in [
        (["identity", "new", "alice", "--file", str(ids)],
         f"error: {ids} holds identity 'alice' already"),
        (["identity", "new", "a b"], "error: an identity's name is 1 to 64 letters"),
        (["status", "--identity", "no-colon", "--timeout", "1"],
         "error: an identity is NAME:SECRET"),
        (["manager", "serve", "--identities", str(tmp_path / "missing.toml"), "--listen",
          "127.0.0.1:0"], f"error: {tmp_path / 'missing.toml'}: cannot read the "
                          f"identities file"),
    ]:
        proc = subprocess.run([sys.executable, "-m", "rdvpump", *args], capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 1, (args, proc.stderr)
        assert proc.stderr.startswith(said) and len(proc.stderr.splitlines()) == 1, (
            args, proc.stderr)
    assert Identities.load(ids).names() == ["alice"]  # nothing appended by the refusal


def test_mq_publish_and_consume_need_a_server_or_a_manager_and_a_group_in_one_line() -> None:
    for args in (["mq", "publish", "orders"], ["mq", "consume", "orders"],
                 ["mq", "consume", "orders", "--master-of", "a"],
                 ["mq", "publish", "orders", "--manager", "127.0.0.1:1"],
                 ["mq", "publish", "orders", "--server", "s@127.0.0.1:1", "--manager",
                  "127.0.0.1:1", "--master-of", "a"]):
        result = runner.invoke(app, args, input="")
        assert result.exit_code == 1, (args, result.output)
        (line,) = result.output.strip().splitlines()
        assert line == "error: give --server, or --manager with --master-of", (args, line)


def test_mq_consume_following_a_group_without_its_manager_is_one_line() -> None:
    result = runner.invoke(app, ["mq", "consume", "orders", "--manager", "127.0.0.1:1",
                                 "--master-of", "a", "--timeout", "1"])
    assert result.exit_code == 1, result.output
    (line,) = result.output.strip().splitlines()
    assert line.startswith("error: group a: no master named and reachable within 1 s"), line
