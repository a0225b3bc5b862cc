"""Ports on 127.0.0.1 for servers that must be told one before they listen (Redis, NATS,
a name service whose address its peers are given)."""

from __future__ import annotations

import pathlib
import random
import socket
from collections.abc import Collection

from .._errors import RunError

_RANDOM = random.Random()


def free_ports(count: int, avoid: Collection[int] = ()) -> list[int]:
    """``count`` different ports of 127.0.0.1, free now, none in ``avoid``, all below the
    kernel's range of ephemeral ports: a port found by binding port 0 comes from that
    range, and until its server binds it, any outgoing connection or bind to port 0 on
    the machine may be handed it (the processes of a test run start hundreds).  Each is
    held while the next is picked.  :class:`RunError` when there are not ``count``."""
    low = int(pathlib.Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    low = max(low, 12_000)  # a range that starts lower leaves no room below it: share it
    picked: list[int] = []
    held: list[socket.socket] = []
    try:
        for _ in range(1000 + count):  # bounded: among thousands, a free one comes at once
            if len(picked) == count:
                return picked
            port = _RANDOM.randrange(10_000, low)
            if port in avoid or port in picked:
                continue
            sock = socket.socket()
            held.append(sock)
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            picked.append(port)
    finally:
        for sock in held:
            sock.close()
    if len(picked) == count:
        return picked
    raise RunError(f"no {count} free ports in 10000..{low - 1} of 127.0.0.1")
