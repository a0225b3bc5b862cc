"""rdvpump universe: universes from TOML files, in one process or one per broker."""

from __future__ import annotations

import dataclasses
import functools
import pathlib
import signal
import time
from typing import TYPE_CHECKING, Annotated, Any

import trio
import typer
from rich.live import Live
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

from pump import ConfigError

from ..children import ChildState
from ..testing import run_simulation
from ..universe_file import UniverseSpec, load_universe
from ..universe_up import universe_up
from ..workloads import RunResult, run_universe
from ._common import (
    RunOption,
    TokenOption,
    TraceFormatOption,
    TraceOption,
    check_format,
    check_trace_dir,
    err,
    fail,
    guard,
    interrupted,
    interruptible,
    is_ctrl_c,
    logs_above,
    out,
    show_table,
)

if TYPE_CHECKING:
    from rdv import Address

app = typer.Typer(rich_markup_mode=None,
                  help="Universes from TOML files: echo, stream, fanout and mq workloads, "
                  "simulated with faults or run for real.",
                  no_args_is_help=True)


def _reports_table(title: str, reports: list[dict[str, object]],
                   seconds_label: str = "seconds") -> Table:
    """The workloads' results.  The figures never shrink (in 80 columns the workload's
    name wraps instead); a run in which no time passed (the virtual clock never moved)
    has no rate, and the table says why."""
    rows = []
    still = False
    for r in reports:
        seconds = float(r["seconds"])  # type: ignore[arg-type]
        msgs, nbytes = int(r["messages"]), int(r["bytes"])  # type: ignore[call-overload]
        still |= not seconds
        rows.append((str(r["workload"]), f"{msgs:,}", f"{nbytes / 1e6:,.1f}",
                     f"{seconds:.3f}", f"{msgs / seconds:,.0f}" if seconds else "-",
                     f"{nbytes / 1e6 / seconds:,.1f}" if seconds else "-",
                     "[green]ok[/green]" if r["verified"] else "[red]FAILED[/red]"))
    caption = ("-: no rate where no time passed (a virtual clock moves only to a timer: "
               "run with --clock real for rates)") if still else None
    table = Table(title=title, caption=caption, pad_edge=False)
    table.add_column("workload", overflow="fold")
    for i, col in enumerate(("messages", "MB", seconds_label, "msgs/s", "MB/s", "checked")):
        # never narrower than its widest figure (its title may wrap)
        widest = max([1, *(Text.from_markup(row[i + 1]).cell_len for row in rows)])
        table.add_column(col, justify="right", min_width=widest)
    for row in rows:
        table.add_row(*row)
    return table


ClockOption = Annotated[str, typer.Option(
    "--clock", help="virtual: a simulation, the same file and seed give the same run and "
    "trace, byte for byte; real: trio's clock, for throughput figures.")]
SeedOption = Annotated[int | None, typer.Option(
    "--seed", min=0, help="The seed of the run (default: the file's).")]


def _check_clock(clock: str) -> None:
    if clock not in ("virtual", "real"):
        raise ConfigError(f"--clock must be virtual or real, got {clock!r}")


def _show_problems(result: RunResult) -> None:
    for note in result.notes:
        err.print(f"[yellow]{escape(note)}[/yellow]")
    for r in result.reports:
        if r.error:
            err.print(f"[red]{escape(r.label)}: {escape(r.error)}[/red]")


@app.command("run")
def universe_run(file: Annotated[pathlib.Path, typer.Argument(help="Universe TOML file.")],
                 trace: TraceOption = None, trace_format: TraceFormatOption = "jsonl",
                 run: RunOption = None, clock: ClockOption = "virtual",
                 seed: SeedOption = None) -> None:
    """Run a universe in this process, every broker on one pump: a simulation on the
    virtual clock by default, with the file's [[fault]] tables applied."""

    spec = guard(lambda: load_universe(file), arg="universe file")
    guard(lambda: check_format(trace_format))
    guard(lambda: _check_clock(clock))
    check_trace_dir(trace)
    if seed is not None:
        spec = dataclasses.replace(spec, seed=seed)
    with err.status(f"running universe {spec.name!r} ..."):
        result = interruptible(lambda: run_simulation(lambda: run_universe(
            spec, trace_dir=None if trace is None else str(trace), trace_format=trace_format,
            run=run), seed=spec.seed, clock=clock))
    if trace is not None:
        err.print(f"trace written to {trace}/")
    how = (f"virtual clock, seed {spec.seed}" if clock == "virtual" else "real clock")
    show_table(_reports_table(f"universe {spec.name!r}, one process, {how}",
                             [r.to_dict() for r in result.reports],
                             "virtual s" if clock == "virtual" else "seconds"))
    _show_problems(result)
    if not result.verified:
        raise fail("a workload lost or changed messages, or did not finish")


@app.command("explore")
def universe_explore(
    file: Annotated[pathlib.Path, typer.Argument(help="Universe TOML file.")],
    seeds: Annotated[int, typer.Option("--seeds", min=1, help="How many seeds to run.")] = 100,
    first: Annotated[int, typer.Option("--first", min=0, help="The first seed.")] = 0,
    limit: Annotated[float, typer.Option(
        "--limit", min=0.001, help="Virtual seconds a run may take before it fails.")] = 60.0,
) -> None:
    """Run the universe under many seeds on the virtual clock, each with the random faults
    of the file's [explore] table, and print the seeds that break a workload (the links'
    warnings of those runs are left out: universe run FILE --seed N shows them).  Ctrl-C
    stops the search and prints the failing seeds found so far."""
    spec = guard(lambda: load_universe(file), arg="universe file")
    if spec.explore is None:
        raise fail(f"{file}: no [explore] table: nothing random to explore (add one with "
                   "faults, within, lasting and actions)")
    search = _Exploration(spec, range(first, first + seeds), limit)
    try:
        guard(search.run)
    except BaseException as exc:  # Ctrl-C: what was found so far is still shown
        if not is_ctrl_c(exc):
            raise
        if search.failing:
            _failing_table(file, spec.name, search.failing, search.ran)
        err.print(f"stopped after {search.ran} of {seeds} seeds", highlight=False)
        raise interrupted() from None
    failing, ran = search.failing, search.ran
    if not failing:
        out.print(f"{seeds} seeds from {first}: every workload complete and checked")
        return
    _failing_table(file, spec.name, failing, ran)
    raise typer.Exit(1)


class _Exploration:
    """``universe explore``'s search: a run of ``spec`` under each seed, the failing ones
    kept with why, a progress bar on stderr."""

    def __init__(self, spec: UniverseSpec, seeds: range, limit: float) -> None:
        self.spec = spec
        self.seeds = seeds
        self.limit = limit
        self.failing: list[tuple[int, str]] = []
        self.ran = 0
        self.stop: list[int] = []

    def run(self) -> None:
        # Ctrl-C is taken between runs: each run is short, and trio's own handler, which
        # each run would install and remove, could take a signal just as its run ends
        previous = signal.signal(signal.SIGINT,
                                 lambda signum, frame: self.stop.append(signum))
        try:
            self._search()
        finally:
            signal.signal(signal.SIGINT, previous)

    def _search(self) -> None:
        columns = (TextColumn("exploring {task.description}"), BarColumn(),
                   MofNCompleteColumn(), TextColumn("{task.fields[failing]} failing"),
                   TimeElapsedColumn())
        with Progress(*columns, console=err, transient=not err.is_terminal) as progress, \
                logs_above(progress.console):
            task = progress.add_task(self.spec.name, total=len(self.seeds), failing=0)
            for seed in self.seeds:
                if self.stop:
                    raise KeyboardInterrupt
                seeded = dataclasses.replace(self.spec, seed=seed)
                result = run_simulation(functools.partial(run_universe, seeded,
                                                          limit=self.limit), seed=seed)
                if not result.verified:
                    why = next(f"{r.label}: {r.error}" for r in result.reports
                               if not r.verified)
                    self.failing.append((seed, why))
                self.ran += 1
                progress.update(task, advance=1, failing=len(self.failing))


def _failing_table(file: pathlib.Path, name: str, failing: list[tuple[int, str]],
                   ran: int) -> None:
    table = Table(title=f"universe {name!r}: {len(failing)} of {ran} seeds failed")
    table.add_column("seed", justify="right")
    table.add_column("why", overflow="fold")
    for seed, why in failing:
        table.add_row(str(seed), escape(why))
    show_table(table)
    out.print(f"replay one: rdvpump universe run {file} --seed {failing[0][0]} --trace DIR",
              highlight=False, soft_wrap=True)


UpTimeoutOption = Annotated[float | None, typer.Option(
    help="Stop the universe after this many seconds if its workloads are not done "
         "(exit 1, saying what it waited for); no limit by default.")]
UpConsoleOption = Annotated[str | None, typer.Option(
    "--console", metavar="HOST:PORT",
    help="Serve the universe's console there (as rdvpump console; port 0: one the "
         "kernel picks), every process serving its metrics; the universe then stays "
         "up once its workloads are done, until Ctrl-C.")]
UpAdminOption = Annotated[bool, typer.Option(
    "--admin", help="The console may change the universe (as console --admin).")]


@app.command("up")
def universe_up_cmd(
    file: Annotated[pathlib.Path, typer.Argument(help="Universe TOML file.")],
    token: TokenOption = "",
    trace: TraceOption = None, trace_format: TraceFormatOption = "jsonl", run: RunOption = None,
    timeout: UpTimeoutOption = None, console: UpConsoleOption = None,
    admin: UpAdminOption = False,
) -> None:
    """A manager and one process per broker on 127.0.0.1, shown live; Ctrl-C stops all.
    A broker process that exits while the universe runs, whatever its role, stops the
    universe at once with its name and how it ended (exit 1)."""
    at = _up_console(timeout, console, admin)
    spec = guard(lambda: load_universe(file), arg="universe file")
    if spec.faults or spec.explore:
        err.print("note: faults are simulated in one process (universe run); up runs this "
                  "universe without them, over real TCP", highlight=False)
    guard(lambda: check_format(trace_format))
    check_trace_dir(trace)
    trace_args: list[str] = []
    if trace is not None:
        run_id = run or f"{spec.name}-{time.strftime('%Y%m%dT%H%M%S')}"
        trace_args = ["--trace", str(trace.resolve()), "--trace-format", trace_format,
                      "--run", run_id]

    live_table = functools.partial(_live_table, spec.name)
    outcome: dict[str, Any] = {}
    title = f"universe {spec.name!r}, one process per broker"

    def console_says(url: str, done: bool) -> None:
        err.print(f"workloads done; the console stays up at {url} until Ctrl-C" if done
                  else f"console of universe {spec.name!r} on {url}",
                  markup=False, highlight=False)

    up = functools.partial(universe_up, spec, file, token=token, timeout=timeout,
                           trace_args=trace_args, outcome=outcome, console=at, admin=admin,
                           on_console=console_says)
    if out.is_terminal:
        with Live(live_table({b: ChildState(b) for b in spec.brokers}), console=out,
                  refresh_per_second=4, transient=False) as live:
            states = guard(lambda: trio.run(lambda: up(
                on_change=lambda st: live.update(live_table(st)))))
            # the last frame is the results: no stale counts of children that have exited
            live.update(_reports_table(title, _reports(states)))
    else:  # a pipe or a file: one plain line per change of a child's state, no live table
        lines = _StateLines()
        states = guard(lambda: trio.run(lambda: up(on_change=lines.show)))
        show_table(_reports_table(title, _reports(states)))
    _up_ended(spec, states, outcome, timeout)


def _up_console(timeout: float | None, console: str | None, admin: bool) -> Address | None:
    """``universe up``'s --timeout checked, and where its console serves (None: nowhere)."""
    from rdv import Address

    if timeout is not None and not timeout > 0:
        raise fail(f"--timeout must be more than 0 seconds, got {timeout:g}")
    if admin and console is None:
        raise fail("--admin is for the console: give --console HOST:PORT too")
    at = None if console is None else guard(lambda: Address.parse(console))
    if admin and at is not None:
        from ..console import check_admin_address

        guard(lambda: check_admin_address(at.host))
    return at


def _live_table(name: str, states: dict[str, ChildState]) -> Table:
    """``universe up``'s live table: each broker process's links, messages, rates, state."""
    table = Table(title=f"universe {name!r}: manager + {len(states)} processes")
    for col in ("broker", "links", "messages", "MB", "msgs/s", "MB/s", "state"):
        table.add_column(col, justify="left" if col in ("broker", "state") else "right")
    for s in states.values():
        st = s.stats
        table.add_row(s.broker, str(st.get("links", 0)), f"{st.get('messages', 0):,}",
                      f"{st.get('bytes', 0) / 1e6:,.1f}", f"{s.rate[0]:,.0f}",
                      f"{s.rate[1] / 1e6:,.1f}", _state(s))
    return table


def _up_ended(spec: UniverseSpec, states: dict[str, ChildState], outcome: dict[str, Any],
              timeout: float | None) -> None:
    """How ``universe up`` ended, as its exit: 130 when interrupted, 1 with the reason
    when a process failed, the time ran out or a workload was not checked."""
    reports = _reports(states)
    stopped_by = outcome.get("stopped_by")
    if stopped_by == "signal":  # a workload is finished once its messages were checked
        finished = [r["workload"] for r in reports if r["verified"]]
        err.print(f"interrupted; finished before it: {', '.join(finished) or 'no workload'}",
                  highlight=False)
        raise typer.Exit(130)
    failed = [f"broker {b}: {st.error}" for b, st in states.items() if st.error]
    if "manager_error" in outcome:
        failed.insert(0, f"manager: {outcome['manager_error']}")
    if failed:
        raise fail("; ".join(failed))
    if stopped_by == "timeout":
        assert timeout is not None
        raise fail(f"the universe did not finish within {timeout:g} s (--timeout): it "
                   f"waited for {', '.join(outcome.get('waiting', [])) or 'nothing'}")
    done = all(states[w.source].reports is not None for w in spec.workloads)
    if not done or not all(r["verified"] for r in reports):
        raise fail("the universe stopped before every workload was checked")


def _state(child: ChildState) -> str:
    """A child's state for a person: a broker with no workload of its own serves (a
    server, a sink) until the universe stops; "done" is for one whose workloads are."""
    if child.exit_code is not None:
        return f"exited {child.exit_code}"
    if child.reports is None:
        return "running"
    return "done" if child.reports else "serving"


def _reports(states: dict[str, ChildState]) -> list[dict[str, Any]]:
    return [r for s in states.values() for r in (s.reports or [])]


class _StateLines:
    """Where no terminal shows a live table: a line each time a child's state changes."""

    def __init__(self) -> None:
        self.seen: dict[str, str] = {}

    def show(self, states: dict[str, ChildState]) -> None:
        for b, st in states.items():
            now = f"error: {st.error}" if st.error else _state(st) if st.stats else ""
            if now and self.seen.get(b) != now:
                self.seen[b] = now
                print(f"{b}: {now}", flush=True)
