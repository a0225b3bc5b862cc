"""The MQ server's requests, parsed once at the edge into frozen dataclasses.

Each parser (:data:`PARSERS`, by command) checks every field of a decoded request
(its type, its range, names by the rule of :mod:`mq.storage._names`) through the service
protocol's :class:`~brokermgr.Fields` before any handler runs, so a refused request
changes nothing; a bad field is :class:`~brokermgr.ServiceError` 400 naming it.
Handlers get typed values only.  Sans-I/O.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from brokermgr import MAX_INT, Call, Fields, ServiceError, Status
from rdv import Right

from ..storage._names import check_name
from ..storage._record import StoreError
from ._filter import FilterError, TagFilter
from ._group import DEFAULT_WINDOW, Start, UnknownGroupError

#: Largest window a consumer may ask for.
MAX_WINDOW = 10_000
#: Most consecutive offsets one ack may name by its first and count.
MAX_ACK_RANGE = 1 << 20
#: Bytes of a producer id or a tag (one byte holds each one's length on disk).
MAX_LABEL_BYTES = 255
#: Bytes of records a master ships a replica ahead of its acknowledgements, by default,
#: and the bounds a replica may ask for.
DEFAULT_FOLLOW_WINDOW = 8 << 20
FOLLOW_WINDOWS = (64 << 10, 256 << 20)
#: Topic flags by their names.
FLAG_NAMES = ("memory", "rpc", "exclusive", "delete-on-exit")


Body = bytes | memoryview


@dataclass(frozen=True, slots=True)
class Declare:
    topic: str
    flags: frozenset[str] = frozenset()
    group: str | None = None
    filter: str | None = None
    start: Start | None = None
    #: A topic of the server's cluster (declared through its root, on every server).
    shared: bool = False


@dataclass(frozen=True, slots=True)
class Produce:
    topic: str
    body: Body
    producer: str | None = None
    sequence: int = 0
    tag: str | None = None
    #: the bodies' sizes when the body holds several messages back to back
    sizes: tuple[int, ...] | None = None
    #: who produced it, as a cluster's server that relays it names them (stored as its
    #: producer when ``producer`` is None; never checked for duplicates)
    origin: str | None = None
    #: returned to the producer, not stored, when no consumer of any of the topic's
    #: groups (that its filter lets take the message) is there to take it now
    immediate: bool = False


@dataclass(frozen=True, slots=True)
class Consume:
    topic: str
    group: str | None = None
    window: int = DEFAULT_WINDOW
    #: The link takes a ``messages`` frame that serves several groups of one topic at
    #: once (its ``groups``): a cluster's server relaying the topic's groups asks so.
    shared_frames: bool = False
    #: The link also takes a run it was sent before by name (a ``messages`` frame with
    #: ``cached``, :mod:`._stretch`): a cluster's relaying server asks so.
    cached: bool = False


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
    #: the topic set's generation the asker holds (a replica's beat): when it is still
    #: the server's, the answer lists no topics (``unchanged``)
    since: int | None = None


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


@dataclass(frozen=True, slots=True)
class Follow:
    """A replica asks for a topic's records from ``start`` on, ``window`` bytes of them
    at most unacknowledged."""

    topic: str
    start: int
    window: int = DEFAULT_FOLLOW_WINDOW
    #: the replica's broker id (how the master names its in-sync members)
    replica: str | None = None
    #: the master epoch its records were last written under
    epoch: int | None = None
    #: its group's configuration (:func:`group_config`), compared with the master's
    config: str | None = None


@dataclass(frozen=True, slots=True)
class Copied:
    """A replica stored a topic's records up to ``next`` (excluded)."""

    topic: str
    next: int


Request = (Declare | Produce | Consume | Unconsume | Ack | Query | Remove | Empty | Route
           | Receive | Push | Follow | Copied)


def _ints(values: list[Any]) -> bool:
    """Every value is an int (not a bool); one pass in C, not a loop of Python checks."""
    return set(map(type, values)) <= {int}


def _bad(fields: Fields, why: str) -> ServiceError:
    return ServiceError(Status.BAD_REQUEST, f"{fields.cmd}: {why}")


# -- the commands --------------------------------------------------------------------------

def _declare(f: Fields) -> Declare:
    topic = f.string("topic", check=check_name)
    flags = f.raw("flags", [])
    if flags is None:
        flags = []
    if not isinstance(flags, list) or not all(isinstance(x, str) for x in flags) or not set(
            flags) <= set(FLAG_NAMES):
        raise f.bad("flags", f"must be a list of {', '.join(FLAG_NAMES)}; got {repr(flags)[:40]}")
    group = f.optional_string("group", check=check_name)
    filter = f.optional_string("filter")
    if filter is not None:
        try:
            TagFilter.parse(filter)
        except FilterError as exc:
            raise _bad(f, f"filter: {exc}") from None
    start = f.optional_string("start")
    try:
        parsed = None if start is None else Start.parse(start)
    except ValueError as exc:
        raise _bad(f, str(exc)) from None
    if parsed is not None and parsed.kind == "copy":
        Fields({"start": parsed.value}, f.cmd).string("start", check=check_name)
    if parsed is not None and isinstance(parsed.value, int) and parsed.value > MAX_INT:
        raise f.bad("start", f"is past {MAX_INT}")
    shared = f.boolean("shared", False)
    if shared and (flags or parsed is not None):
        raise f.bad("shared", "a shared topic takes no flags and no start (its groups start "
                              "at its beginning)")
    return Declare(topic, frozenset(flags), group, filter, parsed, shared)


def _produce(f: Fields) -> Produce:
    topic = f.string("topic", check=check_name)
    body = f.body()
    sizes = f.raw("sizes")
    count = 1
    if sizes is not None:
        if (not isinstance(sizes, list) or not sizes or not _ints(sizes) or min(sizes) < 0
                or sum(sizes) != len(body)):
            raise f.bad("sizes", f"must be non-negative integers adding up to the body's "
                                 f"{len(body)} bytes")
        count = len(sizes)
    sequence = f.integer("sequence", 0, 0, MAX_INT - count)
    return Produce(topic, body, f.optional_string("producer", max_bytes=MAX_LABEL_BYTES),
                   sequence, f.optional_string("tag", max_bytes=MAX_LABEL_BYTES),
                   None if sizes is None else tuple(sizes),
                   f.optional_string("origin", max_bytes=MAX_LABEL_BYTES),
                   f.boolean("immediate", False))


def _consume(f: Fields) -> Consume:
    return Consume(f.string("topic", check=check_name),
                   f.optional_string("group", check=check_name),
                   f.integer("window", DEFAULT_WINDOW, 1, MAX_WINDOW),
                   f.boolean("shared_frames", False), f.boolean("cached", False))


def _unconsume(f: Fields) -> Unconsume:
    return Unconsume(f.string("topic", check=check_name),
                     f.optional_string("group", check=check_name))


def _ack(f: Fields) -> Ack:
    topic = f.string("topic", check=check_name)
    group = f.optional_string("group", check=check_name)
    offsets, count = f.raw("offsets"), f.raw("count")
    acked: Sequence[int]
    if "count" in f and type(offsets) is int and type(count) is int and (
            0 <= offsets <= MAX_INT and 1 <= count <= MAX_ACK_RANGE):
        acked = range(offsets, offsets + count)
    elif "count" not in f and isinstance(offsets, list) and _ints(offsets) and (
            not offsets or (min(offsets) >= 0 and max(offsets) <= MAX_INT)):
        acked = offsets
    else:
        raise f.bad("offsets", f"must be a list of integers, or the first of count "
                               f"consecutive ones (count within 1..{MAX_ACK_RANGE})")
    return Ack(topic, acked, group)


def _query(f: Fields) -> Query:
    since = None if f.obj.get("since") is None else f.integer("since", None, 0, 2**63 - 1)
    return Query(f.optional_string("topic", check=check_name), since)


def _remove(f: Fields) -> Remove:
    return Remove(f.string("topic", check=check_name),
                  f.optional_string("group", check=check_name))


def _empty(f: Fields) -> Empty:
    return Empty(f.string("topic", check=check_name))


def _route(f: Fields) -> Route:
    return Route(f.string("recver", max_bytes=MAX_LABEL_BYTES),
                 f.integer("id", None, 0, MAX_INT), f.body(),
                 f.integer("status", 200, 100, 999))


def _receive(f: Fields) -> Receive:
    return Receive(f.string("name", check=check_name))


def _push(f: Fields) -> Push:
    return Push(f.string("to", check=check_name), f.body())


def _follow(f: Fields) -> Follow:
    return Follow(f.string("topic", check=check_name), f.integer("start", None, 0, MAX_INT),
                  f.integer("window", DEFAULT_FOLLOW_WINDOW, *FOLLOW_WINDOWS),
                  f.optional_string("replica", max_bytes=MAX_LABEL_BYTES),
                  None if "epoch" not in f else f.epoch("epoch", None),
                  f.optional_string("config", max_bytes=4 * MAX_LABEL_BYTES))


def _copied(f: Fields) -> Copied:
    return Copied(f.string("topic", check=check_name), f.integer("next", None, 0, MAX_INT))


PARSERS: dict[str, Callable[[Fields], Request]] = {
    "declare": _declare, "produce": _produce, "consume": _consume, "unconsume": _unconsume,
    "ack": _ack, "query": _query, "remove": _remove, "empty": _empty, "route": _route,
    "receive": _receive, "push": _push, "follow": _follow, "copied": _copied,
}


#: The right each command needs of its link's identity, and on which topic (or receiver
#: name); commands not here need none (query, unconsume, ack and copied act only on what
#: the link was allowed; a route is a reply to a waiting caller).
RIGHTS: dict[str, Callable[[Any], tuple[Right, str]]] = {
    "produce": lambda r: (Right.PUBLISH, r.topic),
    "consume": lambda r: (Right.CONSUME, r.topic),
    "declare": lambda r: (Right.DECLARE, r.topic),
    "remove": lambda r: (Right.DECLARE, r.topic),
    "empty": lambda r: (Right.DECLARE, r.topic),
    "push": lambda r: (Right.PUBLISH, r.to),
    "receive": lambda r: (Right.CONSUME, r.name),
}
#: Admin actions: each logged with who asked, from where, and how it ended.
AUDITED: dict[str, Callable[[Any], str]] = {
    "remove": lambda r: f"topic {r.topic}" + ("" if r.group is None else f" group {r.group}"),
    "empty": lambda r: f"topic {r.topic}",
}


def error_names(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What an error reply names of its request: its topic and group, when they are valid
    names, so that a client can tell whose error it is even when the request had no
    ``seq`` (an ack); nothing else of the request is echoed."""
    named = {}
    for key in ("topic", "group"):
        with contextlib.suppress(ValueError):
            named[key] = check_name(obj.get(key), key)
    return named


def translated(handler: Callable[[Any, Call], dict[str, Any] | None]
                ) -> Callable[[Any, Call], dict[str, Any] | None]:
    """``handler``, with the errors of the topics' cores as the service errors they are:
    an unknown group 404, a store that failed 500, a filter or value refused 400."""
    def handle(request: Any, call: Call) -> dict[str, Any] | None:
        try:
            return handler(request, call)
        except UnknownGroupError as exc:
            raise ServiceError(Status.NOT_FOUND, str(exc)) from None
        except StoreError as exc:
            raise ServiceError(Status.INTERNAL, str(exc)) from None
        except (FilterError, ValueError) as exc:
            raise ServiceError(Status.BAD_REQUEST, str(exc)) from None
    return handle


def request_object(request: Produce, call: Call) -> dict[str, Any]:
    """A produce as the request it was (with its ``seq``), to handle it again here."""
    obj: dict[str, Any] = {"cmd": "produce", "topic": request.topic,
                           "sequence": request.sequence, "body": request.body}
    for key, value in (("producer", request.producer), ("tag", request.tag),
                       ("sizes", None if request.sizes is None else list(request.sizes)),
                       ("seq", call.seq)):
        if value is not None:
            obj[key] = value
    return obj
