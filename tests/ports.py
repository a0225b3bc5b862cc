"""Ports for tests that name a port before anything listens on it (a manager started on
it later, a README block's printed port, an address nobody listens on)."""

from __future__ import annotations

import pathlib
import random
import socket
from collections.abc import Collection

_RANDOM = random.Random()


def free_port(avoid: Collection[int] = ()) -> int:
    """A port of 127.0.0.1 that is free now and below the kernel's range of ephemeral
    ports, so that nothing on the machine is handed it meanwhile by a bind to port 0 or
    an outgoing connection (a port found by binding 0 and closing comes from that range:
    a broker listening on port 0 was once given one that a later block of the README was
    to listen on).  Not in ``avoid``."""
    low = int(pathlib.Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    low = max(low, 12_000)  # a range that starts lower leaves no room below it: share it
    for _ in range(1000):  # bounded: among thousands of ports a free one comes at once
        port = _RANDOM.randrange(10_000, low)
        if port in avoid:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise AssertionError(f"no free port in 10000..{low - 1}")
