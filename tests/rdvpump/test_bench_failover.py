"""What `rdvpump bench failover` counts as a failover's redeliveries."""

from __future__ import annotations

from rdvpump.bench.failover import per_kill


def test_the_last_kills_redeliveries_end_where_the_hung_masters_trial_begins() -> None:
    """The trials end with a master SIGSTOPped, which the consumer also lives through:
    what it gets again then is not the last SIGKILL's (that trial moved a consumer
    after 0.6 s of silence, about a hundred messages, and read as the kills' worst)."""
    again = [(1.5, 1.4), (2.2, 2.1), (2.9, 2.0), (3.5, 3.4), (3.6, 3.3), (9.0, 8.5)]
    got = per_kill(again, [1.0, 2.0, 3.0], end=8.0)
    assert got == [[(1.5, 1.4)], [(2.2, 2.1), (2.9, 2.0)], [(3.5, 3.4), (3.6, 3.3)]]
    assert per_kill(again, [], end=8.0) == []
