"""rdvpump routes: the live route table built from trackers."""

from __future__ import annotations

import contextlib
import json
import logging
from typing import Annotated, Any

import typer
from rich.live import Live
from rich.table import Table

from brokermgr.tracking import DEFAULT_TRACK_PORT, DEFAULT_VOTE_FACTOR
from rdv import tls_contexts

from ..watch import parse_tracker, watch_routes
from ._common import (
    CAOption,
    CertOption,
    IdentityOption,
    KeyOption,
    TokenOption,
    UniverseOption,
    err,
    group_cell,
    guard,
    interrupted,
    is_ctrl_c,
    logs_above,
    out,
    positive,
    run_trio,
    show_table,
    slave_lags,
    tls_files,
)


def routes(
    tracker: Annotated[list[str], typer.Option(
        help="A tracker as HOST:PORT (the first tracker of the process listening there) or "
             "BROKER@HOST:PORT (repeatable).")],
    universe: UniverseOption = "default",
    token: TokenOption = "",
    identity: IdentityOption = "",
    track_port: Annotated[int, typer.Option(help="Rendezvous port of the trackers.")] = (
        DEFAULT_TRACK_PORT),
    vote_factor: Annotated[float, typer.Option(
        help="Drop a server listed by fewer than this share of the trackers.")] = (
        DEFAULT_VOTE_FACTOR),
    once: Annotated[bool, typer.Option(help="Print the table once and exit.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON line per change.")] = False,
    timeout: Annotated[float, typer.Option(
        callback=positive, help="With --once: seconds to wait for the trackers.")] = 10.0,
    tls_cert: CertOption = None, tls_key: KeyOption = None, tls_ca: CAOption = None,
) -> None:
    """The live route table built from trackers: servers, topics, versions and votes."""
    trackers = guard(lambda: [parse_tracker(t, i, port=track_port)
                               for i, t in enumerate(tracker, 1)])
    tls = guard(lambda: tls_files(tls_cert, tls_key, tls_ca))
    live: list[Live] = []
    held = contextlib.ExitStack()

    def show(snap: dict[str, Any]) -> None:
        if as_json:
            print(json.dumps(snap), flush=True)
        elif once:
            show_table(_routes_table(snap))
        elif not live:
            live.append(held.enter_context(Live(_routes_table(snap), console=out,
                                                auto_refresh=False)))
            # log lines (a link's warning) are printed above the table, as the live
            # display prints the warnings written to stderr; written past it, they
            # would leave a copy of its first lines behind at every refresh
            held.enter_context(logs_above(out, logging.WARNING))
        else:
            live[0].update(_routes_table(snap), refresh=True)

    try:
        with held:
            guard(lambda: run_trio(lambda: watch_routes(
                universe, trackers, track_port=track_port, token=token,
                identity=identity or None,
                vote_factor=vote_factor,
                tls_client=None if tls is None else _client_context(tls), once=once,
                timeout=timeout, refresh=0.0 if as_json or once else 1.0, show=show,
                warn=lambda text: err.print(f"warning: {text}", style="yellow", markup=False,
                                            highlight=False))))
    except BaseException as exc:
        # the live table has stopped (as last shown): the last line goes below it
        if is_ctrl_c(exc):
            raise interrupted() from None
        raise


def _client_context(tls: tuple[str, str, str | None]) -> Any:
    return tls_contexts(*tls)[1]


def _routes_table(snap: dict[str, Any]) -> Table:
    trackers = ", ".join(f"{t} v{v}" for t, v in snap["trackers"].items()) or "none"
    table = Table(title=f"routes at t={snap['time']:.1f}s from {len(snap['trackers'])} "
                        f"tracker(s): {trackers}")
    grouped = any(server.get("group") for server in snap["servers"])
    for col in ("server", "ssl", "infoVersion", "votes", "topics", *(("group",) * grouped)):
        table.add_column(col, justify="right" if col in ("infoVersion", "votes") else "left")
    lags = slave_lags([(server.get("group"), server.get("held"))
                       for server in snap["servers"]])
    for server, lag in zip(snap["servers"], lags, strict=True):
        votes = "static" if server["static"] else str(server["votes"])
        table.add_row(server["address"], "yes" if server["ssl"] else "no",
                      str(server["infoVersion"]),
                      votes, ", ".join(server["topics"]),
                      *((group_cell(server.get("group"), lag),) * grouped))
    return table
