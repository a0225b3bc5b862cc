"""Tag filters of consume groups, zbus's grammar, sans-I/O.

A tag is segments separated by ``.`` (``eu.orders.paid``).  A filter is one
or more alternatives separated by ``;``; each alternative is segments where
``*`` matches exactly one segment and ``#`` matches the rest of the tag (zero
or more segments).  A message matches a filter if it matches any
alternative.  An untagged message matches only a group without a filter; a
group without a filter gets every message.  A filter is at most 127 bytes
(UTF-8), as in zbus.

zbus stops matching as soon as it reaches ``#``, so its ``a.#.c`` quietly
means ``a.#``; here ``#`` must be the last segment of its alternative, and
such a filter is refused with that reason instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from pump import RdvpumpError

#: Longest filter in bytes (zbus's 1-byte length + 127).
MAX_FILTER_BYTES = 127


class FilterError(RdvpumpError, ValueError):
    """A filter that does not follow the grammar."""


@dataclass(frozen=True)
class TagFilter:
    """A parsed filter: alternatives of segment patterns."""

    text: str
    alternatives: tuple[tuple[str, ...], ...]

    @classmethod
    def parse(cls, text: str | None) -> TagFilter | None:
        """The filter ``text``; None for no filter (None or empty)."""
        if text is None or text == "":
            return None
        if not isinstance(text, str):
            raise FilterError(f"a filter must be a string, got {type(text).__name__}")
        size = len(text.encode())
        if size > MAX_FILTER_BYTES:
            raise FilterError(f"a filter is at most {MAX_FILTER_BYTES} bytes, got {size}")
        alternatives = []
        for alternative in text.split(";"):
            segments = tuple(alternative.split("."))
            if any(s == "" for s in segments):
                raise FilterError(f"filter {text!r}: empty segment in {alternative!r}")
            if "#" in segments[:-1]:
                raise FilterError(f"filter {text!r}: '#' matches the rest of the tag, so it "
                                  f"must be the last segment (in {alternative!r})")
            alternatives.append(segments)
        return cls(text, tuple(alternatives))

    def matches(self, tag: str | None) -> bool:
        """Whether a message tagged ``tag`` (None: untagged) passes."""
        if tag is None or tag == "":
            return False
        parts = tag.split(".")
        return any(_match(pattern, parts) for pattern in self.alternatives)


def _match(pattern: tuple[str, ...], parts: list[str]) -> bool:
    for i, segment in enumerate(pattern):
        if segment == "#":
            return True  # the rest, zero or more segments
        if i >= len(parts) or (segment != "*" and segment != parts[i]):
            return False
    return len(parts) == len(pattern)


def matches(filter: TagFilter | None, tag: str | None) -> bool:
    """A group with ``filter`` (None: none) gets a message tagged ``tag``."""
    return True if filter is None else filter.matches(tag)
