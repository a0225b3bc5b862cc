"""The one round robin of a consume group's deliveries (on a server, and on a cluster's
relaying server), against a model: the next consumer after the last one served, in
the list's order, that has the credits asked for."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given
from hypothesis import strategies as st

from mq.topics._turns import InTurn


@dataclass
class _Consumer:
    name: int
    credits: int


@dataclass
class _Group(InTurn[_Consumer]):
    consumers: list[_Consumer] = field(default_factory=list)
    turn: int = 0


@given(credits=st.lists(st.integers(0, 3), min_size=0, max_size=6),
       asks=st.lists(st.tuples(st.integers(1, 3), st.integers(0, 7)), max_size=30))
def test_each_pick_is_the_next_in_turn_with_the_credits_asked(
        credits: list[int], asks: list[tuple[int, int]]) -> None:
    group = _Group([_Consumer(i, c) for i, c in enumerate(credits)])
    last: int | None = None  # the model: the index served last
    for need, drop in asks:
        n = len(group.consumers)
        start = 0 if last is None or n == 0 else (last + 1) % n
        expected = next((group.consumers[(start + k) % n] for k in range(n)
                         if group.consumers[(start + k) % n].credits >= need), None)
        ready = group.ready()
        assert ready == [group.consumers[(start + k) % n] for k in range(n)
                         if group.consumers[(start + k) % n].credits > 0]
        picked = group.pick(need)
        assert picked is expected
        if picked is not None:
            picked.credits -= need
            last = group.consumers.index(picked)
        if drop < n and n > 1 and drop != last:  # a consumer leaves (not the last served)
            del group.consumers[drop]
            if last is not None and drop < last:
                last -= 1
            group.turn = 0 if last is None else (last + 1) % len(group.consumers)


def test_served_moves_the_turn_past_a_consumer() -> None:
    a, b, c = _Consumer(0, 1), _Consumer(1, 1), _Consumer(2, 1)
    group = _Group([a, b, c])
    group.served(c)
    picked = []
    while (one := group.pick()) is not None:
        one.credits -= 1
        picked.append(one)
    assert picked == [a, b, c]
