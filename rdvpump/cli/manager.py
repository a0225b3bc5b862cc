"""rdvpump manager: the universe's BrokerManager served as a name service."""

from __future__ import annotations

from typing import Annotated

import trio
import typer

from brokermgr import DEFAULT_BROKER_EXPIRY, DEFAULT_MANAGER_PORT, DEFAULT_SCAN_INTERVAL
from rdv import Address

from ..children import ready_line
from ..processes import run_manager
from ._common import (
    CAOption,
    CertOption,
    IdentitiesOption,
    KeyOption,
    MetricsOption,
    RunOption,
    TokenOption,
    TraceFormatOption,
    TraceOption,
    UniverseOption,
    as_a_server,
    guard,
    recorder,
    tls_files,
)

app = typer.Typer(rich_markup_mode=None, help="The universe's BrokerManager as a name service.",
                  no_args_is_help=True)


@app.command("serve")
def manager_serve(
    universe: UniverseOption = "default",
    listen: Annotated[str, typer.Option(help="HOST:PORT to listen on.")] = (
        f"127.0.0.1:{DEFAULT_MANAGER_PORT}"),
    token: TokenOption = "",
    scan: Annotated[float, typer.Option(help="Seconds between expiry scans.")] = (
        DEFAULT_SCAN_INTERVAL),
    expiry: Annotated[float, typer.Option(help="Seconds without heartbeat before a broker "
                                               "is dropped.")] = DEFAULT_BROKER_EXPIRY,
    tls_cert: CertOption = None, tls_key: KeyOption = None, tls_ca: CAOption = None,
    trace: TraceOption = None, trace_format: TraceFormatOption = "jsonl", run: RunOption = None,
    metrics: MetricsOption = None,
    identities: IdentitiesOption = None,
) -> None:
    """Serve the universe's name service until Ctrl-C."""

    address = guard(lambda: Address.parse(listen))
    metrics_at = None if metrics is None else guard(lambda: Address.parse(metrics))
    tls = guard(lambda: tls_files(tls_cert, tls_key, tls_ca))
    trace_recorder = recorder(trace, trace_format, pump="manager", run=run or universe)
    as_a_server()
    guard(lambda: trio.run(lambda: run_manager(universe, address, token=token, expiry=expiry,
                                                identities=None if identities is None
                                                else str(identities),
                                                scan_interval=scan, tls=tls, trace=trace_recorder,
                                                metrics=metrics_at,
                                                ready=ready_line("manager"))))
