"""What the CLI's clients of another process's service (``mq``, ``routes``, ``status``,
``console``) share: the universe of a tool process (:func:`tool_universe`), when a broker
that answers has no service on the port dialled, and how a refusal reads."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio

from brokermgr import BrokerManager
from pump import Pump
from rdv import Refusal


@asynccontextmanager
async def tool_universe(universe: str, *, name: str = "tool", token: str = "",
                        identity: str | None = None, **options: Any
                        ) -> AsyncIterator[BrokerManager]:
    """A tool process's side of ``universe``: its pump served and its links dialling out
    over TCP (from 127.0.0.1, a port the kernel picks) for the block, then stopped.
    ``options`` are :class:`~brokermgr.BrokerManager`'s (``directory``, ``tls_client``)."""
    manager = BrokerManager(universe, token=token, identity=identity, pump=Pump(name=name),
                            **options)
    async with trio.open_nursery() as nursery:
        await nursery.start(manager.pump.serve)
        await nursery.start(manager.serve_network, "127.0.0.1", 0)
        try:
            yield manager
        finally:
            nursery.cancel_scope.cancel()

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
