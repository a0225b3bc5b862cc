"""The MQ server's requests, parsed once at the edge into frozen dataclasses.

:func:`parse` checks every field of a decoded request (its type, its range, names by
the rule of :mod:`._names`) before any handler runs, so a refused request changes
nothing; a bad field is :class:`MqError` 400 naming it.  Handlers get typed values
only.  Sans-I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pump import RdvpumpError

from ._filter import FilterError, TagFilter
from ._names import check_name
from ._topic import DEFAULT_WINDOW, Start

#: Largest window a consumer may ask for.
MAX_WINDOW = 10_000
#: Most consecutive offsets one ack may name by its first and count.
MAX_ACK_RANGE = 1 << 20
#: Offsets, sequences and seqs are unsigned 63-bit integers (they are stored as u64).
MAX_INT = (1 << 63) - 1
#: Bytes of a producer id or a tag (one byte holds each one's length on disk).
MAX_LABEL_BYTES = 255
#: Topic flags by their names.
FLAG_NAMES = ("memory", "rpc", "exclusive", "delete-on-exit")


class MqError(RdvpumpError):
    """A request that gets an error reply: ``status`` and the reason."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


Body = bytes | memoryview


@dataclass(frozen=True, slots=True)
class Declare:
    topic: str
    flags: frozenset[str] = frozenset()
    group: str | None = None
    filter: str | None = None
    start: Start | None = None


@dataclass(frozen=True, slots=True)
class Produce:
    topic: str
    body: Body
    producer: str | None = None
    sequence: int = 0
    tag: str | None = None
    #: the bodies' sizes when the body holds several messages back to back
    sizes: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class Consume:
    topic: str
    group: str | None = None
    window: int = DEFAULT_WINDOW


@dataclass(frozen=True, slots=True)
class Unconsume:
    topic: str
    group: str | None = None


@dataclass(frozen=True, slots=True)
class Ack:
    topic: str
    offsets: Sequence[int]
    group: str | None = None


@dataclass(frozen=True, slots=True)
class Query:
    topic: str | None = None


@dataclass(frozen=True, slots=True)
class Remove:
    topic: str
    group: str | None = None


@dataclass(frozen=True, slots=True)
class Empty:
    topic: str


@dataclass(frozen=True, slots=True)
class Route:
    recver: str
    id: int
    body: Body
    status: int = 200


@dataclass(frozen=True, slots=True)
class Receive:
    name: str


@dataclass(frozen=True, slots=True)
class Push:
    to: str
    body: Body


Request = (Declare | Produce | Consume | Unconsume | Ack | Query | Remove | Empty | Route
           | Receive | Push)


# -- field checks: each returns the value or raises MqError 400 naming the field ---------

def _bad(cmd: str, key: str, why: str) -> MqError:
    return MqError(400, f"{cmd}: {key} {why}")


def _name(obj: dict[str, Any], cmd: str, key: str, *, required: bool = True) -> str | None:
    value = obj.get(key)
    if value is None and not required:
        return None
    if value is None:
        raise _bad(cmd, key, "is missing")
    try:
        return check_name(value, key)
    except ValueError as exc:
        raise MqError(400, f"{cmd}: {exc}") from None


def _int(obj: dict[str, Any], cmd: str, key: str, default: int | None, low: int, high: int
         ) -> int:
    value = obj.get(key, default)
    if value is None:
        raise _bad(cmd, key, "is missing")
    if type(value) is not int or not low <= value <= high:
        raise _bad(cmd, key, f"must be an integer within {low}..{high}, got {_show(value)}")
    return value


def _label(obj: dict[str, Any], cmd: str, key: str) -> str | None:
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise _bad(cmd, key, f"must be a string, got {type(value).__name__}")
    try:
        size = len(value.encode())
    except UnicodeEncodeError:
        raise _bad(cmd, key, "is not valid Unicode") from None
    if size > MAX_LABEL_BYTES:
        raise _bad(cmd, key, f"is {size} bytes; at most {MAX_LABEL_BYTES}")
    return value


def _body(obj: dict[str, Any]) -> Body:
    body = obj.get("body", b"")
    if not isinstance(body, bytes | memoryview):
        raise MqError(400, "the body must follow the JSON head behind a NUL byte")
    return body


def _ints(values: list[Any]) -> bool:
    """Every value is an int (not a bool); one pass in C, not a loop of Python checks."""
    return set(map(type, values)) <= {int}


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


# -- the commands --------------------------------------------------------------------------

def _declare(obj: dict[str, Any]) -> Declare:
    topic = _name(obj, "declare", "topic")
    flags = obj.get("flags", [])
    if flags is None:
        flags = []
    if not isinstance(flags, list) or not all(isinstance(f, str) for f in flags) or not set(
            flags) <= set(FLAG_NAMES):
        raise _bad("declare", "flags", f"must be a list of {', '.join(FLAG_NAMES)}; got "
                                       f"{_show(flags)}")
    group = _name(obj, "declare", "group", required=False)
    filter = obj.get("filter")
    if filter is not None:
        if not isinstance(filter, str):
            raise _bad("declare", "filter", "must be a string")
        try:
            TagFilter.parse(filter)
        except FilterError as exc:
            raise MqError(400, f"declare: filter: {exc}") from None
    start = obj.get("start")
    if start is not None and not isinstance(start, str):
        raise _bad("declare", "start", "must be a string")
    try:
        parsed = None if start is None else Start.parse(start)
    except ValueError as exc:
        raise MqError(400, f"declare: {exc}") from None
    if parsed is not None and parsed.kind == "copy":
        _name({"start": parsed.value}, "declare", "start")  # the group copied is a name
    if parsed is not None and isinstance(parsed.value, int) and parsed.value > MAX_INT:
        raise _bad("declare", "start", f"is past {MAX_INT}")
    assert topic is not None
    return Declare(topic, frozenset(flags), group, filter, parsed)


def _produce(obj: dict[str, Any]) -> Produce:
    topic = _name(obj, "produce", "topic")
    body = _body(obj)
    sizes = obj.get("sizes")
    count = 1
    if sizes is not None:
        if (not isinstance(sizes, list) or not sizes or not _ints(sizes) or min(sizes) < 0
                or sum(sizes) != len(body)):
            raise _bad("produce", "sizes", f"must be non-negative integers adding up to the "
                                           f"body's {len(body)} bytes")
        count = len(sizes)
    sequence = _int(obj, "produce", "sequence", 0, 0, MAX_INT - count)
    assert topic is not None
    return Produce(topic, body, _label(obj, "produce", "producer"), sequence,
                   _label(obj, "produce", "tag"), None if sizes is None else tuple(sizes))


def _consume(obj: dict[str, Any]) -> Consume:
    topic = _name(obj, "consume", "topic")
    assert topic is not None
    return Consume(topic, _name(obj, "consume", "group", required=False),
                   _int(obj, "consume", "window", DEFAULT_WINDOW, 1, MAX_WINDOW))


def _unconsume(obj: dict[str, Any]) -> Unconsume:
    topic = _name(obj, "unconsume", "topic")
    assert topic is not None
    return Unconsume(topic, _name(obj, "unconsume", "group", required=False))


def _ack(obj: dict[str, Any]) -> Ack:
    topic = _name(obj, "ack", "topic")
    group = _name(obj, "ack", "group", required=False)
    offsets, count = obj.get("offsets"), obj.get("count")
    acked: Sequence[int]
    if "count" in obj and type(offsets) is int and type(count) is int and (
            0 <= offsets <= MAX_INT and 1 <= count <= MAX_ACK_RANGE):
        acked = range(offsets, offsets + count)
    elif "count" not in obj and isinstance(offsets, list) and _ints(offsets) and (
            not offsets or (min(offsets) >= 0 and max(offsets) <= MAX_INT)):
        acked = offsets
    else:
        raise _bad("ack", "offsets", f"must be a list of integers, or the first of count "
                                     f"consecutive ones (count within 1..{MAX_ACK_RANGE})")
    assert topic is not None
    return Ack(topic, acked, group)


def _query(obj: dict[str, Any]) -> Query:
    return Query(_name(obj, "query", "topic", required=False))


def _remove(obj: dict[str, Any]) -> Remove:
    topic = _name(obj, "remove", "topic")
    assert topic is not None
    return Remove(topic, _name(obj, "remove", "group", required=False))


def _empty(obj: dict[str, Any]) -> Empty:
    topic = _name(obj, "empty", "topic")
    assert topic is not None
    return Empty(topic)


def _route(obj: dict[str, Any]) -> Route:
    recver = _label(obj, "route", "recver")
    if recver is None:
        raise _bad("route", "recver", "is missing")
    return Route(recver, _int(obj, "route", "id", None, 0, MAX_INT), _body(obj),
                 _int(obj, "route", "status", 200, 100, 999))


def _receive(obj: dict[str, Any]) -> Receive:
    name = _name(obj, "receive", "name")
    assert name is not None
    return Receive(name)


def _push(obj: dict[str, Any]) -> Push:
    to = _name(obj, "push", "to")
    assert to is not None
    return Push(to, _body(obj))


PARSERS: dict[str, Callable[[dict[str, Any]], Request]] = {
    "declare": _declare, "produce": _produce, "consume": _consume, "unconsume": _unconsume,
    "ack": _ack, "query": _query, "remove": _remove, "empty": _empty, "route": _route,
    "receive": _receive, "push": _push,
}


def parse(obj: dict[str, Any]) -> Request:
    """The typed request of a decoded message; :class:`MqError` 400 naming the bad field."""
    cmd = obj.get("cmd")
    parser = PARSERS.get(cmd) if isinstance(cmd, str) else None
    if parser is None:
        raise MqError(400, f"unknown command {_show(cmd)}")
    return parser(obj)


def request_seq(obj: dict[str, Any]) -> int | None:
    """The ``seq`` a reply echoes: a non-negative integer, or None (no reply is matched)."""
    seq = obj.get("seq")
    return seq if type(seq) is int and 0 <= seq <= MAX_INT else None
