"""Columns of the ``messages`` frame: a list of values, one per message, or one value for
all of them.

A column whose values are all equal goes as that one value; a *counting* column
(offsets, sequences) whose values are consecutive goes as the first of them.
Both sides of a batch of messages from one producer, delivered once, send their
columns as single values, so the header of a frame of a thousand messages is a
few dozen bytes of JSON instead of tens of kilobytes.  A column of a few such
stretches (a frame of two batches, each stamped with its own time) goes as its
runs, ``{"runs": [value, count, value, count, ...]}`` (for a counting column each
value the first of ``count`` consecutive ones), when there are at most one for every
:data:`RUN_SPAN` values: a frame of 200 messages from two batches sends two
timestamps, not 200, and a consumer that never reads them makes no list of them.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from itertools import groupby, repeat
from operator import sub
from typing import Any

#: A column goes as runs only when it has at most one run for every this many values.
RUN_SPAN = 8


def pack_column(values: list[Any], *, counting: bool = False) -> Any:
    """``values`` as sent: one value, the runs, or the list (see the module)."""
    first = values[0]
    if counting:
        if values == list(range(first, first + len(values))):
            return first
    elif values.count(first) == len(values):
        return first
    runs = _runs(values, counting)
    return values if runs is None else {"runs": runs}


def _runs(values: list[Any], counting: bool) -> list[Any] | None:
    """``values`` as runs (value, count, ...), or None past one run per :data:`RUN_SPAN`."""
    most = len(values) // RUN_SPAN
    # a counting column's consecutive values are alike in value less position
    keys = map(sub, values, range(len(values))) if counting else values
    runs: list[Any] = []
    at = 0
    for _, run in groupby(keys):
        if len(runs) >= 2 * most:
            return None
        n = len(list(run))
        runs += (values[at], n)
        at += n
    return runs


def _checked_runs(column: dict[str, Any], count: int, counting: bool) -> list[Any]:
    """The runs of a column sent as runs; ValueError unless they are runs of ``count``
    values in all."""
    runs = column.get("runs") if len(column) == 1 else None
    if type(runs) is not list or len(runs) % 2:
        raise ValueError(f"a column of runs is not {{\"runs\": [value, count, ...]}}: "
                         f"{column!r:.80}")
    lengths = runs[1::2]
    if any(type(n) is not int or n < 1 for n in lengths):
        raise ValueError(f"a run of no or a bad count of values: {column!r:.80}")
    if counting and any(type(v) is not int for v in runs[::2]):
        raise ValueError(f"a counting column's run starts at an integer: {column!r:.80}")
    if sum(lengths) != count:
        raise ValueError(f"a column of {sum(lengths)} values for {count} messages")
    return runs


def _expanded(runs: list[Any], counting: bool) -> list[Any]:
    values: list[Any] = []
    for value, n in zip(runs[::2], runs[1::2], strict=True):
        values += range(value, value + n) if counting else repeat(value, n)
    return values


def unpack_column(column: Any, count: int, *, counting: bool = False) -> list[Any]:
    """The ``count`` values a column stands for; ValueError if it is not a column of
    ``count`` values."""
    if isinstance(column, list):
        if len(column) != count:
            raise ValueError(f"a column of {len(column)} values for {count} messages")
        return column
    if isinstance(column, dict):
        return _expanded(_checked_runs(column, count, counting), counting)
    if counting:
        if type(column) is not int:
            raise ValueError(f"a counting column starts at an integer, not {column!r}")
        return list(range(column, column + count))
    return [column] * count


def check_column(column: Any, count: int, *, counting: bool = False) -> None:
    """:func:`unpack_column`'s checks, without making the list."""
    if isinstance(column, dict):
        _checked_runs(column, count, counting)
    elif isinstance(column, list) or (counting and type(column) is not int):
        unpack_column(column, count, counting=counting)


def lazy_column(column: Any, count: int, *, counting: bool = False
                ) -> list[Any] | Callable[[], list[Any]]:
    """:func:`unpack_column`'s checks now (ValueError), and its list: the list sent, or,
    for one value or runs, a call that makes the list when it is first asked for (a
    consumer that reads only some columns makes no list of the others)."""
    if isinstance(column, list):
        return unpack_column(column, count, counting=counting)
    check_column(column, count, counting=counting)
    return partial(unpack_column, column, count, counting=counting)


def check_sizes(body: bytes | memoryview, sizes: list[Any]) -> None:
    """ValueError unless ``sizes`` are non-negative integers adding up to the length of
    ``body`` (a ``messages`` frame's bodies, back to back)."""
    # every value's type (one pass in C): values equal to an int may be a float or a bool
    if set(map(type, sizes)) != {int} or min(sizes) < 0:
        raise ValueError(f"sizes must be non-negative integers, not {sizes[:8]!r}")
    if sum(sizes) != len(body):
        raise ValueError("sizes that do not add up to the body")


def unpack_sizes(column: Any, count: int, body: bytes | memoryview) -> list[int]:
    """The ``count`` sizes of a ``messages`` frame's bodies (its ``sizes`` column),
    checked against ``body`` (:func:`check_sizes`): ValueError if they do not fit it.
    One size for all (bodies of one length, what most frames carry) is checked once,
    not value by value."""
    if type(column) is int:
        if column < 0:
            raise ValueError(f"sizes must be non-negative integers, not {column!r}")
        if column * count != len(body):
            raise ValueError("sizes that do not add up to the body")
        return [column] * count
    sizes = unpack_column(column, count)
    check_sizes(body, sizes)
    return sizes


def unpack_offsets(column: Any, count: int) -> range | list[int]:
    """:func:`unpack_column` of a counting column, a ``range`` when it is one value (the
    first of ``count`` consecutive ones): no list made of them."""
    if type(column) is int:
        return range(column, column + count)
    return unpack_column(column, count, counting=True)
