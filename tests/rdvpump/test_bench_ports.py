"""The ports a benchmark names to the servers it starts (Redis, NATS)."""

from __future__ import annotations

from rdvpump.bench._ports import free_ports


def test_ports_picked_together_are_all_different() -> None:
    """A NATS cluster of three is told six ports at once: two the same would stop it.
    Each port is held while the next is picked, so the kernel cannot hand one out twice
    (a port just released may come back at once)."""
    ports = free_ports(200)
    assert len(set(ports)) == 200
    assert all(0 < p < 65536 for p in ports)
