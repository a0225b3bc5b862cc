"""rdvpump identity: identities, their secrets and their rights, for identities files."""

from __future__ import annotations

import pathlib
from typing import Annotated

import typer

from ._common import err, fail, guard, out

app = typer.Typer(rich_markup_mode=None, no_args_is_help=True,
                  help="Identities: who may link, and what each may do (broker run and "
                       "manager run --identities FILE).")

Patterns = Annotated[list[str], typer.Option(help="A topic pattern (repeatable).")]


@app.command("new")
def identity_new(
    name: Annotated[str, typer.Argument(help="The identity's name.")],
    file: Annotated[pathlib.Path | None, typer.Option(
        "--file", help="Append its table to this identities file (made if missing).")
    ] = None,
    publish: Patterns = [],  # noqa: B006
    consume: Patterns = [],  # noqa: B006
    declare: Patterns = [],  # noqa: B006
    member: Annotated[list[str], typer.Option(
        help="A broker id it speaks as, on cluster and group links (repeatable): a "
             "server's identity.")] = [],  # noqa: B006
    admin: Annotated[bool, typer.Option(
        "--admin", help="Failovers and other changes of groups and clusters.")] = False,
) -> None:
    """A new identity with a random secret: NAME:SECRET on stdout (for --identity or
    $RDVPUMP_IDENTITY), and its table (which holds only a hash of the secret) appended
    to --file, or on stderr."""
    from rdv import Credential, Identities

    credential = guard(lambda: Credential.new(name))
    lines = [f"[identity.{name}]", f'secret = "{credential.verifier()}"']
    for key, values in (("publish", publish), ("consume", consume), ("declare", declare),
                        ("member", member)):
        if values:
            lines.append(f"{key} = [{', '.join(_quoted(v) for v in values)}]")
    if admin:
        lines.append("admin = true")
    table = "\n".join(lines) + "\n"
    if file is None:
        err.print(table, end="", markup=False, highlight=False)
    else:
        old = file.read_text() if file.exists() else ""
        held = guard(lambda: Identities.parse(_toml(old, file), source=str(file)))
        if name in held.names():
            raise fail(f"{file} holds identity {name!r} already")
        guard(lambda: Identities.parse(_toml(old + "\n" + table, file), source=str(file)))
        with file.open("a") as f:
            f.write(("\n" if old and not old.endswith("\n\n") else "") + table)
    out.print(f"{name}:{credential.secret}", markup=False, highlight=False)


def _quoted(value: str) -> str:
    import json

    return json.dumps(value)


def _toml(text: str, file: pathlib.Path) -> dict[str, object]:
    import tomllib

    from rdv import IdentityError

    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise IdentityError(f"{file}: not TOML: {exc}") from None
