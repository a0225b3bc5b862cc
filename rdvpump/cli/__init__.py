"""The ``rdvpump`` command: one typer app, one module per command group.

Library errors are turned into one red line and exit 1 in :mod:`._common`; the
library itself never prints.
"""

from __future__ import annotations

import logging
from importlib.metadata import PackageNotFoundError, version
from typing import Annotated

import typer

from . import bench, broker, demo, diagram, manager, mq, routes, status, trace, universe
from ._common import out
from ._help import tidy_help

tidy_help()

app = typer.Typer(help="rdvpump: an event-pump actor framework for broker-to-broker links.",
                  no_args_is_help=True, add_completion=False,
                  context_settings={"help_option_names": ["-h", "--help"]})
app.command()(demo.demo)
app.command()(routes.routes)
app.command()(status.status)
app.add_typer(bench.app, name="bench")
app.add_typer(diagram.app, name="diagram")
app.add_typer(trace.app, name="trace")
app.add_typer(manager.app, name="manager")
app.add_typer(broker.app, name="broker")
app.add_typer(mq.app, name="mq")
app.add_typer(universe.app, name="universe")


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


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    app()


__all__ = ["app", "main"]
