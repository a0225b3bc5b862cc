"""rdvpump status: the brokers a manager knows."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from ._common import (
    MANAGER_PORT,
    CAOption,
    CertOption,
    IdentityOption,
    KeyOption,
    TokenOption,
    UniverseOption,
    group_cell,
    guard,
    interruptible,
    positive,
    run_trio,
    show_table,
    slave_lags,
    tls_files,
)


def status(
    manager: Annotated[str, typer.Option(help="Manager HOST:PORT.")] = (
        f"127.0.0.1:{MANAGER_PORT}"),
    universe: UniverseOption = "default",
    token: TokenOption = "",
    identity: IdentityOption = "",
    tls_cert: CertOption = None, tls_key: KeyOption = None, tls_ca: CAOption = None,
    wait: Annotated[list[str], typer.Option(
        help="Wait until this broker is registered (repeatable); a manager that is still "
             "starting is dialled again meanwhile.")] = [],  # noqa: B006
    timeout: Annotated[float, typer.Option(
        callback=positive,
        help="Seconds to wait for the manager (and --wait brokers).")] = 5.0,
) -> None:
    """The brokers a manager knows, with their age and last heartbeat (and a replicated
    group's member's role, a cluster's server's root and epoch, and where a process
    serves its metrics)."""
    # imported here: ``status --help`` starts without trio and the brokers
    from rich.table import Table

    from rdv import Address

    from ..admin import query_status

    address = guard(lambda: Address.parse(manager, default_port=MANAGER_PORT))
    tls = guard(lambda: tls_files(tls_cert, tls_key, tls_ca))
    brokers = interruptible(lambda: run_trio(lambda: query_status(
        universe, address, token=token, identity=identity or None, tls=tls, timeout=timeout,
        wait=wait)))
    table = Table(title=f"universe {universe!r} at {address[0]}:{address[1]}")
    grouped = any(b.get("group") for b in brokers)
    clustered = any(b.get("cluster") for b in brokers)
    metered = any(b.get("metrics") for b in brokers)
    lags = slave_lags([(b.get("group"), _held(b)) for b in brokers])
    insync = _insync(brokers)
    for col in ("broker", "address", "version", "age (s)", "last heartbeat (s ago)",
                *(("group",) * grouped), *(("cluster",) * clustered),
                *(("metrics",) * metered)):
        table.add_column(col, justify="left" if col in ("broker", "address", "group",
                                                        "cluster", "metrics") else "right")
    for b, lag in zip(brokers, lags, strict=True):
        where = ":".join(str(part) for part in b["address"])  # type: ignore[attr-defined]
        table.add_row(str(b["id"]), where, str(b["version"]),
                      f"{b['age']:.1f}", f"{b['since_heartbeat']:.1f}",
                      *((group_cell(b.get("group"), lag, b["id"] in insync),) * grouped),
                      *((_cluster_cell(b.get("cluster")),) * clustered),
                      *((str(b.get("metrics") or ""),) * metered))
    show_table(table)


def _cluster_cell(cluster: Any) -> str:
    """A cluster's server in the table: ``shop primary, root a@3, state v5``."""
    if not cluster:
        return ""
    root = f"root {cluster['root']}@{cluster['epoch']}" if cluster["root"] else "no root"
    return f"{cluster['name']} {cluster['type']}, {root}, state v{cluster['version']}"


def _insync(brokers: list[dict[str, Any]]) -> set[object]:
    """The slaves their masters report in sync (the members a failover may promote)."""
    return {member for b in brokers
            if (b.get("group") or {}).get("role") == "master"
            and isinstance(progress := b.get("progress"), dict)
            for member in progress.get("insync", ())}


def _held(broker: dict[str, Any]) -> int | None:
    """The records a group's member said it holds when it registered, if it did."""
    progress = broker.get("progress")
    return int(progress["held"]) if isinstance(progress, dict) else None
