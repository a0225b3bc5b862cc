"""Watch a route table from outside: the engine of ``rdvpump routes``.

A throwaway process-side universe with one client broker subscribes to the
given trackers over TCP and hands a snapshot of its route table to ``show``
after every change (and once at the start).
"""

from __future__ import annotations

import math
import ssl
from collections.abc import Callable
from typing import Any

import trio

from brokermgr.tracking import DEFAULT_TRACK_PORT, TRACKER_ALIAS, RouteClient, RouteTable
from pump import ConfigError
from rdv import Address, Refusal, is_final, parse_located

from ._dial import NotBound, tool_universe


def parse_tracker(text: str, index: int, *, port: int = DEFAULT_TRACK_PORT
                  ) -> tuple[str, Address]:
    """``HOST:PORT`` (the process's first tracker) or ``ID@HOST:PORT`` -> (broker id, address)."""
    try:
        broker_id, address = parse_located(text)
    except ValueError as exc:
        raise ConfigError(f"tracker {exc}") from None
    return broker_id or f"{TRACKER_ALIAS}.{index}", address


def snapshot(routes: RouteTable, now: float,
             names: dict[str, str] | None = None) -> dict[str, Any]:
    """The route table as plain JSON: servers with versions and votes, topics, trackers
    (named by ``names``: the address each tracker gives itself)."""
    names = names or {}
    servers = []
    for address, info in sorted(routes.server_table.items()):
        servers.append({
            "address": address, "ssl": info.server_address.ssl_enabled,
            "infoVersion": info.info_version, "votes": routes.voters(address),
            "static": address in routes.static,
            "topics": sorted(info.topic_table),
            "group": None if info.group is None else info.group.to_json(),
            "held": info.held})
    topics = {name: sorted(by_server) for name, by_server in sorted(routes.topic_table.items())}
    return {"time": round(now, 3), "trackers": {names.get(t, t): v.version for t, v in
                                                sorted(routes.votes.items())},
            "servers": servers, "topics": topics}


async def watch_routes(universe: str, trackers: list[tuple[str, Address]], *,
                       track_port: int = DEFAULT_TRACK_PORT, token: str = "",
                       identity: str | None = None,
                       vote_factor: float = 0.5, tls_client: ssl.SSLContext | None = None,
                       once: bool = False, timeout: float = 10.0, refresh: float = 0.0,
                       show: Callable[[dict[str, Any]], None],
                       warn: Callable[[str], None] | None = None) -> None:
    """Subscribe to ``trackers`` and call ``show(snapshot)`` once the first tracker has
    answered, then on every change (and every ``refresh`` seconds, if set), until
    cancelled.  A tracker's final refusal (``unauthorized``, ``unknown broker``) ends it
    at once with OSError naming the tracker.

    With ``once``: wait until every tracker has answered (or ``timeout``), show
    one snapshot and return; OSError if no tracker answered at all.  Otherwise ``warn``
    is told, once until it answers, of each tracker that could not be reached yet.
    """
    async with tool_universe(universe, name="routes", token=token, identity=identity,
                             tls_client=tls_client, directory=dict(trackers)
                             ) as manager, trio.open_nursery() as nursery:
        client = RouteClient(manager.add_broker(f"@routes.{id(manager):x}"),
                             vote_factor=vote_factor)
        given = {}  # each tracker as the user gave it, not by the alias dialled
        for broker_id, (host, port) in trackers:
            client.add_tracker(f"{broker_id}:{track_port}")
            given[f"{broker_id}:{track_port}"] = f"{host}:{port}" if broker_id.startswith(
                TRACKER_ALIAS) else f"{broker_id}@{host}:{port}"
        for where, sub in client.trackers.items():
            nursery.start_soon(_refusals, given.get(str(where), str(where)), track_port, sub,
                               None if once else warn)

        def current() -> dict[str, Any]:
            names = {a: s.reported for a, s in client.trackers.items() if s.reported}
            return snapshot(client.routes, manager.pump.now(), names)

        if once:
            with trio.move_on_after(timeout):
                for sub in client.trackers.values():
                    while sub.queue is None or sub.address.address not in client.routes.votes:
                        if sub.queue is None:
                            await sub.attempted()
                        else:
                            await client.changed()
            if not client.routes.votes:
                why = "; ".join(f"{given.get(str(a), a)}: {s.last_refusal or 'no answer'}"
                                for a, s in client.trackers.items())
                raise OSError(f"no tracker answered within {timeout} s ({why})")
            show(current())
            await client.aclose()  # a clean close: trackers hear why, not a lost connection
            nursery.cancel_scope.cancel()
            return
        while not client.routes.votes:  # the first line is the first tracker's answer
            await client.changed()
        show(current())
        while True:
            # a change, or every ``refresh`` seconds: the table's time moves
            with trio.move_on_after(refresh if refresh else math.inf) as waited:
                await client.changed()
            if waited.cancelled_caught and not refresh:
                continue
            show(current())


async def _refusals(tracker: str, track_port: int, sub: Any,
                    warn: Callable[[str], None] | None) -> None:
    """End ``routes`` with the reason when ``tracker`` refuses for good, or answers
    without a tracker on ``track_port`` for a grace (:class:`NotBound`); ``warn`` of the
    first refusal since it last answered."""
    unbound = NotBound()
    warned = False
    while True:
        await sub.attempted()
        reason = sub.last_refusal
        refusal = getattr(reason, "refusal", None)
        if refusal == Refusal.UNKNOWN_BROKER and "@" not in tracker:
            raise OSError(f"no tracker at {tracker}: the process there answers, but runs no "
                          f"tracker (is it a broker run --role tracker?)")
        if reason is not None and is_final(reason):
            raise OSError(f"tracker {tracker} refused: {reason}")
        if unbound.too_long(reason, sub.queue is not None):
            raise OSError(f"no tracker at {tracker}: the broker answers, but nothing is "
                          f"bound on its port {track_port} (is it a broker run --role "
                          f"tracker?)")
        warned = warned and sub.queue is None
        if warn is not None and sub.queue is None and reason is not None and not warned:
            warn(f"tracker {tracker}: {reason}; dialling again")
            warned = True
