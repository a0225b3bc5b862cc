"""Ports for tests that name a port before anything listens on it (a manager started on
it later, a README block's printed port, an address nobody listens on)."""

from __future__ import annotations

from collections.abc import Collection

from rdvpump.bench._ports import free_ports


def free_port(avoid: Collection[int] = ()) -> int:
    """A port of 127.0.0.1 free now, below the kernel's range of ephemeral ports (a
    broker listening on port 0 was once given one that a later block of the README was
    to listen on), not in ``avoid``: :func:`~rdvpump.bench._ports.free_ports`."""
    (port,) = free_ports(1, avoid)
    return port
