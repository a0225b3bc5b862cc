"""The ports a benchmark (and a test) names to the servers it starts."""

from __future__ import annotations

import pathlib

import pytest

from rdvpump._errors import RunError
from rdvpump.bench._ports import free_ports


def test_ports_picked_together_are_all_different_and_none_bind_0_hands_out() -> None:
    """A NATS cluster of three is told six ports at once: two the same would stop it.
    Each port is held while the next is picked, so none comes twice, and all are below
    the ephemeral range, where a bind to port 0 or a connection elsewhere cannot take
    one before its server binds it."""
    ephemeral = pathlib.Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    ports = free_ports(200, avoid=range(10_000, 10_100))
    assert len(set(ports)) == 200
    assert all(10_100 <= p < max(int(ephemeral[0]), 12_000) for p in ports)


def test_no_port_left_is_one_error_saying_so() -> None:
    with pytest.raises(RunError, match="no 2 free ports in 10000"):
        free_ports(2, avoid=range(10_000, 65_536))
