"""The fold (both engines run it) against the executable specification,
:func:`replay.reference.figures`: on clean, faulty and damaged traces the analysis
counts the same events, violations of each type, matched and undelivered messages by
cause, refusals, and messages and bytes per run, broker and second."""

from __future__ import annotations

import pathlib
import subprocess
import sys
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pump.schema import Kind, Outcome, arrow_schema
from replay import analyze
from replay.reference import figures

from .test_replay import ROOT, record_echo

pytestmark = pytest.mark.slow  # whole analyses, with tables and plots


def assert_as_specified(traces: pathlib.Path, out: pathlib.Path) -> dict[str, Any]:
    summary = analyze(str(traces), str(out))
    spec = figures(traces)
    assert summary["events"] == spec["events"]
    assert summary["events_by_kind"] == dict(sorted(spec["events_by_kind"].items()))
    assert summary["violation_count"] == spec["violations"]
    assert summary["violations_by_type"] == spec["violations_by_type"]
    assert summary["messages_matched"] == spec["matched"]
    assert summary["undelivered_by_cause"] == spec["undelivered_by_cause"]
    assert summary["refusals"] == spec["refusals"]
    rows = pq.read_table(out / "throughput").to_pylist()
    assert {(r["run"], r["broker"], r["second"]): [r["messages"], r["bytes"]]
            for r in rows} == spec["per_second"]
    return summary


def test_a_clean_run_and_a_run_with_faults_are_replayed_as_specified(
        tmp_path: pathlib.Path) -> None:
    clean = record_echo(tmp_path / "clean", "parquet").parent
    assert assert_as_specified(clean, tmp_path / "clean-out")["messages_matched"] == 8000
    faults = tmp_path / "faults"
    proc = subprocess.run([sys.executable, "-m", "rdvpump", "universe", "run",
                           str(ROOT / "examples/faults.toml"), "--trace", str(faults),
                           "--trace-format", "parquet"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert_as_specified(faults, tmp_path / "faults-out")


def test_a_damaged_trace_is_replayed_as_specified(tmp_path: pathlib.Path) -> None:
    """Deliveries swapped, resized and dropped, a send twice, a delivery never sent, and
    refusals: each count the same as the specification's."""
    trace = record_echo(tmp_path / "clean", "parquet")
    rows = pq.read_table(trace).to_pylist()

    def where(kind: str, dir_: str) -> list[int]:
        return [i for i, r in enumerate(rows) if r["kind"] == kind and
                r["link"] == "server/1" and r["dir"] == dir_]

    deliver, send = where(Kind.DELIVER, "ca"), where(Kind.SEND, "ac")
    a, b = deliver[100], deliver[101]
    rows[a]["seq"], rows[b]["seq"] = rows[b]["seq"], rows[a]["seq"]
    for i in deliver[200:230]:
        rows[i]["size"] += 1
    rows[send[5]]["seq"] = 10**5  # a send of a seq never delivered, and one never sent
    dropped = set(deliver[400:440])
    edited = [r for i, r in enumerate(rows) if i not in dropped]
    edited.append(dict(rows[send[7]]))
    # refusals as the connecting side writes them, and one the accepting side wrote
    # (not counted: the connecting side has its own)
    edited += [{**rows[send[8]], "kind": Kind.REFUSE, "outcome": outcome, "reason": reason,
                "seq": None, "size": None}
               for outcome, reason in ((None, "no listener"), (None, "no listener"),
                                       (None, "unauthorized"),
                                       (Outcome.INBOUND, "unauthorized"))]
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    pq.write_table(pa.Table.from_pylist(edited, schema=arrow_schema()),
                   damaged / "d.echo.parquet")
    summary = assert_as_specified(damaged, tmp_path / "damaged-out")
    assert summary["violation_count"] > 30 and summary["undelivered_count"] >= 40
    assert sum(summary["refusals"].values()) == 3
