"""zbus's tag-filter grammar, table-driven."""

from __future__ import annotations

import pytest

from mq import FilterError, TagFilter, matches

# filter, tag, matches?
TABLE = [
    # plain segments: equal, and equal in number
    ("eu.orders", "eu.orders", True),
    ("eu.orders", "eu.orders.paid", False),
    ("eu.orders", "eu", False),
    ("eu.orders", "us.orders", False),
    # '*': exactly one segment
    ("eu.*", "eu.orders", True),
    ("eu.*", "eu", False),
    ("eu.*", "eu.orders.paid", False),
    ("*.orders", "us.orders", True),
    ("*", "anything", True),
    ("*", "two.parts", False),
    ("*.*", "two.parts", True),
    # '#': the rest, zero or more segments
    ("eu.#", "eu", True),
    ("eu.#", "eu.orders", True),
    ("eu.#", "eu.orders.paid.late", True),
    ("eu.#", "us.orders", False),
    ("#", "anything.at.all", True),
    ("*.#", "eu", True),
    ("eu.*.#", "eu", False),
    ("eu.*.#", "eu.orders", True),
    # ';': alternatives
    ("eu.*;us.orders", "us.orders", True),
    ("eu.*;us.orders", "eu.refunds", True),
    ("eu.*;us.orders", "us.refunds", False),
    ("a;b;c", "c", True),
    # untagged messages match no filter
    ("eu.#", None, False),
    ("#", None, False),
    ("#", "", False),
    # case and characters are compared as they are
    ("EU.orders", "eu.orders", False),
    ("eu-1.orders", "eu-1.orders", True),
]


@pytest.mark.parametrize("text, tag, expected", TABLE)
def test_the_grammar(text: str, tag: str | None, expected: bool) -> None:
    assert matches(TagFilter.parse(text), tag) is expected


@pytest.mark.parametrize("tag", [None, "", "eu.orders", "x"])
def test_a_group_without_a_filter_gets_every_message(tag: str | None) -> None:
    assert TagFilter.parse(None) is None and TagFilter.parse("") is None
    assert matches(None, tag)


@pytest.mark.parametrize("text, error", [
    ("x" * 128, "at most 127 bytes, got 128"),
    ("é" * 64, "at most 127 bytes, got 128"),
    ("eu..orders", "empty segment"),
    ("eu.orders;", "empty segment"),
    ("a.#.c", "must be the last segment"),
    ("#.orders", "must be the last segment"),
])
def test_bad_filters_are_refused_with_the_reason(text: str, error: str) -> None:
    with pytest.raises(FilterError, match=error):
        TagFilter.parse(text)


def test_the_longest_filter_is_127_bytes() -> None:
    assert TagFilter.parse("x" * 127) is not None
