"""Columns of the ``messages`` frame: one value, or a few runs, stand for many (the list
made when a consumer reads it), and a bad column is refused with a reason, at once."""

from __future__ import annotations

from typing import Any

import pytest

from mq.topics._wire import lazy_column, pack_column, unpack_column


def expanded(column: Any, count: int, counting: bool) -> Any:
    """:func:`lazy_column`'s list, made now if it was left to be made."""
    got = lazy_column(column, count, counting=counting)
    return got if isinstance(got, list) else got()


@pytest.mark.parametrize(("values", "counting", "sent"), [
    ([7, 7, 7], False, 7),
    ([None, None], False, None),
    (["p", "q"], False, ["p", "q"]),
    ([5], True, 5),
    ([5, 6, 7], True, 5),
    ([5, 7, 8], True, [5, 7, 8]),
    ([3, 3], True, [3, 3]),  # equal is not consecutive for a counting column
    ([7, 6], True, [7, 6]),
    # a frame of two batches: their timestamps, sequences and offsets as two runs
    ([10] * 100 + [11] * 100, False, {"runs": [10, 100, 11, 100]}),
    ([*range(1, 101), *range(501, 601)], True, {"runs": [1, 100, 501, 100]}),
    ([None] * 8 + ["t"] * 8, False, {"runs": [None, 8, "t", 8]}),
    # runs only where they are few: at most one for every RUN_SPAN values
    ([1, 1, 2, 2], False, [1, 1, 2, 2]),
    ([*[1] * 7, 2, 3], False, [*[1] * 7, 2, 3]),
    ([*[1] * 8, *[2] * 8, 3], False, [*[1] * 8, *[2] * 8, 3]),  # 3 runs of 17
    ([*[1] * 8, *[2] * 8, *[3] * 8], False, {"runs": [1, 8, 2, 8, 3, 8]}),  # 3 of 24
    ([*[4] * 9, *[5] * 8], True, [*[4] * 9, *[5] * 8]),  # runs of equal values do not count
])
def test_columns_round_trip(values: list[Any], counting: bool, sent: Any) -> None:
    assert pack_column(values, counting=counting) == sent
    assert unpack_column(sent, len(values), counting=counting) == values
    assert expanded(sent, len(values), counting) == values


@pytest.mark.parametrize(("column", "count", "counting", "error"), [
    ([1, 2], 3, False, "a column of 2 values for 3 messages"),
    ("5", 2, True, "a counting column starts at an integer"),
    (True, 2, True, "a counting column starts at an integer"),
    ({"runs": [1, 2, 3, 2]}, 5, False, "a column of 4 values for 5 messages"),
    ({"runs": [1, 2, 3]}, 2, False, "a column of runs is not"),
    ({"runs": [1, 2], "more": 1}, 2, False, "a column of runs is not"),
    ({"runs": "1,2"}, 2, False, "a column of runs is not"),
    ({"runs": [1, 0, 3, 2]}, 2, False, "a run of no or a bad count"),
    ({"runs": [1, True]}, 1, False, "a run of no or a bad count"),
    ({"runs": ["1", 2]}, 2, True, "a counting column's run starts at an integer"),
])
def test_bad_columns_are_refused(column: Any, count: int, counting: bool, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        unpack_column(column, count, counting=counting)
    with pytest.raises(ValueError, match=error):  # at once, not when the list is read
        lazy_column(column, count, counting=counting)


def test_one_value_stands_for_a_list_made_when_read() -> None:
    made = lazy_column("p", 1000)
    assert callable(made) and made() == ["p"] * 1000
    assert lazy_column(["p", "q"], 2) == ["p", "q"]  # a list sent is the list


def test_runs_stand_for_a_list_made_when_read() -> None:
    made = lazy_column({"runs": [5, 3, 9, 2]}, 5)
    assert callable(made) and made() == [5, 5, 5, 9, 9]
    made = lazy_column({"runs": [5, 3, 9, 2]}, 5, counting=True)
    assert callable(made) and made() == [5, 6, 7, 9, 10]
