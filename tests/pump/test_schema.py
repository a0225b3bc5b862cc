"""The trace schema has one definition (pump/schema.py): writers and the replay job use it."""

from __future__ import annotations

import json
import pathlib
import time

import pytest
import trio

from pump import FIELDS, SCHEMA_VERSION, Pump, open_trace, schema


def test_the_replay_job_reads_the_schema_of_pump() -> None:
    pytest.importorskip("pyspark")
    from replay import sources
    from replay import spark as job

    assert sources.SCHEMA_VERSION == SCHEMA_VERSION == 3
    assert tuple(f.name for f in job.trace_schema().fields) == FIELDS
    assert job.trace_schema()["monotonic"].dataType.typeName() == "double"


def test_the_parquet_schema_is_the_same_columns() -> None:
    pytest.importorskip("pyarrow")
    assert tuple(schema.arrow_schema().names) == FIELDS


async def test_a_served_pump_puts_the_monotonic_clock_in_its_own_field(
        tmp_path: pathlib.Path) -> None:
    pump = Pump(trace=open_trace(tmp_path, pump="p", run="r"), name="p")
    before = time.monotonic()
    async with trio.open_nursery() as nursery:
        await nursery.start(pump.serve)
        nursery.cancel_scope.cancel()
    pump.close_trace()
    rows = [json.loads(line) for line in (tmp_path / "r.p.jsonl").read_text().splitlines()]
    (clock,) = [r for r in rows if r["kind"] == "clock"]
    assert clock["v"] == 3 and "reason" not in clock
    assert before <= clock["monotonic"] <= time.monotonic()
