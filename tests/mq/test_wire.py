"""Columns of the ``messages`` frame: one value stands for many (its list made when a
consumer reads it), and a bad column is refused with a reason, at once."""

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
])
def test_columns_round_trip(values: list[Any], counting: bool, sent: Any) -> None:
    assert pack_column(values, counting=counting) == sent
    assert unpack_column(sent, len(values), counting=counting) == values
    assert expanded(sent, len(values), counting) == values


@pytest.mark.parametrize(("column", "count", "counting", "error"), [
    ([1, 2], 3, False, "a column of 2 values for 3 messages"),
    ("5", 2, True, "a counting column starts at an integer"),
    (True, 2, True, "a counting column starts at an integer"),
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
