"""rdvpump console: a live web page of a running universe."""

from __future__ import annotations

from typing import Annotated

import typer

from ._common import MANAGER_PORT, IdentityOption, TokenOption, UniverseOption, err, guard


def console(
    manager: Annotated[str, typer.Option(help="Manager HOST:PORT.")] = (
        f"127.0.0.1:{MANAGER_PORT}"),
    universe: UniverseOption = "default",
    token: TokenOption = "",
    identity: IdentityOption = "",
    listen: Annotated[str, typer.Option(
        help="HOST:PORT the page is served on (port 0: one the kernel picks).")] = (
        "127.0.0.1:8080"),
    admin: Annotated[bool, typer.Option(
        "--admin", help="Let the page declare topics and consume groups and switch a "
        "replicated group's master, as mq declare and mq failover do.")] = False,
) -> None:
    """A live web page of a running universe: its brokers, links and their rates, MQ
    groups' lag, trackers and recent warnings, read from the name service and the
    processes' --metrics pages once a second; read-only unless started with --admin."""
    # imported here: ``rdvpump --help`` starts without trio and the brokers
    import trio

    from rdv import Address

    from ..children import stop_signals
    from ..console import UniverseConsole, check_admin_address, serve_console

    where = guard(lambda: Address.parse(manager, default_port=MANAGER_PORT))
    at = guard(lambda: Address.parse(listen))
    if admin:
        guard(lambda: check_admin_address(at.host))

    async def run() -> None:
        watched = UniverseConsole(universe, where, token=token,
                                   identity=identity or None, admin=admin)
        with stop_signals() as until_signalled:
            async with trio.open_nursery() as nursery:
                await nursery.start(watched.run)
                bound = await nursery.start(serve_console, watched, at.host, at.port)
                err.print(f"console of universe {universe!r} on http://{bound}/",
                          markup=False, highlight=False)
                if admin:
                    err.print("--admin: the page may declare topics and groups and switch "
                              "a replicated group's master", markup=False, highlight=False)
                await until_signalled()
                nursery.cancel_scope.cancel()

    guard(lambda: trio.run(run))
