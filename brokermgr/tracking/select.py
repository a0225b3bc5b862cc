"""Server selection: an algorithm the producer or consumer passes in, with zbus's built-ins.

A selector is ``select(routes, topic, key) -> list[address]``: the servers a
message (or a consumer) should go to, in order; an empty list means no route.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

from .routes import RouteTable

Selector = Callable[[RouteTable, str, "bytes | str | None"], list[str]]


class RoundRobin:
    """zbus's producer default.

    Round-robin over the topic's servers that have consumers; when none has,
    the server with the most consumers, ties broken by the lowest message
    depth, then by address.  The candidate list is cached until the route
    table changes.
    """

    def __init__(self) -> None:
        self._next = 0
        self._cache: dict[str, tuple[int, list[str]]] = {}

    def __call__(self, routes: RouteTable, topic: str, key: bytes | str | None = None
                 ) -> list[str]:
        cached = self._cache.get(topic)
        if cached is None or cached[0] != routes.version:
            servers = routes.servers_of(topic)
            live = sorted(a for a, t in servers.items() if t.consumer_count > 0)
            cached = (routes.version, live)
            self._cache[topic] = cached
        live = cached[1]
        if live:
            self._next += 1
            return [live[self._next % len(live)]]
        servers = routes.servers_of(topic)
        if not servers:
            return []
        best = min(servers.items(),
                   key=lambda kv: (-kv[1].consumer_count, kv[1].message_depth, kv[0]))
        return [best[0]]


def all_servers(routes: RouteTable, topic: str, key: bytes | str | None = None) -> list[str]:
    """zbus's consumer (and admin) default: every server in the table."""
    return sorted(routes.server_table)


def by_key_hash(routes: RouteTable, topic: str, key: bytes | str | None = None) -> list[str]:
    """The same key goes to the same server while the topic's servers stay the same.

    CRC-32 of the key over the topic's servers sorted by address; no key or no
    server holding the topic gives no route.
    """
    servers = sorted(routes.servers_of(topic))
    if not servers or key is None:
        return []
    data = key.encode() if isinstance(key, str) else key
    return [servers[zlib.crc32(data) % len(servers)]]
