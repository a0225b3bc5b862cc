"""A topic's ``meta.json``: its name, flags and consume groups with their filters.

The file is what a restart finds a topic by: its name as the client gave it
(the directory holds the name's file-name form, :func:`~mq.storage._names.disk_name`),
its flags, and every declared group with its filter.  It is replaced
atomically whenever one of those changes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path

from ..storage._names import check_name, disk_name
from ..storage._record import FormatError
from ._requests import FLAG_NAMES

META = "meta.json"
META_VERSION = 1


def encode_meta(topic: str, flags: Iterable[str], groups: Mapping[str, str | None]) -> bytes:
    meta = {"version": META_VERSION, "topic": topic, "flags": sorted(flags),
            "groups": dict(groups)}
    return json.dumps(meta, indent=1).encode()


def read_meta(path: Path) -> tuple[str, frozenset[str], dict[str, str | None]]:
    """A topic's ``meta.json``: its name, flags and groups with their filters, each
    checked; :class:`~mq.storage._record.FormatError` naming the file and what is wrong (OSError
    when it cannot be read)."""
    try:
        meta = json.loads(path.read_bytes())
    except (ValueError, UnicodeDecodeError) as exc:
        raise FormatError(f"{path}: not JSON: {exc}") from None
    if not isinstance(meta, dict):
        raise FormatError(f"{path}: not a JSON object")
    if meta.get("version") != META_VERSION:
        raise FormatError(f"{path}: topic format version {meta.get('version')!r}; this "
                          f"rdvpump reads {META_VERSION}")
    name, flags, groups = meta.get("topic"), meta.get("flags"), meta.get("groups")
    try:
        name = check_name(name, "topic")
    except ValueError as exc:
        raise FormatError(f"{path}: {exc}") from None
    if path.parent.name != disk_name(name):
        raise FormatError(f"{path}: names topic {name!r}, whose directory would be "
                          f"{disk_name(name)!r}, not {path.parent.name!r}")
    if not isinstance(flags, list) or not set(flags) <= set(FLAG_NAMES):
        raise FormatError(f"{path}: flags {flags!r} are not a list of "
                          f"{', '.join(FLAG_NAMES)}")
    if not isinstance(groups, dict) or not all(
            isinstance(f, str | None) for f in groups.values()):
        raise FormatError(f"{path}: groups are not a mapping of names to filters")
    for group in groups:
        try:
            check_name(group, "group")
        except ValueError as exc:
            raise FormatError(f"{path}: {exc}") from None
    return name, frozenset(flags), groups
