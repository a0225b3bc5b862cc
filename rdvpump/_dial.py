"""What the CLI's clients of another process's service (``mq``, ``routes``) share: when a
broker that answers has no service on the port dialled."""

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
