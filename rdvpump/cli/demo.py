"""rdvpump demo: the demo universe, end to end."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from ._common import err, fail, interruptible, out, show_table


def demo(
    clients: Annotated[int, typer.Option(help="Client brokers.")] = 4,
    connects: Annotated[int, typer.Option(help="Connections each client makes in turn.")] = 3,
    messages: Annotated[int, typer.Option(help="Messages per connection.")] = 50,
    max_size: Annotated[int, typer.Option(help="Largest message, bytes (sizes 1..max).")] = 10240,
    ring: Annotated[int, typer.Option(help="Ring capacity per direction, a power of two.")] = 65536,
    seed: Annotated[int, typer.Option(
        help="Seed of the run: the messages' sizes and the order tasks run in (the same "
             "seed gives the same run).")] = 1,
) -> None:
    """Run an in-process echo universe end to end and print what happened."""
    import functools

    from ..demo import run_echo_demo
    from ..testing import run_simulation

    # a simulation on the virtual clock, its scheduling drawn from the seed: the same
    # seed gives the same run, pump step for pump step
    with err.status("running the echo universe ..."):
        report = interruptible(lambda: run_simulation(functools.partial(
            run_echo_demo, clients=clients, connects=connects, messages=messages,
            max_size=max_size, ring_capacity=ring, seed=seed), seed=seed))
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
    show_table(table)
    rate = report.messages / report.elapsed_s if report.elapsed_s else 0.0
    out.print(f"{report.pump_steps:,} pump steps in {report.elapsed_s:.2f} s "
              f"({rate:,.0f} echoed messages/s)")
    if not report.ok:
        raise fail("some echoes differ from what was sent")
