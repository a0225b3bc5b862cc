"""Columns of the ``messages`` frame: a list of values, one per message, or one value for
all of them.

A column whose values are all equal goes as that one value; a *counting* column
(offsets, sequences) whose values are consecutive goes as the first of them.
Both sides of a batch of messages from one producer, delivered once, send their
columns as single values, so the header of a frame of a thousand messages is a
few dozen bytes of JSON instead of tens of kilobytes.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any


def pack_column(values: list[Any], *, counting: bool = False) -> Any:
    """``values`` as sent: the list, or one value (see the module)."""
    first = values[0]
    if counting:
        if values == list(range(first, first + len(values))):
            return first
    elif values.count(first) == len(values):
        return first
    return values


def unpack_column(column: Any, count: int, *, counting: bool = False) -> list[Any]:
    """The ``count`` values a column stands for; ValueError if it is not a column of
    ``count`` values."""
    if isinstance(column, list):
        if len(column) != count:
            raise ValueError(f"a column of {len(column)} values for {count} messages")
        return column
    if counting:
        if type(column) is not int:
            raise ValueError(f"a counting column starts at an integer, not {column!r}")
        return list(range(column, column + count))
    return [column] * count


def lazy_column(column: Any, count: int, *, counting: bool = False
                ) -> list[Any] | Callable[[], list[Any]]:
    """:func:`unpack_column`'s checks now (ValueError), and its list: the list sent, or,
    for one value, a call that makes the list when it is first asked for (a consumer
    that reads only some columns makes no list of the others)."""
    if isinstance(column, list) or (counting and type(column) is not int):
        return unpack_column(column, count, counting=counting)
    return partial(unpack_column, column, count, counting=counting)


def unpack_offsets(column: Any, count: int) -> range | list[int]:
    """:func:`unpack_column` of a counting column, a ``range`` when it is one value (the
    first of ``count`` consecutive ones): no list made of them."""
    if type(column) is int:
        return range(column, column + count)
    return unpack_column(column, count, counting=True)
