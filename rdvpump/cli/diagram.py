"""rdvpump diagram: diagrams generated from the code."""

from __future__ import annotations

import pathlib
from typing import Annotated

import typer

from ._common import err, guard

app = typer.Typer(rich_markup_mode=None, help="Diagrams generated from the code.",
                  no_args_is_help=True)


@app.command("states")
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
        guard(lambda: output.write_text(text))
        err.print(f"wrote {output}")
