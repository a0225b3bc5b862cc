"""What the CLI's clients of another process's service (``mq``, ``routes``, ``status``)
share: when a broker that answers has no service on the port dialled, and how a refusal
reads."""

from __future__ import annotations

import trio

from rdv import Refusal

#: How long a broker that answers but has nothing bound on the port dialled may take to
#: bind it (a server or tracker process binds it before it prints its ready line): then
#: the client says that broker runs no such service.
NOT_BOUND_GRACE = 1.0


class NotBound:
    """Told each dial's outcome, says when the broker has answered ``not bound`` for
    :data:`NOT_BOUND_GRACE` seconds in a row."""

    def __init__(self) -> None:
        self.since: float | None = None

    def too_long(self, reason: object, linked: bool) -> bool:
        if linked or getattr(reason, "refusal", None) != Refusal.NOT_BOUND:
            self.since = None
            return False
        now = trio.current_time()
        self.since = now if self.since is None else self.since
        return now - self.since >= NOT_BOUND_GRACE


def refusal_text(where: str, reason: object, side: str = "server") -> str:
    """A refusal as a command says it: ``where: reason``, and for ``unauthorized`` what
    it means (the universe's token or name is not the one ``side`` has), since the other
    side says no more than that."""
    said = f"{where}: {reason}"
    if getattr(reason, "refusal", None) == Refusal.UNAUTHORIZED:
        said += (f" (the token or the universe name is not the {side}'s: --token or "
                 f"$RDVPUMP_TOKEN, and --universe)")
    return said
