"""Ports on 127.0.0.1 for the servers a benchmark starts that must be told one (Redis,
NATS, a name service listening where its peers are told to look)."""

from __future__ import annotations

import contextlib
import socket


def free_ports(count: int) -> list[int]:
    """``count`` different ports on 127.0.0.1 that were free a moment ago: each is held
    until all are picked, so no two are the same (the kernel may hand out a port just
    released again)."""
    with contextlib.ExitStack() as held:
        ports = []
        for _ in range(count):
            s = held.enter_context(socket.socket())
            s.bind(("127.0.0.1", 0))
            ports.append(int(s.getsockname()[1]))
        return ports
