"""Help as users read it: a flag shows no type (it takes no value), and an argument shows
as NAME in the usage line (click's convention), not typer's ``{name}``.

typer renders both from public methods of its parameter classes
(``TyperOption.display_type_rich``, ``TyperArgument.get_usage_pieces``); these are
wrapped once, when the CLI is imported, and only where this typer has them.
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

    option = getattr(core, "TyperOption", None)
    shown = getattr(option, "display_type_rich", None)
    if option is not None and shown is not None:
        def display_type_rich(self: Any, ctx: Any) -> str | None:
            if self.is_flag and not self.count:
                return None
            return shown(self, ctx)  # type: ignore[no-any-return]

        option.display_type_rich = display_type_rich
    argument = getattr(core, "TyperArgument", None)
    if argument is not None and hasattr(argument, "get_usage_pieces"):
        def get_usage_pieces(self: Any, ctx: Any) -> list[str]:
            name = str(self.metavar or self.name).upper()
            if not self.required:
                name = f"[{name}]"
            return [name + ("..." if self.nargs != 1 else "")]

        argument.get_usage_pieces = get_usage_pieces
