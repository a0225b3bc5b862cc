"""Trace writers: JSON Lines formatted column-wise in Arrow gives the bytes of line-by-line."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest

from pump import TraceRecorder
from pump._writers import JsonlWriter
from rdvpump.bench.replay import generate


class CountingWriter(JsonlWriter):
    arrow_blocks = 0

    def _block_lines(self, *args: Any) -> Any:
        self.arrow_blocks += 1
        return super()._block_lines(*args)


def trace_bytes(path: pathlib.Path, *, arrow: bool) -> bytes:
    writer = CountingWriter(path, arrow=arrow)
    recorder = TraceRecorder(writer, run="w", pump="gen", chunk_rows=5000, background=True)
    generate(path.parent, 20_000, size=100, links=3, recorder=recorder)
    assert (writer.arrow_blocks > 3) == arrow  # the Arrow path ran, on many blocks
    return path.read_bytes()


def test_arrow_and_python_formatting_write_the_same_bytes(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("pyarrow")
    fast = trace_bytes(tmp_path / "arrow.jsonl", arrow=True)
    slow = trace_bytes(tmp_path / "python.jsonl", arrow=False)
    assert fast == slow
    rows = [json.loads(line) for line in fast.splitlines()]
    sends = [r for r in rows if r["kind"] == "send"]
    assert len(sends) == 20_000 - 20_000 % 3
    per_link: dict[str, list[int]] = {}
    for r in sends:
        per_link.setdefault(r["link"], []).append(r["seq"])
    assert all(sorted(s) == list(range(1, len(s) + 1)) for s in per_link.values())
    assert all(r["size"] == 100 and isinstance(r["time"], float) for r in sends)
