"""Master epochs and the rule that finds where a replica's copy parts from its master's
(mq.storage._epochs), on logs modelled as the epoch of each record."""

from __future__ import annotations

import pathlib
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mq.storage._epochs import EPOCHS, Epochs, diverged, kept
from mq.storage._record import FormatError


def of(epochs: list[int]) -> Epochs:
    """The epochs list of a log whose record ``i`` was written under ``epochs[i]``."""
    history = Epochs()
    for offset, epoch in enumerate(epochs):
        history.begin(epoch, offset)
    return history


def test_each_record_s_epoch_and_where_each_epoch_ends() -> None:
    history = of([1, 1, 1, 3, 3, 6])
    assert history.entries == [(1, 0), (3, 3), (6, 5)]
    assert [history.epoch_at(o) for o in range(6)] == [1, 1, 1, 3, 3, 6]
    assert history.end_of(1, 6) == (1, 3)
    assert history.end_of(2, 6) == (1, 3)  # never had 2: where 1 ends
    assert history.end_of(5, 6) == (3, 5)
    assert history.end_of(9, 6) == (6, 6)  # the newest: the log's end
    assert history.end_of(0, 6) == (None, 0)
    assert not history.begin(6, 9) and not history.begin(4, 9)
    assert history.begin(7, 9) and history.begin(8, 9)  # 7 wrote nothing: 8 replaces it
    assert history.entries == [(1, 0), (3, 3), (6, 5), (8, 9)]
    history.cut(5)
    assert history.entries == [(1, 0), (3, 3)]
    assert Epochs().entries == [(0, 0)]


@pytest.mark.parametrize("value, why", [
    ([], "a non-empty list"), ({"a": 1}, "a non-empty list"), ([[1]], "is not [epoch, offset]"),
    ([[1, -1]], "is not [epoch, offset]"), ([[True, 0]], "is not [epoch, offset]"),
    ([[2, 0], [2, 5]], "must increase"), ([[2, 5], [3, 4]], "must increase")])
def test_a_bad_epochs_list_is_named(value: object, why: str) -> None:
    with pytest.raises(ValueError, match=re.escape(why)):
        Epochs.parse(value, "here")


def test_the_file_round_trips_and_a_damaged_one_is_named(tmp_path: pathlib.Path) -> None:
    assert Epochs.read(tmp_path).entries == [(0, 0)]
    (tmp_path / EPOCHS).write_bytes(of([2, 2, 5]).encode())
    assert Epochs.read(tmp_path).entries == [(2, 0), (5, 2)]
    for damaged, why in ((b"{", "not JSON"), (b'{"version": 9}', "version 1"),
                         (b'{"version": 1, "epochs": [[3, 0], [1, 1]]}', "must increase")):
        (tmp_path / EPOCHS).write_bytes(damaged)
        with pytest.raises(FormatError, match=why) as caught:
            Epochs.read(tmp_path)
        assert str(tmp_path / EPOCHS) in str(caught.value)


def settle(master: list[int], current: int, replica: list[int]) -> int | str:
    """Run the rule as master and replica do, until the master agrees: the offset the
    replica follows from, or the master's refusal."""
    mine = list(replica)
    for _ in range(len(replica) + 2):
        if not mine:
            return 0
        try:
            answer = diverged(of(master), len(master), current, mine[-1], len(mine))
        except ValueError as exc:
            return str(exc)
        if answer is None:
            return len(mine)
        keep = kept(of(mine), len(mine), *answer)
        assert keep < len(mine), "a diverged answer must cut"
        mine = mine[:keep]
    raise AssertionError("the rule did not settle")


@st.composite
def parted(draw: st.DrawFn) -> tuple[list[int], list[int], int]:
    """A master's log and a replica's that share a prefix (the records written under one
    epoch are one master's: both logs have the same ones at the same offsets, up to where
    one of them stops having them), then part: each goes on under epochs of its own that
    the other never had."""
    steps = draw(st.lists(st.integers(0, 4), max_size=5))
    common: list[int] = []
    epoch = draw(st.integers(0, 2))
    for count in steps:
        common += [epoch] * count
        epoch += draw(st.integers(1, 2))
    # epochs after the prefix: each belongs to one side only, all newer than the prefix's
    later = draw(st.lists(st.integers(epoch, epoch + 12), unique=True, max_size=6))
    sides = draw(st.lists(st.booleans(), min_size=len(later), max_size=len(later)))
    logs: dict[bool, list[int]] = {True: [], False: []}
    side: bool
    for e, side in sorted(zip(later, sides, strict=True)):
        logs[side] += [e] * draw(st.integers(1, 3))
    # the prefix's last epoch may go on, on one side only (the other stopped copying it)
    if len(common) > 0 and draw(st.booleans()):
        one = draw(st.booleans())
        logs[one] = [common[-1]] * draw(st.integers(1, 3)) + logs[one]
    master, replica = common + logs[True], common + logs[False]
    current = max([*master, draw(st.integers(0, 20))])
    return master, replica, current


@given(parted())
def test_the_replica_keeps_exactly_the_records_it_shares_with_its_master(
        logs: tuple[list[int], list[int], int]) -> None:
    """What the replica keeps is the longest prefix on which both logs have the same
    epoch at each offset (one epoch's records are one master's), unless it holds records
    that must not be cut: of an epoch newer than the master's, or more records of the
    master's own newest epoch than the master has."""
    master, replica, current = logs
    shared = 0
    while shared < min(len(master), len(replica)) and master[shared] == replica[shared]:
        shared += 1
    newest = max(current, of(master).last)
    settled = settle(master, current, replica)
    if replica and replica[-1] > newest:
        assert isinstance(settled, str) and "newer than this master's" in settled
    elif replica and replica[-1] == of(master).last and len(replica) > len(master) \
            and shared == len(master):
        assert isinstance(settled, str) and "it holds records this one does not" in settled
    else:
        assert settled == shared, (master, replica, settled)


def test_a_former_master_s_tail_is_cut_back_to_its_successor_s_epoch() -> None:
    """The failover of the module's example: the old master wrote 0-5 under epoch 1, its
    successor had copied 0-3 and wrote 4-6 under epoch 2; a third member, master at
    epoch 3 from 7 on, had copied all of epoch 2."""
    assert settle([1, 1, 1, 1, 2, 2, 2], 2, [1, 1, 1, 1, 1, 1]) == 4
    assert settle([1, 1, 1, 1, 2, 2, 2, 3], 3, [1, 1, 1, 1, 2, 2, 2, 2]) == 7
    assert settle([1, 1, 1, 1, 2, 2, 2, 3], 3, [1, 1, 1, 1, 1, 1]) == 4
    assert settle([1, 1, 1], 2, [1, 1]) == 2  # behind, nothing to cut
    assert "newer than this master's 2" in str(settle([1, 1, 2], 2, [1, 1, 3]))
