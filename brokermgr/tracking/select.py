"""Server selection: an algorithm the producer or consumer passes in, with zbus's built-ins.

A selector is ``select(routes, topic, key) -> list[address]``: the servers a
message (or a consumer) should go to, in order; an empty list means no route.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Callable

from .routes import RouteTable

Selector = Callable[[RouteTable, str, "bytes | str | None"], list[str]]


class RoundRobin:
    """zbus's producer default.

    Round-robin over the topic's servers that have consumers; when none has,
    the server with the most consumers, ties broken by the lowest message
    depth, then by address.  Each topic keeps its own position, so one
    selector shared by several topics spreads each of them.  The candidate
    list is cached until the route table changes.
    """

    def __init__(self) -> None:
        self._next: dict[str, int] = {}
        self._cache: dict[str, tuple[int, list[str]]] = {}

    def __call__(self, routes: RouteTable, topic: str, key: bytes | str | None = None
                 ) -> list[str]:
        cached = self._cache.get(topic)
        if cached is None or cached[0] != routes.version:
            servers = routes.writable_of(topic)
            live = sorted(a for a, t in servers.items() if t.consumer_count > 0)
            cached = (routes.version, live)
            self._cache[topic] = cached
        live = cached[1]
        if live:
            position = self._next.get(topic, -1) + 1
            self._next[topic] = position
            return [live[position % len(live)]]
        servers = routes.writable_of(topic)
        if not servers:
            return []
        best = min(servers.items(),
                   key=lambda kv: (-kv[1].consumer_count, kv[1].message_depth, kv[0]))
        return [best[0]]


def all_servers(routes: RouteTable, topic: str, key: bytes | str | None = None) -> list[str]:
    """zbus's consumer (and admin) default: every server in the table, but of a
    replicated group only its master (its slaves while it has none)."""
    return routes.readable()


def _key_bytes(key: bytes | str) -> bytes:
    return key.encode() if isinstance(key, str) else key


def by_key_hash(routes: RouteTable, topic: str, key: bytes | str | None = None) -> list[str]:
    """The same key goes to the same server while that server holds the topic.

    Rendezvous (highest random weight) hashing: each of the topic's servers
    scores the key (BLAKE2b of key and address) and the highest score wins.
    When one of N servers leaves, only the keys it held move (to the servers
    that scored them second); when one joins, about 1/(N+1) of the keys move
    to it and nothing else moves.  No key or no server holding the topic gives
    no route.  The old modulo rule is :func:`by_key_modulo`.
    """
    servers = routes.writable_of(topic)
    if not servers or key is None:
        return []
    data = _key_bytes(key) + b"\0"
    best = max(servers, key=lambda address: (
        hashlib.blake2b(data + address.encode(), digest_size=8).digest(), address))
    return [best]


def by_key_modulo(routes: RouteTable, topic: str, key: bytes | str | None = None) -> list[str]:
    """CRC-32 of the key modulo the number of the topic's servers (sorted by address).

    Kept for whoever depends on its placement: when one of N servers leaves
    or joins, most keys move (about (N-1)/N of them); :func:`by_key_hash`
    moves only the keys that must.
    """
    servers = sorted(routes.writable_of(topic))
    if not servers or key is None:
        return []
    return [servers[zlib.crc32(_key_bytes(key)) % len(servers)]]
