"""The ``rdvpump`` command: demo universe, benchmarks, diagrams.

Library errors are caught here only, and become one red line on stderr and exit 1.
"""

from __future__ import annotations

import json
import logging
import pathlib
import time
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from typing import Annotated, Any, TypeVar

import trio
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

app = typer.Typer(help="rdvpump: an event-pump actor framework for broker-to-broker links.",
                  no_args_is_help=True, add_completion=False,
                  context_settings={"help_option_names": ["-h", "--help"]})
bench_app = typer.Typer(help="Benchmarks against the libraries users would pick instead.",
                        no_args_is_help=True)
diagram_app = typer.Typer(help="Diagrams generated from the code.", no_args_is_help=True)
manager_app = typer.Typer(help="The universe's BrokerManager as a name service.",
                          no_args_is_help=True)
broker_app = typer.Typer(help="Brokers in a process of their own.", no_args_is_help=True)
universe_app = typer.Typer(help="Universes from TOML files: echo, stream and fanout workloads.",
                           no_args_is_help=True)
app.add_typer(bench_app, name="bench")
app.add_typer(diagram_app, name="diagram")
trace_app = typer.Typer(help="Analyse and draw pump traces.", no_args_is_help=True)
app.add_typer(trace_app, name="trace")
app.add_typer(manager_app, name="manager")
app.add_typer(broker_app, name="broker")
app.add_typer(universe_app, name="universe")

TokenOption = Annotated[str, typer.Option(
    envvar="RDVPUMP_TOKEN", help="The universe's token (or $RDVPUMP_TOKEN).")]
UniverseOption = Annotated[str, typer.Option(help="Universe name.")]
TraceOption = Annotated[pathlib.Path | None, typer.Option(
    "--trace", help="Record this run's trace here: one file per pump.")]
TraceFormatOption = Annotated[str, typer.Option(
    "--trace-format", help="Trace file format: jsonl or parquet.")]
RunOption = Annotated[str | None, typer.Option(
    "--run", help="Run id written in every trace row (default: derived from the universe).")]
CertOption = Annotated[pathlib.Path | None, typer.Option(
    "--tls-cert", help="PEM certificate: links and manager connections use TLS.")]
KeyOption = Annotated[pathlib.Path | None, typer.Option("--tls-key", help="PEM private key.")]
CAOption = Annotated[pathlib.Path | None, typer.Option(
    "--tls-ca", help="PEM CA that peers' certificates must chain to (mutual TLS).")]


def _tls(cert: pathlib.Path | None, key: pathlib.Path | None,
         ca: pathlib.Path | None) -> tuple[str, str, str | None] | None:
    if cert is None and key is None and ca is None:
        return None
    if cert is None or key is None:
        raise ValueError("TLS needs both --tls-cert and --tls-key")
    for path in (cert, key, ca):
        if path is not None and not path.is_file():
            raise ValueError(f"no such file: {path}")
    return str(cert), str(key), None if ca is None else str(ca)

out = Console()
err = Console(stderr=True, soft_wrap=True)
T = TypeVar("T")


def _version() -> str:
    try:
        return version("rdvpump")
    except PackageNotFoundError:  # pragma: no cover - running from an uninstalled tree
        return "unknown"


def _show_version(value: bool) -> None:
    if value:
        out.print(f"rdvpump {_version()}")
        raise typer.Exit()


@app.callback()
def _root(version_: Annotated[bool, typer.Option(
        "--version", help="Show the version and exit.", callback=_show_version,
        is_eager=True)] = False) -> None:
    """rdvpump: brokers, rendezvous, ring-buffer channels and message queues on one pump."""


_EXPECTED = (ValueError, TypeError, RuntimeError, OSError, trio.BrokenResourceError,
             trio.ClosedResourceError)


def _guard(fn: Callable[[], T]) -> T:
    """Run library code; turn its errors into one red line and exit status 1."""
    try:
        return fn()
    except _EXPECTED as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        raise typer.Exit(1) from None
    except BaseExceptionGroup as group:  # errors raised inside trio nurseries
        leaf = _first_leaf(group)
        if not isinstance(leaf, _EXPECTED):
            raise
        err.print(f"[red]error:[/red] {escape(str(leaf))}", highlight=False)
        raise typer.Exit(1) from None


def _recorder(trace: pathlib.Path | None, fmt: str, *, pump: str, run: str) -> Any:
    if trace is None:
        return None
    from pump import open_trace

    return _guard(lambda: open_trace(trace, pump=pump, run=run, format=fmt))


def _check_format(fmt: str) -> None:
    from pump import FORMATS

    if fmt not in FORMATS:
        raise ValueError(f"--trace-format must be one of {', '.join(FORMATS)}, got {fmt!r}")


def _first_leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc


@app.command()
def demo(
    clients: Annotated[int, typer.Option(help="Client brokers.")] = 4,
    connects: Annotated[int, typer.Option(help="Connections each client makes in turn.")] = 3,
    messages: Annotated[int, typer.Option(help="Messages per connection.")] = 50,
    max_size: Annotated[int, typer.Option(help="Largest message, bytes (sizes 1..max).")] = 10240,
    ring: Annotated[int, typer.Option(help="Ring capacity per direction, a power of two.")] = 65536,
    seed: Annotated[int, typer.Option(help="Seed of the pump's random source.")] = 1,
) -> None:
    """Run an in-process echo universe end to end and print what happened."""
    from ._demo import run_echo_demo

    with err.status("running the echo universe ..."):
        report = _guard(lambda: trio.run(lambda: run_echo_demo(
            clients=clients, connects=connects, messages=messages, max_size=max_size,
            ring_capacity=ring, seed=seed)))
    table = Table(title=f"echo universe {report.universe!r} (seed {report.seed}, "
                        f"ring {report.ring_capacity} B)")
    for col in ("broker", "links", "messages", "bytes", "echoes checked"):
        table.add_column(col, justify="left" if col == "broker" else "right")
    for c in report.clients:
        verdict = "[green]all equal[/green]" if not c.mismatches else \
            f"[red]{c.mismatches} differ[/red]"
        table.add_row(c.client, str(c.links), f"{c.messages:,}", f"{c.bytes:,}", verdict)
    table.add_row("Server", str(report.server_links), f"{report.messages:,}",
                  f"{report.bytes:,}", "echoed", style="bold")
    out.print(table)
    rate = report.messages / report.elapsed_s if report.elapsed_s else 0.0
    out.print(f"{report.pump_steps:,} pump steps in {report.elapsed_s:.2f} s "
              f"({rate:,.0f} echoed messages/s)")
    if not report.ok:
        err.print("[red]error:[/red] some echoes differ from what was sent")
        raise typer.Exit(1)


@bench_app.command("inproc")
def bench_inproc(
    json_out: Annotated[bool, typer.Option("--json", help="JSON lines on stdout.")] = False,
    sizes: Annotated[str, typer.Option(help="Message sizes, comma-separated.")] = "64,1024,65536",
    scale: Annotated[float, typer.Option(help="Multiply the message counts.")] = 1.0,
    repeat: Annotated[int, typer.Option(help="Runs per figure; the best is kept.")] = 5,
    trace: Annotated[str | None, typer.Option(
        help="Record a trace (jsonl or parquet, written to a temporary file, or memory); "
             "compare against the untraced run.")] = None,
) -> None:
    """MessageQueue throughput on one pump beside trio memory channels and pyzmq inproc."""
    from bench import inproc

    size_list = _guard(lambda: _parse_sizes(sizes, scale, repeat))
    if trace is not None and trace != "memory":
        _guard(lambda: _check_format(trace))
    results = []
    with err.status("benchmarking ...") as status:
        for r in _guard(lambda: list(inproc.run(size_list, scale=scale, repeat=repeat,
                                                trace=trace, progress=status.update))):
            results.append(r)
    if json_out:
        for r in results:
            print(json.dumps(r.to_dict()))
        return
    table = Table(title=f"rdvpump bench inproc (best of {repeat})")
    for col in ("case", "size", "msgs/s", "MB/s", "baseline", "baseline msgs/s", "ratio"):
        table.add_column(col, justify="left" if col in ("case", "baseline") else "right")
    for r in results:
        table.add_row(r.case, str(r.size), f"{r.msgs_per_s:,.0f}", f"{r.mb_per_s:,.1f}",
                      r.baseline, f"{r.baseline_msgs_per_s:,.0f}", f"{r.ratio:.2f}x")
    out.print(table)


@bench_app.command("replay")
def bench_replay(
    json_out: Annotated[bool, typer.Option("--json", help="JSON lines on stdout.")] = False,
    events: Annotated[int, typer.Option(help="Events in the generated trace.")] = 10_000_000,
    master: Annotated[str, typer.Option(help="Spark master.")] = "local[2]",
) -> None:
    """The replay job on a real trace of EVENTS events, beside plain Python on the same file."""
    from bench import replay

    with err.status("benchmarking the replay ...") as status:
        results = _guard(lambda: list(replay.run(events, master=master,
                                                 progress=status.update)))
    if json_out:
        for r in results:
            print(json.dumps(r.to_dict()))
        return
    table = Table(title="rdvpump bench replay")
    for col in ("case", "events", "seconds", "events/s", "baseline", "baseline events/s",
                "ratio"):
        table.add_column(col, justify="left" if col in ("case", "baseline") else "right")
    for r in results:
        table.add_row(r.case, f"{r.events:,}", f"{r.seconds:.1f}", f"{r.events_per_s:,.0f}",
                      r.baseline, f"{r.baseline_events_per_s:,.0f}", f"{r.ratio:.2f}x")
    out.print(table)


@bench_app.command("routes")
def bench_routes(
    json_out: Annotated[bool, typer.Option("--json", help="JSON lines on stdout.")] = False,
    servers: Annotated[int, typer.Option(help="Servers in the route table.")] = 1000,
    topics: Annotated[int, typer.Option(help="Topics per server.")] = 100,
    ops: Annotated[int, typer.Option(help="Incremental updates timed.")] = 2000,
) -> None:
    """Route-table update cost (incremental vs full rebuild) and crash propagation time."""
    from bench import routes as bench_routes_mod

    with err.status("benchmarking route tables ...") as status:
        results = _guard(lambda: list(bench_routes_mod.run(servers, topics, ops=ops,
                                                           progress=status.update)))
    if json_out:
        for r in results:
            print(json.dumps(r.to_dict()))
        return
    table = Table(title="rdvpump bench routes")
    for col in ("case", "servers x topics", "value", "baseline", "baseline value", "ratio"):
        table.add_column(col, justify="left" if col in ("case", "baseline") else "right")
    for r in results:
        table.add_row(r.case, f"{r.servers} x {r.topics}", f"{r.value:.6g} {r.unit}",
                      r.baseline, f"{r.baseline_value:.6g} {r.unit}",
                      "n/a" if r.ratio is None else f"{r.ratio:.2f}x")
    out.print(table)


@bench_app.command("tcp")
def bench_tcp(
    json_out: Annotated[bool, typer.Option("--json", help="JSON lines on stdout.")] = False,
    sizes: Annotated[str, typer.Option(help="Message sizes, comma-separated.")] = "64,1024,65536",
    scale: Annotated[float, typer.Option(help="Multiply the message counts.")] = 1.0,
    repeat: Annotated[int, typer.Option(help="Runs per figure; the best is kept.")] = 3,
    placement: Annotated[str, typer.Option(
        help="split: the two processes on two cores; same: both on core 0.")] = "split",
    busy_poll_us: Annotated[float, typer.Option(
        help="Also time the round trip with links busy-polling this long (split placement; "
             "0: not).")] = 100.0,
) -> None:
    """Two processes on loopback beside pyzmq PUSH/PULL and a batched trio framing loop."""
    from bench import tcp

    size_list = _guard(lambda: _parse_sizes(sizes, scale, repeat))
    with err.status("benchmarking ...") as status:
        results = _guard(lambda: list(tcp.run(size_list, scale=scale, repeat=repeat,
                                              placement=placement,
                                              busy_poll=busy_poll_us * 1e-6,
                                              progress=status.update)))
    if json_out:
        for r in results:
            print(json.dumps(r.to_dict()))
        return
    table = Table(title=f"rdvpump bench tcp (best of {repeat}, placement {placement})")
    for col in ("case", "size", "msgs/s", "MB/s", "baseline", "baseline msgs/s", "ratio",
                "median us", "p99 us"):
        table.add_column(col, justify="left" if col in ("case", "baseline") else "right")
    for r in results:
        lat = (f"{r.median_us:,.0f} / {r.baseline_median_us:,.0f}" if r.median_us else "",
               f"{r.p99_us:,.0f} / {r.baseline_p99_us:,.0f}" if r.p99_us else "")
        table.add_row(r.case, str(r.size), f"{r.msgs_per_s:,.0f}", f"{r.mb_per_s:,.1f}",
                      r.baseline, f"{r.baseline_msgs_per_s:,.0f}", f"{r.ratio:.2f}x", *lat)
    out.print(table)


def _parse_sizes(sizes: str, scale: float, repeat: int) -> list[int]:
    try:
        values = [int(s) for s in sizes.split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"--sizes must be integers separated by commas, got {sizes!r}") from None
    if not values or min(values) < 0 or scale <= 0 or repeat < 1:
        raise ValueError("--sizes must be non-negative, --scale positive, --repeat >= 1")
    return values


@diagram_app.command("states")
def diagram_states(
    output: Annotated[pathlib.Path | None, typer.Option(
        "--out", help="Write here instead of stdout.")] = None,
) -> None:
    """The rendezvous state diagram (Mermaid), generated from the transition table."""
    from rdv import state_diagram

    text = state_diagram()
    if output is None:
        print(text, end="")
    else:
        _guard(lambda: output.write_text(text))
        err.print(f"wrote {output}")


def _ready(what: str) -> Callable[[tuple[str, int]], None]:
    def ready(address: tuple[str, int]) -> None:
        # One line on stdout, flushed: parents (the CLI, tests) wait for it.
        print(f"ready {what} {address[0]}:{address[1]}", flush=True)

    return ready


@manager_app.command("serve")
def manager_serve(
    universe: UniverseOption = "default",
    listen: Annotated[str, typer.Option(help="HOST:PORT to listen on.")] = "127.0.0.1:9876",
    token: TokenOption = "",
    scan: Annotated[float, typer.Option(help="Seconds between expiry scans.")] = 10.0,
    expiry: Annotated[float, typer.Option(help="Seconds without heartbeat before a broker "
                                               "is dropped.")] = 120.0,
    tls_cert: CertOption = None, tls_key: KeyOption = None, tls_ca: CAOption = None,
    trace: TraceOption = None, trace_format: TraceFormatOption = "jsonl", run: RunOption = None,
) -> None:
    """Serve the universe's name service until Ctrl-C."""
    from ._process import parse_address, run_manager

    address = _guard(lambda: parse_address(listen))
    tls = _guard(lambda: _tls(tls_cert, tls_key, tls_ca))
    recorder = _recorder(trace, trace_format, pump="manager", run=run or universe)
    _guard(lambda: trio.run(lambda: run_manager(universe, address, token=token, expiry=expiry,
                                                scan_interval=scan, tls=tls, trace=recorder,
                                                ready=_ready("manager"))))


@broker_app.command("run")
def broker_run(
    broker_id: Annotated[list[str], typer.Option("--id", help="Broker id (repeatable).")],
    manager: Annotated[list[str], typer.Option(help="Manager HOST:PORT (repeatable).")],
    universe: UniverseOption = "default",
    listen: Annotated[str, typer.Option(help="HOST:PORT for links (port 0: any).")] =
        "127.0.0.1:0",
    token: TokenOption = "",
    echo: Annotated[list[int], typer.Option(help="Echo messages on this port "
                                                 "(repeatable).")] = [80],  # noqa: B006
    heartbeat: Annotated[float, typer.Option(help="Seconds between heartbeats.")] = 30.0,
    tls_cert: CertOption = None, tls_key: KeyOption = None, tls_ca: CAOption = None,
    plan: Annotated[pathlib.Path | None, typer.Option(
        help="Play these brokers' roles in a universe file (used by `universe up`).")] = None,
    trace: TraceOption = None, trace_format: TraceFormatOption = "jsonl", run: RunOption = None,
    role: Annotated[str | None, typer.Option(
        help="Tracking role of these brokers: server, tracker or both (default: none).")] = None,
    track_port: Annotated[int, typer.Option(help="Rendezvous port of the tracking role.")] =
        15555,
    tracker: Annotated[list[str], typer.Option(
        help="A tracker BROKER:PORT this server publishes to (repeatable).")] = [],  # noqa: B006
    topic: Annotated[list[str], typer.Option(
        help="A topic the server role declares at start (repeatable).")] = [],  # noqa: B006
    report_interval: Annotated[float, typer.Option(
        help="Seconds between a server's reports to its trackers.")] = 30.0,
    track_expiry: Annotated[float, typer.Option(
        help="Seconds without a report before a tracker drops a server.")] = 90.0,
    track_scan: Annotated[float, typer.Option(
        help="Seconds between a tracker's expiry scans.")] = 10.0,
    state_dir: Annotated[pathlib.Path | None, typer.Option(
        help="Where InfoVersion epochs persist, so versions grow across restarts.")] = None,
    busy_poll_us: Annotated[float, typer.Option(
        help="Links poll a quiet socket this long before sleeping: lower latency for a "
             "busy core (0: off).")] = 0.0,
) -> None:
    """Run brokers in this process, registered with the managers, until Ctrl-C."""
    from ._process import parse_address, run_brokers

    managers = _guard(lambda: [parse_address(m, default_port=9876) for m in manager])
    address = _guard(lambda: parse_address(listen))
    tls = _guard(lambda: _tls(tls_cert, tls_key, tls_ca))
    tracking = None
    if role is not None:
        tracking = {"role": role, "port": track_port, "trackers": tracker, "topics": topic,
                    "report_interval": report_interval, "expiry": track_expiry,
                    "scan_interval": track_scan, "state_dir": state_dir}
    elif tracker or topic:
        err.print("[red]error:[/red] --tracker and --topic need a tracking --role "
                  "(server, tracker or both)", highlight=False)
        raise typer.Exit(1)
    recorder = _recorder(trace, trace_format, pump="+".join(broker_id), run=run or universe)
    _guard(lambda: trio.run(lambda: run_brokers(
        universe, broker_id, managers, listen=address, token=token, echo_ports=echo,
        heartbeat=heartbeat, tls=tls, plan=None if plan is None else str(plan),
        trace=recorder, tracking=tracking, busy_poll=busy_poll_us * 1e-6,
        ready=_ready("brokers"))))


@app.command()
def routes(
    tracker: Annotated[list[str], typer.Option(
        help="A tracker as HOST:PORT (the first tracker of the process listening there) or "
             "BROKER@HOST:PORT (repeatable).")],
    universe: UniverseOption = "default",
    token: TokenOption = "",
    track_port: Annotated[int, typer.Option(help="Rendezvous port of the trackers.")] = 15555,
    vote_factor: Annotated[float, typer.Option(
        help="Drop a server listed by fewer than this share of the trackers.")] = 0.5,
    once: Annotated[bool, typer.Option(help="Print the table once and exit.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON line per change.")] = False,
    timeout: Annotated[float, typer.Option(help="With --once: seconds to wait for the "
                                                "trackers.")] = 10.0,
    tls_cert: CertOption = None, tls_key: KeyOption = None, tls_ca: CAOption = None,
) -> None:
    """The live route table built from trackers: servers, topics, versions and votes."""
    from rich.live import Live

    from .tracking.watch import parse_tracker, watch_routes

    trackers = _guard(lambda: [parse_tracker(t, i, port=track_port)
                               for i, t in enumerate(tracker, 1)])
    tls = _guard(lambda: _tls(tls_cert, tls_key, tls_ca))
    live: list[Live] = []

    def show(snap: dict[str, Any]) -> None:
        if as_json:
            print(json.dumps(snap), flush=True)
        elif once:
            out.print(_routes_table(snap))
        else:
            if not live:
                live.append(Live(_routes_table(snap), console=out, auto_refresh=False))
                live[0].start()
            live[0].update(_routes_table(snap), refresh=True)

    try:
        _guard(lambda: trio.run(lambda: watch_routes(
            universe, trackers, track_port=track_port, token=token, vote_factor=vote_factor,
            tls_client=None if tls is None else _client_context(tls), once=once,
            timeout=timeout, show=show)))
    except KeyboardInterrupt:
        pass
    finally:
        if live:
            live[0].stop()


def _client_context(tls: tuple[str, str, str | None]) -> Any:
    from rdv import tls_contexts

    return tls_contexts(*tls)[1]


def _routes_table(snap: dict[str, Any]) -> Table:
    trackers = ", ".join(f"{t} v{v}" for t, v in snap["trackers"].items()) or "none"
    table = Table(title=f"routes at t={snap['time']:.1f}s from {len(snap['trackers'])} "
                        f"tracker(s): {trackers}")
    for col in ("server", "ssl", "infoVersion", "votes", "topics"):
        table.add_column(col, justify="right" if col in ("infoVersion", "votes") else "left")
    for server in snap["servers"]:
        votes = "static" if server["static"] else str(server["votes"])
        table.add_row(server["address"], "yes" if server["ssl"] else "", str(server["infoVersion"]),
                      votes, ", ".join(server["topics"]))
    return table


@app.command()
def status(
    manager: Annotated[str, typer.Option(help="Manager HOST:PORT.")] = "127.0.0.1:9876",
    universe: UniverseOption = "default",
    token: TokenOption = "",
    tls_cert: CertOption = None, tls_key: KeyOption = None, tls_ca: CAOption = None,
) -> None:
    """The brokers a manager knows, with their age and last heartbeat."""
    from ._process import parse_address, query_status

    address = _guard(lambda: parse_address(manager, default_port=9876))
    tls = _guard(lambda: _tls(tls_cert, tls_key, tls_ca))
    brokers = _guard(lambda: trio.run(lambda: query_status(universe, address, token=token,
                                                           tls=tls)))
    table = Table(title=f"universe {universe!r} at {address[0]}:{address[1]}")
    for col in ("broker", "address", "version", "age (s)", "last heartbeat (s ago)"):
        table.add_column(col, justify="left" if col in ("broker", "address") else "right")
    for b in brokers:
        where = ":".join(str(part) for part in b["address"])  # type: ignore[attr-defined]
        table.add_row(str(b["id"]), where, str(b["version"]),
                      f"{b['age']:.1f}", f"{b['since_heartbeat']:.1f}")
    out.print(table)


def _reports_table(title: str, reports: list[dict[str, object]]) -> Table:
    table = Table(title=title)
    table.add_column("workload", no_wrap=True)
    for col in ("messages", "MB", "seconds", "msgs/s", "MB/s", "checked"):
        table.add_column(col, justify="right")
    for r in reports:
        seconds = float(r["seconds"])  # type: ignore[arg-type]
        msgs, nbytes = int(r["messages"]), int(r["bytes"])  # type: ignore[call-overload]
        rate = msgs / seconds if seconds else 0.0
        table.add_row(str(r["workload"]), f"{msgs:,}", f"{nbytes / 1e6:,.1f}",
                      f"{seconds:.3f}", f"{rate:,.0f}",
                      f"{nbytes / 1e6 / seconds if seconds else 0:,.1f}",
                      "[green]ok[/green]" if r["verified"] else "[red]FAILED[/red]")
    return table


@universe_app.command("run")
def universe_run(file: Annotated[pathlib.Path, typer.Argument(help="Universe TOML file.")],
                 trace: TraceOption = None, trace_format: TraceFormatOption = "jsonl",
                 run: RunOption = None) -> None:
    """Run a universe in this process, every broker on one pump."""
    from ._universe import load_universe, run_in_process

    spec = _guard(lambda: load_universe(file))
    _guard(lambda: _check_format(trace_format))
    with err.status(f"running universe {spec.name!r} ..."):
        reports = _guard(lambda: trio.run(lambda: run_in_process(
            spec, trace_dir=None if trace is None else str(trace), trace_format=trace_format,
            run=run)))
    if trace is not None:
        err.print(f"trace written to {trace}/")
    out.print(_reports_table(f"universe {spec.name!r}, one process",
                             [r.to_dict() for r in reports]))
    if not all(r.verified for r in reports):
        err.print("[red]error:[/red] a workload lost or changed messages")
        raise typer.Exit(1)


@universe_app.command("up")
def universe_up_cmd(
    file: Annotated[pathlib.Path, typer.Argument(help="Universe TOML file.")],
    token: TokenOption = "",
    trace: TraceOption = None, trace_format: TraceFormatOption = "jsonl", run: RunOption = None,
) -> None:
    """A manager and one process per broker on 127.0.0.1, shown live; Ctrl-C stops all."""
    from rich.live import Live

    from ._universe import load_universe
    from ._up import ChildState, universe_up

    spec = _guard(lambda: load_universe(file))
    _guard(lambda: _check_format(trace_format))
    trace_args: list[str] = []
    if trace is not None:
        run_id = run or f"{spec.name}-{time.strftime('%Y%m%dT%H%M%S')}"
        trace_args = ["--trace", str(trace.resolve()), "--trace-format", trace_format,
                      "--run", run_id]

    def live_table(states: dict[str, ChildState]) -> Table:
        table = Table(title=f"universe {spec.name!r}: manager + {len(states)} processes")
        for col in ("broker", "links", "messages", "MB", "msgs/s", "MB/s", "state"):
            table.add_column(col, justify="left" if col in ("broker", "state") else "right")
        for s in states.values():
            st = s.stats
            state = (f"exited {s.exit_code}" if s.exit_code is not None else
                     "done" if s.reports is not None else "running")
            table.add_row(s.broker, str(st.get("links", 0)), f"{st.get('messages', 0):,}",
                          f"{st.get('bytes', 0) / 1e6:,.1f}", f"{s.rate[0]:,.0f}",
                          f"{s.rate[1] / 1e6:,.1f}", state)
        return table

    with Live(live_table({b: ChildState(b) for b in spec.brokers}), console=out,
              refresh_per_second=4, transient=False) as live:
        states = _guard(lambda: trio.run(lambda: universe_up(
            spec, file, token=token, on_change=lambda st: live.update(live_table(st)),
            trace_args=trace_args)))
    reports = [r for s in states.values() for r in (s.reports or [])]
    out.print(_reports_table(f"universe {spec.name!r}, one process per broker", reports))
    done = all(states[w.source].reports is not None for w in spec.workloads)
    if not done or not all(r["verified"] for r in reports):
        err.print("[red]error:[/red] the universe stopped before every workload was checked")
        raise typer.Exit(1)


@trace_app.command("analyze")
def trace_analyze(
    traces: Annotated[pathlib.Path, typer.Argument(help="Directory of trace files.")],
    out: Annotated[pathlib.Path | None, typer.Option(
        help="Write tables, summary.json and plots here (default: TRACES/analysis).")] = None,
    master: Annotated[str, typer.Option(help="Spark master.")] = "local[2]",
    json_out: Annotated[bool, typer.Option("--json", help="Print summary.json instead.")] =
        False,
) -> None:
    """Replay traces with the Spark job (replay/job.py): invariants, latency, throughput."""
    from replay import analyze, find_traces, print_summary, session

    _guard(lambda: find_traces(str(traces)))  # before a JVM starts
    target = out if out is not None else traces / "analysis"
    with err.status(f"replaying {traces} on Spark ({master}) ..."):
        spark = _guard(lambda: session(master))
        try:
            summary = _guard(lambda: analyze(spark, str(traces), str(target)))
        finally:
            spark.stop()
    if json_out:
        print(json.dumps(summary, default=str))
    else:
        print_summary(summary)
        err.print(f"tables, summary.json and plots in {target}/")
    if summary["violation_count"]:
        raise typer.Exit(1)


@trace_app.command("diagram")
def trace_diagram(
    file: Annotated[pathlib.Path, typer.Argument(help="One trace file (.jsonl or .parquet).")],
    link: Annotated[str | None, typer.Option(help="Link id, e.g. server/1.")] = None,
    connects_of: Annotated[str | None, typer.Option(
        "--connects-of", help="Instead: every connect attempt of this broker.")] = None,
    output: Annotated[pathlib.Path | None, typer.Option(
        "--out", help="Write here instead of stdout.")] = None,
) -> None:
    """A Mermaid sequence diagram of one link's life, from a real trace."""
    from replay.diagram import connect_diagram, link_diagram, read_events

    if (link is None) == (connects_of is None):
        err.print("[red]error:[/red] give one of --link or --connects-of")
        raise typer.Exit(1)
    events = _guard(lambda: read_events(file))
    text = _guard(lambda: link_diagram(events, link) if link is not None
                  else connect_diagram(events, connects_of or ""))
    if output is None:
        print(text, end="")
    else:
        _guard(lambda: output.write_text(text))
        err.print(f"wrote {output}")


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    app()
