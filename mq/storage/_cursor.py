"""Consume groups' positions on disk: one small file per group, replaced atomically.

``<dir>/groups/<the group's file-name form, mq.storage._names.disk_name>.cursor``:
magic b"RDVPQCUR" (8) | version u32 | offset u64 | crc u32 (CRC-32 of what
precedes it).  A cursor is the group's *ack floor*: every offset below it is
acknowledged.  It is written to a temporary file, fsynced, renamed over the
old one, and the directory is fsynced, so a crash leaves the old cursor or the
new one, never a mix.
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Iterable
from pathlib import Path

from ._files import write_file
from ._names import disk_name
from ._record import FormatError, crc32

log = logging.getLogger("rdvpump.mq")

CURSOR = struct.Struct("<8sIQI")
CURSOR_MAGIC = b"RDVPQCUR"


class CursorStore:
    """Every group's ack floor for one topic."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory) / "groups"
        self.directory.mkdir(parents=True, exist_ok=True)

    def _path(self, group: str) -> Path:
        return self.path_in(self.directory.parent, group)

    @staticmethod
    def path_in(topic_dir: Path, group: str) -> Path:
        """Where a topic's cursor of ``group`` is."""
        return topic_dir / "groups" / f"{disk_name(group)}.cursor"

    def load(self, groups: Iterable[str]) -> dict[str, int]:
        """The cursors of ``groups`` (the topic's, as its ``meta.json`` lists them); a
        missing or damaged file is reported and left out (that group starts again by its
        start rule)."""
        cursors = {}
        for group in groups:
            path = self._path(group)
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                continue
            try:
                cursors[group] = decode_cursor(data, str(path))
            except FormatError as exc:
                log.error("%s; the group starts again by its start rule", exc)
        return cursors

    def save(self, group: str, offset: int) -> None:
        write_file(self._path(group), encode_cursor(offset))

    def remove(self, group: str) -> None:
        self._path(group).unlink(missing_ok=True)


def encode_cursor(offset: int) -> bytes:
    head = struct.pack("<8sIQ", CURSOR_MAGIC, 1, offset)
    return head + struct.pack("<I", crc32(head))


def decode_cursor(data: bytes, where: str) -> int:
    if len(data) != CURSOR.size:
        raise FormatError(f"{where}: {len(data)} bytes, not a cursor of {CURSOR.size}")
    magic, version, offset, crc = CURSOR.unpack(data)
    if magic != CURSOR_MAGIC:
        raise FormatError(f"{where}: not an rdvpump cursor")
    if version != 1:
        raise FormatError(f"{where}: cursor format version {version}; this rdvpump reads 1")
    if crc32(data[:-4]) != crc:
        raise FormatError(f"{where}: cursor checksum mismatch")
    return int(offset)
