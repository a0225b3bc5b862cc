"""Offline checks of queue directories: every record, index, cursor and topic file.

:func:`verify` reads a directory (an ``--mq-dir``, one broker's directory in
it, or one topic's) without changing anything, and returns what it found:
damage (a corrupt record, a file of the wrong format, an unreadable cursor or
``meta.json``), each with its file, byte position and the offsets it hides,
and notes (a torn tail that opening will cut, an index that opening will
rebuild).  ``rdvpump mq verify DIR`` prints them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..storage._cursor import CursorStore, bad_slots, decode_cursor
from ..storage._files import lock_holder
from ..storage._record import DEFAULT_MAX_BODY, RECORD_OVERHEAD, SEGMENT_HEADER, FormatError, crc32
from ..storage._scan import (
    INDEX_ENTRY,
    INDEX_FOOTER,
    INDEX_MAGIC,
    INDEX_VERSION,
    header_base,
    scan_segment,
)
from ._meta import META, read_meta

#: The largest record the server's logs accept (its default maximum body).
MAX_RECORD = RECORD_OVERHEAD + 2 * 255 + DEFAULT_MAX_BODY


@dataclass(frozen=True)
class Finding:
    """One thing found: ``damage`` (True) or a note; where, and what."""

    file: str
    position: int | None
    what: str
    damage: bool = True

    def __str__(self) -> str:
        at = "" if self.position is None else f" at byte {self.position}"
        return f"{'damaged' if self.damage else 'note'}: {self.file}{at}: {self.what}"


@dataclass
class Report:
    topics: int = 0
    segments: int = 0
    records: int = 0
    findings: list[Finding] = field(default_factory=list)

    @property
    def damaged(self) -> list[Finding]:
        return [f for f in self.findings if f.damage]


def verify(directory: str | os.PathLike[str]) -> Report:
    """Check every topic under ``directory`` (found by their ``segments`` folders);
    FileNotFoundError if it does not exist, NotADirectoryError if it is a file."""
    root = Path(directory)
    if root.exists() and not root.is_dir():
        raise NotADirectoryError(f"{root} is a file: give an --mq-dir, a broker's "
                                 f"directory in it, or a topic's directory")
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no such directory")
    report = Report()
    segdirs = sorted(p for p in root.rglob("segments") if p.is_dir())
    for server_dir in sorted({segdir.parent.parent for segdir in segdirs}):
        pid = lock_holder(server_dir.stat())
        if pid is not None:  # a running server's: what it is writing is read mid-write
            report.findings.append(Finding(
                str(server_dir), None, f"in use by a running MQ server (pid {pid}): the "
                f"records it is writing may look torn; stop it for an exact check",
                damage=False))
    for segdir in segdirs:
        report.topics += 1
        _verify_topic(segdir.parent, report)
    return report


def _verify_topic(topic_dir: Path, report: Report) -> None:
    add = report.findings.append
    meta_path = topic_dir / META
    groups: list[str] = []
    try:
        _, _, declared = read_meta(meta_path)
        groups = list(declared)
    except FileNotFoundError:
        add(Finding(str(meta_path), None, "missing: the server will not find this topic"))
    except (FormatError, OSError) as exc:
        add(Finding(str(meta_path), None, str(exc)))
    paths = sorted((topic_dir / "segments").glob("*.seg"))
    for i, path in enumerate(paths):
        report.segments += 1
        last = i == len(paths) - 1
        data = path.read_bytes()
        try:
            base, damage = header_base(data[:SEGMENT_HEADER.size], path)
        except FormatError as exc:
            add(Finding(str(path), 0, str(exc)))
            continue
        if damage is not None:
            add(Finding(str(path), 0, f"segment header: {damage}; the records after it are "
                                      f"read all the same"))
        scan = scan_segment(data, base, MAX_RECORD, last=last)
        following = _base_after(paths, i)
        for pos, end, reason, first, next_valid in scan.bad:
            hidden_end = next_valid if next_valid is not None else following
            hidden = (f"offsets from {first} on" if hidden_end is None else
                      f"offset {first}" if hidden_end == first + 1 else
                      f"offsets {first} to {hidden_end - 1}")
            add(Finding(str(path), pos, f"{reason}; {end - pos} bytes hide {hidden}"))
        report.records += scan.records
        if scan.torn is not None:
            add(Finding(str(path), scan.torn[0],
                        f"{scan.torn[1]}: opening the queue cuts {len(data) - scan.torn[0]} "
                        f"bytes here (a write a crash cut short)", damage=False))
        if not last:
            _verify_index(path, base, data, add)
    for group in groups:
        cursor = CursorStore.path_in(topic_dir, group)
        try:
            data = cursor.read_bytes()
            offset = decode_cursor(data, str(cursor))
        except FileNotFoundError:
            continue
        except FormatError as exc:
            add(Finding(str(cursor), None, f"{exc}: group {group!r} starts again by its "
                                           f"start rule"))
            continue
        for at in bad_slots(data):
            add(Finding(str(cursor), at, f"a slot that does not check out (a save a crash "
                                         f"cut short): the other holds the cursor, offset "
                                         f"{offset}", damage=False))


def _base_after(paths: list[Path], i: int) -> int | None:
    """The base offset the next segment's name gives, if there is one."""
    if i + 1 >= len(paths):
        return None
    try:
        return int(paths[i + 1].stem)
    except ValueError:
        return None


def _verify_index(path: Path, base: int, data: bytes, add: Callable[[Finding], None]
                  ) -> None:
    index = path.with_suffix(".idx")
    try:
        raw = index.read_bytes()
    except FileNotFoundError:
        add(Finding(str(index), None, "missing: opening the queue reads the segment whole "
                                      "and writes it again", damage=False))
        return
    ok = len(raw) >= INDEX_FOOTER.size and (len(raw) - INDEX_FOOTER.size) % INDEX_ENTRY.size == 0
    if ok:
        magic, version, ibase, _, size, _, seg_crc, crc = INDEX_FOOTER.unpack_from(
            raw, len(raw) - INDEX_FOOTER.size)
        ok = (magic == INDEX_MAGIC and version == INDEX_VERSION and ibase == base
              and size == len(data) and crc32(raw[:-4]) == crc and crc32(data) == seg_crc)
    if not ok:
        add(Finding(str(index), None, "does not match its segment: opening the queue reads "
                                      "the segment whole and writes it again", damage=False))
