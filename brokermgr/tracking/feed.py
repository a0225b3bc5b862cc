"""What a tracker sends its subscribers, sans-I/O: a full snapshot, then deltas, in pieces.

One JSON object a message:

* ``{"cmd": "track_sub", "deltas": true, "split": true, "patches": true}`` -- a client
  subscribes for deltas (and reads a ServerInfo split over pieces, and patches, below).
  Without ``deltas`` it gets zbus's feed: the whole TrackerInfo in one
  ``{"cmd": "track_pub", "trackerInfo": ...}`` after every change.
* ``{"cmd": "track_pub", "seq": S, "piece": I, "pieces": N, "trackerInfo": ...}``
  -- a full snapshot, its ``serverTable`` spread over N pieces (I = 0 .. N-1,
  every piece with the same S and the whole header).
* ``{"cmd": "track_delta", "seq": S, "piece": I, "pieces": N, "infoVersion": V,
  "servers": {address: ServerInfo}, "left": [address]}`` -- what changed
  since set S-1: servers that joined or got a new ServerInfo, servers that
  left; V is the tracker's InfoVersion after the change.  To a subscriber that said
  ``patches``, a server it was sent before goes as ``"patches": {address: {"base": B,
  "serverInfo": ..., "removed": [topic]}}``: the ServerInfo with only the topics that
  changed since the one of InfoVersion B it holds, and the topics that went; one that
  does not hold B asks for a full snapshot again.  So a change costs what changed, not
  every topic of its server.

``seq`` numbers the sets of one subscription, from 1; every piece of a set
carries it.  A subscriber applies a set only when all its pieces are in.  A
delta whose ``seq`` is not the one expected (a gap) or a set whose pieces
come out of order makes the subscriber ask for a full snapshot again
(``track_sub``) and ignore deltas until it arrives; so does a reconnect.

A piece is at most ``min(piece_bytes, the link's max_message_size)`` long.  A
ServerInfo larger than that (a server of thousands of topics) goes to a subscriber that
said ``split`` as several entries of the same address within one set, each the whole
ServerInfo but for a share of its ``topicTable``: the reader joins their topics.  To a
subscriber that did not, it cannot be sent, and its link is closed with that reason; so
is any link where one topic with the rest of its ServerInfo does not fit in a piece.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .info import InfoError, ServerInfo

#: Largest piece a tracker sends by default (the link's max_message_size if smaller).
PIECE_BYTES = 1 << 20
#: Bytes of a piece besides its entries: cmd, seq, piece numbers, the tracker's header.
OVERHEAD = 1024
#: Most pieces a subscriber accepts in one set.
MAX_PIECES = 1 << 16


class PieceTooLarge(InfoError):
    """One entry does not fit in a piece."""


class PatchBase(InfoError):
    """A patch of a ServerInfo other than the one held: the whole one is needed."""


def _key(address: str) -> bytes:
    return json.dumps(address).encode()


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


def entry_of(address: str, value: Mapping[str, Any]) -> bytes:
    """``"address": {...}`` of a ServerInfo's JSON ``value``."""
    return _key(address) + b":" + _dumps(value)


def entry(address: str, info: ServerInfo) -> bytes:
    """``"address": {ServerInfo}`` as it stands in a ``serverTable`` or ``servers`` object."""
    return _key(address) + b":" + info.encoded()


def entry_parts(address: str, info: ServerInfo, budget: int) -> list[bytes]:
    """``address``'s entry as it goes to a subscriber that reads split entries: the
    whole :func:`entry` when it fits in ``budget`` bytes, else entries of the same
    address, each at most ``budget`` bytes, each the ServerInfo with a share of its
    ``topicTable`` (in the table's order).  :class:`PieceTooLarge` when one topic with
    the rest of the ServerInfo does not fit."""
    whole = entry(address, info)
    if len(whole) + 1 <= budget:
        return [whole]
    # the table is the only '"topicTable":{}' in it: a JSON string cannot hold that
    # sequence unescaped
    head, _, tail = entry_of(address, info.to_json_without_topics()).partition(
        b'"topicTable":{}')
    head += b'"topicTable":{'
    tail = b"}" + tail
    fixed = len(head) + len(tail) + 1
    parts: list[bytes] = []
    group: list[bytes] = []
    used = fixed
    table = info.topic_table
    for name in sorted(table):
        piece = table[name].entry(name)
        size = len(piece) + 1
        if fixed + size > budget:
            raise PieceTooLarge(f"topic {name!r} of {address} with the rest of its "
                                f"ServerInfo takes {fixed + size} bytes: it does not fit in "
                                f"a piece of {budget + OVERHEAD} bytes")
        if used + size > budget and group:
            parts.append(head + b",".join(group) + tail)
            group, used = [], fixed
        group.append(piece)
        used += size
    parts.append(head + b",".join(group) + tail)
    return parts


def _pack(items: Sequence[tuple[Any, bytes]], budget: int) -> list[list[tuple[Any, bytes]]]:
    """Items in order, in as few groups as fit ``budget`` bytes each (at least one group)."""
    groups: list[list[tuple[Any, bytes]]] = [[]]
    used = 0
    for item in items:
        size = len(item[1]) + 1
        if size > budget:
            raise PieceTooLarge(f"a ServerInfo of {len(item[1])} bytes does not fit in a piece "
                           f"of {budget + OVERHEAD} bytes")
        if used + size > budget and groups[-1]:
            groups.append([])
            used = 0
        groups[-1].append(item)
        used += size
    return groups


@dataclass(frozen=True)
class PieceSet:
    """The pieces of one set, encoded once, without their ``seq`` (shared by subscribers)."""

    head: bytes  # b'{"cmd":"...","seq":'
    tails: tuple[bytes, ...]

    def numbered(self, seq: int) -> list[bytes]:
        prefix = self.head + str(seq).encode()
        return [prefix + tail for tail in self.tails]

    @property
    def nbytes(self) -> int:
        return sum(len(t) for t in self.tails)


def snapshot_pieces(header: Mapping[str, Any], entries: Iterable[bytes], budget: int) -> PieceSet:
    """A full snapshot: ``header`` (the TrackerInfo without its ``serverTable``) and the
    ``serverTable`` entries spread over pieces."""
    head = json.dumps(dict(header), separators=(",", ":"), sort_keys=True).encode()[:-1]
    groups = _pack([(True, e) for e in entries], budget - len(head))
    tails = []
    for i, group in enumerate(groups):
        table = b",".join(e for _, e in group)
        tails.append(b',"piece":%d,"pieces":%d,"trackerInfo":%s,"serverTable":{%s}}}'
                     % (i, len(groups), head, table))
    return PieceSet(b'{"cmd":"track_pub","seq":', tuple(tails))


def patch(address: str, held: ServerInfo, info: ServerInfo) -> bytes:
    """``"address": {"base": ..., "serverInfo": ..., "removed": [...]}``: ``info`` as a
    patch of ``held`` (the one of that server a subscriber holds)."""
    return _key(address) + b":" + patch_value(held, info)


def patch_value(held: ServerInfo, info: ServerInfo) -> bytes:
    """``{"base": ..., "serverInfo": ..., "removed": [...]}``: ``info`` as a patch of
    ``held``: the ServerInfo with only the topics that changed, and those that went."""
    old, new = held.topic_table, info.topic_table
    changed = {name: topic for name, topic in new.items()
               if (was := old.get(name)) is not topic and was != topic}
    # when as many topics are there unchanged as were held, every held one is there
    removed = ([] if len(new) - len(changed) >= len(old)
               else [name for name in old if name not in new])
    return b'{"base":%d,"removed":%s,"serverInfo":%s}' % (
        held.info_version, _dumps(removed) if removed else b"[]",
        info.with_topics(changed).encoded())


def patched(held: ServerInfo | None, value: Any, where: str) -> ServerInfo:
    """The ServerInfo a patch (:func:`patch_value`, parsed) makes of ``held``.
    :class:`PatchBase` when ``held`` is not the one it patches; InfoError for a patch of
    the wrong shape."""
    base, removed, info = _patch_shape(value, where)
    if held is None or held.info_version != base:
        raise PatchBase(f"{where}: a patch of InfoVersion {base}, but "
                        f"{'none' if held is None else held.info_version} is held")
    changed = ServerInfo.from_json(info, f"{where}.serverInfo", previous=held)
    if changed.server_address != held.server_address:
        raise InfoError(f"{where} holds server {changed.server_address.address!r}")
    table = dict(held.topic_table)
    for name in removed:
        table.pop(name, None)
    table.update(changed.topic_table)
    return changed.with_topics(table)


def delta_pieces(version: int, servers: Iterable[bytes], left: Iterable[str],
                 budget: int, patches: Iterable[bytes] = ()) -> PieceSet:
    """A delta: ``servers`` entries that joined or changed, addresses that ``left``, and
    ``patches`` (:func:`patch`) of servers the subscriber holds."""
    items = ([(0, e) for e in servers] + [(1, _key(a)) for a in left]
             + [(2, p) for p in patches])
    groups = _pack(items, budget)
    tails = []
    for i, group in enumerate(groups):
        joined, gone, patched = (b",".join(e for kind, e in group if kind == k)
                                 for k in range(3))
        tails.append(b',"piece":%d,"pieces":%d,"infoVersion":%d,"servers":{%s},"left":[%s]%s}'
                     % (i, len(groups), version, joined, gone,
                        b',"patches":{%s}' % patched if patched else b""))
    return PieceSet(b'{"cmd":"track_delta","seq":', tuple(tails))


# -- the subscriber's side ----------------------------------------------------------------


@dataclass(frozen=True)
class Snapshot:
    """A whole TrackerInfo (JSON, pieces merged): replace the tracker's view."""

    tracker_info: Any


@dataclass(frozen=True)
class Delta:
    """Patch the tracker's view: ``servers`` (JSON ServerInfos by address), ``left``,
    and ``patches`` (by address: ``{"base", "serverInfo", "removed"}``, see :func:`patch`)."""

    version: int
    servers: dict[str, Any]
    left: list[str]
    patches: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Resync:
    """Ask for a full snapshot again (``track_sub``): ``reason`` says why."""

    reason: str


def _count(obj: dict[str, Any], key: str) -> int:
    value = obj.get(key)
    if type(value) is not int or value < 0:
        raise InfoError(f"{obj.get('cmd')}: field {key!r} must be a non-negative integer, "
                        f"got {value!r}")
    return value


class FeedReader:
    """Reassembles pieces, checks ``seq`` and says what to do with each complete set."""

    def __init__(self) -> None:
        #: The seq of the next delta; None until a snapshot arrives (or after a gap).
        self.expected: int | None = None
        self._set: tuple[str, int, int] | None = None  # cmd, seq, pieces
        self._parts: list[dict[str, Any]] = []

    def receive(self, obj: dict[str, Any]) -> Snapshot | Delta | Resync | None:
        """One message: the set it completes, a :class:`Resync`, or None (more to come,
        or a delta ignored while a snapshot is awaited).  :class:`InfoError` for a
        message of the wrong shape."""
        cmd = obj.get("cmd")
        if cmd == "track_pub" and "seq" not in obj:  # zbus's feed: the whole table each time
            return Snapshot(obj.get("trackerInfo"))
        if cmd not in ("track_pub", "track_delta"):
            raise InfoError(f"unexpected cmd {cmd!r} on a subscription")
        seq, piece, pieces = _count(obj, "seq"), _count(obj, "piece"), _count(obj, "pieces")
        if not 0 <= piece < pieces <= MAX_PIECES:
            raise InfoError(f"{cmd}: piece {piece} of {pieces} (at most {MAX_PIECES} pieces)")
        if piece == 0:
            self._set, self._parts = (cmd, seq, pieces), []
        elif self._set != (cmd, seq, pieces) or piece != len(self._parts):
            self._set, self._parts, self.expected = None, [], None
            return Resync(f"{cmd} {seq}: piece {piece} of {pieces} out of order")
        self._parts.append(obj)
        if len(self._parts) < pieces:
            return None
        parts, self._set, self._parts = self._parts, None, []
        if cmd == "track_pub":
            self.expected = seq + 1
            return Snapshot(_merge_snapshot(parts))
        if self.expected is None:
            return None  # a snapshot is awaited; deltas before it are moot
        if seq != self.expected:
            expected, self.expected = self.expected, None
            return Resync(f"delta {seq} arrived where {expected} was expected")
        self.expected = seq + 1
        return _merge_delta(parts)


def _patch_shape(value: Any, where: str) -> tuple[int, list[str], dict[str, Any]]:
    """A patch's base, removed topics and ServerInfo object, or InfoError naming what is
    wrong with it."""
    value = _object(value, where)
    base = _count(value, "base")
    removed = value.get("removed")
    if not isinstance(removed, list) or not all(isinstance(n, str) for n in removed):
        raise InfoError(f"{where}.removed must be a list of topic names")
    return base, removed, _object(value.get("serverInfo"), f"{where}.serverInfo")


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InfoError(f"{where}: expected a JSON object, got {type(value).__name__}")
    return value


def _add_servers(table: dict[str, Any], servers: dict[str, Any], where: str) -> None:
    """``servers`` into ``table``; an address already there is a ServerInfo split over
    pieces (:func:`entry_parts`): its topics join the ones held."""
    for address, value in servers.items():
        held = table.get(address)
        if held is None:
            table[address] = value
            continue
        info = _object(value, f"{where}[{address!r}]")
        if not isinstance(held, dict) or held.get("infoVersion") != info.get("infoVersion"):
            raise InfoError(f"{where}: the parts of {address}'s ServerInfo disagree on its "
                            "infoVersion")
        topics = _object(held.setdefault("topicTable", {}), f"{where}[{address!r}].topicTable")
        topics.update(_object(info.get("topicTable", {}), f"{where}[{address!r}].topicTable"))


def _merge_snapshot(parts: list[dict[str, Any]]) -> dict[str, Any]:
    info = dict(_object(parts[0].get("trackerInfo"), "track_pub.trackerInfo"))
    table: dict[str, Any] = {}
    for part in parts:
        piece = _object(part.get("trackerInfo"), "track_pub.trackerInfo")
        _add_servers(table, _object(piece.get("serverTable", {}),
                                    "track_pub.trackerInfo.serverTable"),
                     "track_pub.trackerInfo.serverTable")
    info["serverTable"] = table
    return info


def _merge_delta(parts: list[dict[str, Any]]) -> Delta:
    version = _count(parts[-1], "infoVersion")
    servers: dict[str, Any] = {}
    left: list[str] = []
    patches: dict[str, Any] = {}
    for part in parts:
        _add_servers(servers, _object(part.get("servers", {}), "track_delta.servers"),
                     "track_delta.servers")
        gone = part.get("left", [])
        if not isinstance(gone, list) or not all(isinstance(a, str) for a in gone):
            raise InfoError("track_delta.left must be a list of addresses")
        left.extend(gone)
        for address, value in _object(part.get("patches", {}), "track_delta.patches").items():
            _patch_shape(value, f"track_delta.patches[{address!r}]")
            patches[address] = value
    return Delta(version, servers, left, patches)
