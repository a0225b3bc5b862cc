"""Trace writers: JSON Lines and Parquet files, one per pump, in the schema of
:mod:`pump.schema`."""

from __future__ import annotations

import json
import os
from array import array
from collections.abc import Sequence
from itertools import count
from pathlib import Path
from typing import Any

from ._errors import ConfigError
from ._recorder import DEFAULT_CHUNK_ROWS, Block, Row, TraceRecorder, TraceWriter
from .schema import CONTEXT_FIELDS, FORMATS, SCHEMA_VERSION, Context, arrow_schema


def _json_context(context: Context) -> str:
    kind, broker, peer, port, link, dir_, outcome, reason, monotonic = context
    parts = [f'"kind":{json.dumps(kind)}']
    for name, value in (("broker", broker), ("peer", peer), ("port", port), ("link", link),
                        ("dir", dir_), ("outcome", outcome), ("reason", reason),
                        ("monotonic", monotonic)):
        if value is not None:
            parts.append(f'"{name}":{json.dumps(value)}')
    return ",".join(parts)


class JsonlWriter:
    """JSON Lines, one object per row; absent fields are left out.

    The lines of a message block (a link's sends or deliveries) differ only in seq and
    size, and step and time change only between runs of messages: where pyarrow is
    installed, a block's lines are joined column-wise in Arrow's C kernels, which
    release the GIL, so the pump's thread goes on while the writer's thread formats.
    Without pyarrow each line is formatted in Python.  The bytes are the same.
    """

    #: Blocks shorter than this are formatted in Python (the Arrow calls cost more).
    ARROW_MIN_BLOCK = 256

    def __init__(self, path: str | os.PathLike[str], *, arrow: bool = True) -> None:
        self.path = Path(path)
        self._file = open(self.path, "wb")  # noqa: SIM115
        self._fragments: list[str] = []
        self._prefix = ""
        self._pa: Any = None
        if arrow:
            try:
                import pyarrow as pa
                import pyarrow.compute as pc
            except ImportError:  # pragma: no cover - depends on the install
                pass
            else:
                self._pa, self._pc = pa, pc
                self._arange_cache = array("q")

    def write(self, run: str, pump: str, contexts: Sequence[Context], rows: list[Row],
              blocks: list[Block]) -> None:
        if not self._prefix:
            self._prefix = (f'{{"v":{SCHEMA_VERSION},"run":{json.dumps(run)},'
                            f'"pump":{json.dumps(pump)},"step":')
        fragments = self._fragments
        for context in contexts[len(fragments):]:
            fragments.append("," + _json_context(context))
        prefix = self._prefix
        lines: list[str] = []
        add = lines.append
        for step, time, cid, seq, size in rows:
            tail = "" if seq is None else f',"seq":{seq}'
            if size is not None:
                tail += f',"size":{size}'
            add(f'{prefix}{step},"time":{time!r}{fragments[cid]}{tail}}}\n')
        out: list[Any] = []
        for b in blocks:
            if self._pa is not None and len(b.sizes) >= self.ARROW_MIN_BLOCK:
                out.append("".join(lines).encode())
                lines.clear()
                out.append(self._block_lines(b, prefix, fragments[b.cid]))
                continue
            # One template per block: only step, time, seq and size vary.
            template = (prefix.replace("%", "%%") + '%d,"time":%r'
                        + fragments[b.cid].replace("%", "%%") + ',"seq":%d,"size":%d}\n')
            lines.extend(map(template.__mod__, zip(b.steps, b.times, count(b.first_seq),
                                                   b.sizes, strict=False)))
        out.append("".join(lines).encode())
        for chunk in out:
            if chunk:
                self._file.write(chunk)

    def _block_lines(self, b: Block, prefix: str, fragment: str) -> Any:
        """The block's lines, joined in Arrow: one head per run of messages (step and
        time), then seq and size per message."""
        pa, pc = self._pa, self._pc
        n = len(b.sizes)
        heads = pa.array([f'{prefix}{step},"time":{time!r}{fragment},"seq":'
                          for step, time in zip(b.run_steps, b.run_times, strict=True)],
                         pa.string())
        which = array("i")
        for i, k in enumerate(b.run_counts):
            which.extend(array("i", (i,)) * k)
        seqs = pc.add(self._arange(n), pa.scalar(b.first_seq, pa.int64()))
        joined = pc.binary_join_element_wise(
            heads.take(_int32(pa, which)), pc.cast(seqs, pa.string()), ',"size":',
            pc.cast(_int64(pa, b.sizes), pa.string()), "}\n", "")
        offsets = joined.buffers()[1]
        start, end = (int.from_bytes(offsets[i:i + 4], "little", signed=True)
                      for i in (4 * joined.offset, 4 * (joined.offset + n)))
        return memoryview(joined.buffers()[2])[start:end]

    def _arange(self, n: int) -> Any:
        cache = self._arange_cache
        if len(cache) < n:
            cache.extend(range(len(cache), max(n, 2 * len(cache))))
        return _int64(self._pa, cache)[:n]

    def close(self) -> None:
        self._file.close()


class ParquetWriter:
    """Parquet through pyarrow, one row group per chunk.

    String columns are written dictionary-encoded straight from the recorder's
    interned contexts (no string per row is ever built); the file stores no
    Arrow schema, so every reader (pyarrow, Spark) sees plain strings.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise ConfigError("Parquet traces need pyarrow: pip install 'rdvpump[replay]'"
                               ) from exc
        import pyarrow.compute as pc

        self.path = Path(path)
        self._pa = pa
        self._pc = pc
        self._arange_cache = array("q")
        schema = arrow_schema()
        self._strings = {f.name for f in schema if f.type == pa.string()}
        self._schema = pa.schema(
            [pa.field(f.name, pa.dictionary(pa.int32(), pa.string())) if f.name in
             self._strings else f for f in schema])
        self._writer = pq.ParquetWriter(str(self.path), self._schema, store_schema=False)
        self._writer.add_key_value_metadata(schema.metadata)

    def _arange(self, n: int) -> Any:
        """0 .. n-1 as an int64 Arrow array, sliced from a cache that grows as needed
        (only between writes: no slice of it outlives the ``pc.add`` that uses it)."""
        cache = self._arange_cache
        if len(cache) < n:
            cache.extend(range(len(cache), max(n, 2 * len(cache))))
        return _int64(self._pa, cache)[:n]

    def _dictionary(self, values: Sequence[Any], take: Any) -> Any:
        """A dictionary column: ``values`` per context, picked per row by ``take``."""
        pa = self._pa
        codes: dict[Any, int] = {}
        per_context = [None if v is None else codes.setdefault(v, len(codes)) for v in values]
        indices = pa.array(per_context, pa.int32()).take(take)
        return pa.DictionaryArray.from_arrays(indices, pa.array(list(codes), pa.string()))

    def write(self, run: str, pump: str, contexts: Sequence[Context], rows: list[Row],
              blocks: list[Block]) -> None:
        pa = self._pa
        steps, times, cids, seqs, sizes = array("q"), array("d"), array("i"), [], []
        if rows:
            r_step, r_time, r_cid, r_seq, r_size = zip(*rows, strict=True)
            steps.extend(r_step)
            times.extend(r_time)
            cids.extend(r_cid)
            seqs.append(pa.array(r_seq, pa.int64()))
            sizes.append(pa.array(r_size, pa.int64()))
        pc = self._pc
        for b in blocks:  # columns already: copied in C, no Python object per row
            k = len(b.sizes)
            steps.extend(b.steps)
            times.extend(b.times)
            cids.extend(array("i", (b.cid,)) * k)
            seqs.append(pc.add(self._arange(k), pa.scalar(b.first_seq, pa.int64())))
            sizes.append(_int64(pa, b.sizes))
        n = len(steps)
        take = _int32(pa, cids)
        zeros = _int32(pa, array("i", bytes(4 * n)))
        columns: dict[str, Any] = {
            "v": pa.repeat(pa.scalar(SCHEMA_VERSION, pa.int32()), n),
            "run": pa.DictionaryArray.from_arrays(zeros, pa.array([run], pa.string())),
            "pump": pa.DictionaryArray.from_arrays(zeros, pa.array([pump], pa.string())),
            "step": _int64(pa, steps),
            "time": pa.Array.from_buffers(pa.float64(), n, [None, pa.py_buffer(times)]),
            "seq": pa.concat_arrays(seqs),
            "size": pa.concat_arrays(sizes),
        }
        ctx_cols = list(zip(*contexts, strict=True))
        for name, values in zip(CONTEXT_FIELDS, ctx_cols, strict=True):
            if name in self._strings:
                columns[name] = self._dictionary(values, take)
            else:
                columns[name] = pa.array(values, self._schema.field(name).type).take(take)
        self._writer.write_table(pa.table([columns[f] for f in self._schema.names],
                                          schema=self._schema))

    def close(self) -> None:
        self._writer.close()


def _int64(pa: Any, values: array[int]) -> Any:
    return pa.Array.from_buffers(pa.int64(), len(values), [None, pa.py_buffer(values)])


def _int32(pa: Any, values: array[int]) -> Any:
    return pa.Array.from_buffers(pa.int32(), len(values), [None, pa.py_buffer(values)])


def open_trace(directory: str | os.PathLike[str], *, pump: str, run: str = "run",
               format: str = "jsonl", chunk_rows: int = DEFAULT_CHUNK_ROWS) -> TraceRecorder:
    """A recorder writing ``DIR/<run>.<pump>.<format>``, one file per pump."""
    if format not in FORMATS:
        raise ConfigError(f"trace format must be one of {', '.join(FORMATS)}, got {format!r}")
    for label, value in (("run", run), ("pump", pump)):
        if not value or "/" in value or value.startswith("."):
            raise ConfigError(f"trace {label} id {value!r} cannot be part of a file name")
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    target = path / f"{run}.{pump}.{format}"
    writer: TraceWriter = JsonlWriter(target) if format == "jsonl" else ParquetWriter(target)
    return TraceRecorder(writer, run=run, pump=pump, chunk_rows=chunk_rows, background=True)
