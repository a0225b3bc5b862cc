"""Help as users read it: plain text (every word of it, square brackets too: typer's rich
markup would take ``[explore]`` for a tag and drop it, so every app is made with
``rich_markup_mode=None``), and an argument shows as NAME in the usage line (click's
convention), not typer's ``{name}``.

typer renders the usage from a public method of its argument class
(``TyperArgument.get_usage_pieces``); it is wrapped once, when the CLI is imported, and
only where this typer has it.
"""

from __future__ import annotations

from typing import Any

_done = False


def tidy_help() -> None:
    global _done
    if _done:
        return
    _done = True
    from typer import core

    argument = getattr(core, "TyperArgument", None)
    if argument is not None and hasattr(argument, "get_usage_pieces"):
        def get_usage_pieces(self: Any, ctx: Any) -> list[str]:
            name = str(self.metavar or self.name).upper()
            if not self.required:
                name = f"[{name}]"
            return [name + ("..." if self.nargs != 1 else "")]

        argument.get_usage_pieces = get_usage_pieces
