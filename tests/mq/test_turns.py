"""The one round robin of a consume group's deliveries (on a server, and on a cluster's
relaying server), against a model: the next consumer after the last one served, in
the list's order, that has the credits asked for (and, for a run of a batch, any)."""

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
        any_credits = next(((start + k) % n for k in range(n)
                            if group.consumers[(start + k) % n].credits > 0), -1)
        assert group.next_ready(start) == any_credits
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


def test_next_ready_goes_round_to_the_start_and_says_when_none_has_credits() -> None:
    a, b, c = _Consumer(0, 1), _Consumer(1, 0), _Consumer(2, 0)
    group = _Group([a, b, c])
    assert [group.next_ready(i) for i in range(4)] == [0, 0, 0, 0]  # 3: past the end
    a.credits = 0
    assert group.next_ready(1) == -1 and _Group([]).next_ready(0) == -1
