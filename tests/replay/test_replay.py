"""The replay's analysis: clean traces pass, edited ones are caught exactly (in this
process), and Spark (local mode, a real JVM) gives the same results on every kind of
trace."""

from __future__ import annotations

import json
import os
import pathlib
import random
import re
import shutil
import subprocess
import sys
from typing import Any

import pyarrow.parquet as pq
import pytest
import trio

from rdvpump.universe_file import load_universe
from rdvpump.workloads import run_in_process
from replay import TraceError, analyze

ROOT = pathlib.Path(__file__).resolve().parents[2]
#: Whole analyses, with tables and plots (1-3 s each): not the quick loop's, which keeps
#: the fold's and the plots' own tests (test_helpers.py).
pytestmark = pytest.mark.slow


def record_echo(directory: pathlib.Path, fmt: str = "jsonl") -> pathlib.Path:
    """The echo example in one process, traced; return the trace file."""
    spec = load_universe(ROOT / "examples/echo.toml")
    reports = trio.run(lambda: run_in_process(spec, trace_dir=str(directory), trace_format=fmt))
    assert all(r.verified for r in reports)
    (path,) = directory.glob(f"*.{fmt}")
    return path


@pytest.fixture(scope="module")
def clean_jsonl(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return record_echo(tmp_path_factory.mktemp("clean"))


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_a_clean_trace_has_no_violations(
        tmp_path: pathlib.Path, fmt: str) -> None:
    trace = record_echo(tmp_path / "traces", fmt)
    summary = analyze(str(trace.parent), str(tmp_path / "out"))
    assert summary["violation_count"] == 0
    assert summary["messages_sent"] == summary["messages_delivered"] == 8000
    assert summary["messages_matched"] == 8000 and summary["undelivered_count"] == 0
    assert summary["links"] == 2 and summary["latency_s"]["p50"] > 0
    assert summary["message_size"] == {"min": 64, "mean": 544.0, "max": 1024}
    out = tmp_path / "out"
    for table in ("links", "violations", "undelivered", "latency", "throughput", "refusals",
                  "sizes"):
        assert any((out / table).glob("*.parquet")), table
    assert json.loads((out / "summary.json").read_text())["violation_count"] == 0
    for plot in ("throughput.png", "latency.png", "links.png"):
        assert_a_drawn_plot(out / plot)
    # a run of under a second is cut into many bins (at least 80 of the 200), not one dot
    assert summary["duration_s"] < 2 and summary["duration_s"] / summary["bin_width_s"] >= 80
    throughput = pq.read_table(out / "throughput").to_pylist()
    assert sum(r["messages"] for r in throughput) == 8000
    assert {r["broker"] for r in throughput} == {"server", "client1", "client2"}
    links = pq.read_table(out / "links").to_pylist()
    assert sorted((r["connector"], r["acceptor"]) for r in links) == [
        ("client1", "server"), ("client2", "server")]
    assert all(r["connected_at"] <= r["accepted_at"] < r["ended_at"] for r in links)
    latency = pq.read_table(out / "latency").to_pylist()
    assert {(r["link"], r["dir"], r["messages"]) for r in latency} == {
        (link, d, 2000) for link in ("server/1", "server/2") for d in ("ca", "ac")}
    assert all(0 < r["p50"] <= r["p90"] <= r["p99"] <= r["max"] for r in latency)


def assert_a_drawn_plot(path: pathlib.Path) -> None:
    """A PNG of a readable size, with ink on it: many colours, not a blank canvas."""
    from matplotlib import image

    pixels = image.imread(path)
    height, width = pixels.shape[:2]
    assert width >= 800 and height >= 200, (path.name, pixels.shape)
    rgb = (pixels[..., :3] * 255).astype("uint8").reshape(-1, 3)
    inked = (rgb.min(axis=1) < 200).mean()
    colours = len({tuple(c) for c in rgb[:: max(1, len(rgb) // 50_000)]})
    assert inked > 0.02 and colours > 20, (path.name, inked, colours)


def _rows(path: pathlib.Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _where(rows: list[dict[str, Any]], kind: str, link: str, dir_: str) -> list[int]:
    return [i for i, r in enumerate(rows) if r["kind"] == kind and r.get("link") == link
            and r.get("dir") == dir_]


def _analyze_rows(rows: list[dict[str, Any]], directory: pathlib.Path,
                  **kw: Any) -> dict[str, Any]:
    directory.mkdir()
    (directory / "edited.echo.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return analyze(str(directory), **kw)


def _found(summary: dict[str, Any]) -> set[tuple[str, str, str, int]]:
    return {(v["violation"], v["link"], v["dir"], v["seq"]) for v in summary["violations"]}


@pytest.mark.spark
def test_a_pinned_bench_run_gives_local_1_one_cpu() -> None:
    """`bench replay --pin` runs local[N] on N CPUs: the JVM of a local[1] run may run on
    one (unpinned, on them all); masters it cannot pin are one line and exit 1."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs to tell a pinned run from an unpinned one")
    bench = [sys.executable, "-m", "rdvpump", "bench", "replay"]
    proc = subprocess.run([*bench, "--pin", "--master", "local[1]", "--events", "20000",
                           "--no-floor", "--jvm", "quick", "--json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (result,) = [json.loads(line) for line in proc.stdout.splitlines()]
    assert (result["case"], result["cpus"]) == ("replay-spark-local[1]-pinned", 1)
    for master, why in (("local[*]", "pinning needs local[N] masters, got 'local[*]'"),
                        ("local[4096]", "cannot pin local[4096] to 4096 CPUs")):
        bad = subprocess.run([*bench, "--pin", "--master", master], capture_output=True,
                             text=True, timeout=60)
        assert bad.returncode == 1 and bad.stdout == ""
        assert why in bad.stderr and len(bad.stderr.strip().splitlines()) == 1, bad.stderr


def test_edited_trace_is_flagged_exactly(
        clean_jsonl: pathlib.Path,
                                         tmp_path: pathlib.Path) -> None:
    rows = _rows(clean_jsonl)
    deliver = _where(rows, "deliver", "server/1", "ca")
    send = _where(rows, "send", "server/2", "ac")
    # Swap the sequence numbers of two consecutive deliveries (delivered out of order) ...
    a, b = deliver[100], deliver[101]
    rows[a]["seq"], rows[b]["seq"] = rows[b]["seq"], rows[a]["seq"]
    swapped = rows[a]["seq"]
    # ... drop one send (its delivery was never sent) and deliver one message twice.
    dropped = rows[send[50]]["seq"]
    dup = deliver[300]
    edited = [*rows[:dup + 1], dict(rows[dup]), *rows[dup + 1:]]
    edited = [r for i, r in enumerate(edited) if i != (send[50] if send[50] <= dup
                                                        else send[50] + 1)]
    summary = _analyze_rows(edited, tmp_path / "edited")
    assert _found(summary) == {
        ("out of order", "server/1", "ca", swapped - 1),
        ("delivered but never sent", "server/2", "ac", dropped),
        ("duplicate delivery", "server/1", "ca", rows[dup]["seq"]),
    }
    assert summary["violation_count"] == 3
    # a message delivered twice is one journey: 8000 sent, 7999 matched (one never sent)
    assert summary["messages_delivered"] == 8001 and summary["messages_matched"] == 7999


def test_a_send_recorded_twice_and_a_resized_delivery_are_flagged(
        clean_jsonl: pathlib.Path, tmp_path: pathlib.Path) -> None:
    rows = _rows(clean_jsonl)
    send = _where(rows, "send", "server/1", "ca")[10]
    deliver = _where(rows, "deliver", "server/2", "ac")[20]
    rows[deliver]["size"] += 1
    edited = [*rows[:send + 1], dict(rows[send]), *rows[send + 1:]]
    summary = _analyze_rows(edited, tmp_path / "edited", out=str(tmp_path / "out"))
    assert _found(summary) == {
        ("duplicate send", "server/1", "ca", rows[send]["seq"]),
        ("size mismatch", "server/2", "ac", rows[deliver]["seq"]),
    }
    details = {v["violation"]: v["detail"] for v in summary["violations"]}
    assert details["duplicate send"] == "sent 2 times"
    size = rows[deliver]["size"]
    assert details["size mismatch"] == f"sent {size - 1} bytes, delivered {size}"
    assert summary["violations_by_type"] == {"duplicate send": 1, "size mismatch": 1}
    # a message sent twice is still one journey
    assert summary["messages_sent"] == 8001 and summary["messages_matched"] == 8000
    written = pq.read_table(tmp_path / "out" / "violations").to_pylist()
    assert {(v["violation"], v["seq"]) for v in written} == {
        ("duplicate send", rows[send]["seq"]), ("size mismatch", rows[deliver]["seq"])}


def test_percentiles_are_the_exact_ones_when_latencies_are_a_bucket_apart(
        tmp_path: pathlib.Path) -> None:
    """Each link's p50/p90/p99, and the run's, are the latency of rank ceil(q n) when no
    two latencies share a bucket (here each is 1 % above the one below)."""
    import math

    from replay.measure import QUANTILES
    from replay.sources import SCHEMA_VERSION

    rng = random.Random(3)
    streams = {"ca": [1e-5 * 1.01 ** i for i in range(1000)],
               "ac": [2e-3 * 1.01 ** i for i in range(401)]}
    rows: list[dict[str, Any]] = []
    for dir_, latencies in streams.items():
        shuffled = rng.sample(latencies, len(latencies))
        for seq, latency in enumerate(shuffled):
            base = {"v": SCHEMA_VERSION, "run": "r", "pump": "p", "broker": "b",
                    "link": "b/1", "dir": dir_, "seq": seq, "size": 8}
            rows.append({**base, "step": seq, "time": float(seq), "kind": "send"})
            rows.append({**base, "step": 10**6 + seq, "time": seq + latency,
                         "kind": "deliver"})
    rows.sort(key=lambda r: r["step"])
    summary = _analyze_rows(rows, tmp_path / "spread", out=str(tmp_path / "out"))
    assert summary["violation_count"] == 0 and summary["messages_matched"] == 1401

    def exact(latencies: list[float]) -> list[float]:
        values = sorted(latencies)
        return [values[math.ceil(q * len(values)) - 1] for q in QUANTILES]

    found = {r["dir"]: r for r in pq.read_table(tmp_path / "out" / "latency").to_pylist()}
    for dir_, latencies in streams.items():
        assert [found[dir_][p] for p in ("p50", "p90", "p99")] == pytest.approx(
            exact(latencies), rel=1e-6)
    assert [summary["latency_s"][p] for p in ("p50", "p90", "p99")] == pytest.approx(
        exact([x for values in streams.values() for x in values]), rel=1e-6)


def test_a_stream_without_a_link_and_one_without_a_direction_are_told_apart(
        tmp_path: pathlib.Path) -> None:
    """Streams are told apart by (run, link, dir) with their nulls: here (r, None, ca)
    and (r, ca, None), which a hash that skips nulls (as Spark's does) would confuse."""
    from replay.sources import SCHEMA_VERSION

    def row(step: int, kind: str, link: str | None, dir_: str | None) -> dict[str, Any]:
        return {"v": SCHEMA_VERSION, "run": "r", "pump": "p", "step": step,
                "time": step / 1000, "kind": kind, "broker": "b", "link": link,
                "dir": dir_, "seq": 1, "size": 8}

    rows = [row(1, "send", None, "ca"), row(2, "deliver", None, "ca"),
            row(3, "send", "ca", None)]
    summary = _analyze_rows(rows, tmp_path / "clash")
    # one stream delivered its message, the other did not: neither was sent twice
    assert summary["violation_count"] == 0
    assert summary["messages_matched"] == 1 and summary["undelivered_count"] == 1


def test_swaps_on_two_links_are_two_violations_and_a_reorder_across_links_none(
        clean_jsonl: pathlib.Path, tmp_path: pathlib.Path) -> None:
    rows = _rows(clean_jsonl)
    one, two = _where(rows, "deliver", "server/1", "ca"), _where(rows, "deliver", "server/2",
                                                               "ca")
    swapped = []
    for a, b in ((one[500], one[501]), (two[700], two[701])):
        rows[a]["seq"], rows[b]["seq"] = rows[b]["seq"], rows[a]["seq"]
        swapped.append((rows[a]["link"], rows[b]["seq"]))
    summary = _analyze_rows(rows, tmp_path / "swapped")
    assert summary["violation_count"] == 2
    assert _found(summary) == {("out of order", link, "ca", seq) for link, seq in swapped}

    # Every delivery on server/2 moves after every one on server/1 in the pump's order
    # (and to the front of the file): the order across links changes, each link's holds.
    rows = _rows(clean_jsonl)
    moved = set(_where(rows, "deliver", "server/2", "ca") + _where(rows, "deliver", "server/2",
                                                                   "ac"))
    for i in moved:
        rows[i]["step"] += 10**6
    rows = [rows[i] for i in sorted(moved)] + [r for i, r in enumerate(rows) if i not in moved]
    summary = _analyze_rows(rows, tmp_path / "across")
    assert summary["violation_count"] == 0 and summary["messages_matched"] == 8000


def test_results_do_not_depend_on_the_order_of_rows(
        clean_jsonl: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """Rows shuffled in the file (each pump step's own rows kept in their order) give the
    same summary and the same tables."""
    rows = _rows(clean_jsonl)
    steps: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        steps.setdefault(r["step"], []).append(r)
    order = list(steps)
    random.Random(7).shuffle(order)
    shuffled = [r for step in order for r in steps[step]]
    first = analyze(str(clean_jsonl.parent), str(tmp_path / "a"))
    second = _analyze_rows(shuffled, tmp_path / "shuffled", out=str(tmp_path / "b"))
    assert_same_results(first, second, tmp_path / "a", tmp_path / "b")


def assert_same_results(first: dict[str, Any], second: dict[str, Any], a: pathlib.Path,
                        b: pathlib.Path, *, plots: bool = False) -> None:
    """Two analyses gave the same summary (but where and how) and the same tables (and,
    if asked, the same plots, byte for byte)."""
    same = ("traces", "out", "engine", "spark_jobs")
    assert {k: v for k, v in first.items() if k not in same} == \
        {k: v for k, v in second.items() if k not in same}
    for table in ("links", "latency", "throughput", "sizes", "latency_histogram",
                  "violations", "undelivered", "refusals"):
        assert pq.read_table(a / table).to_pylist() == pq.read_table(b / table).to_pylist(), \
            table
    if plots:
        for plot in ("throughput.png", "latency.png", "links.png"):
            assert (a / plot).read_bytes() == (b / plot).read_bytes(), plot


@pytest.mark.parametrize("piece_rows", [3, 5, 7])  # pieces of 1, 2 and 3 seqs
def test_fifo_is_checked_across_the_pieces_of_a_long_stream(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
        piece_rows: int) -> None:
    """Deliveries swapped at seqs 4/5, 7/8 and 10/11 of a 40-message stream: three
    violations, named as when the stream is folded whole, whether each pair sits in one
    piece or straddles two (with pieces of one seq, every pair straddles)."""
    from replay import measure
    from replay.sources import SCHEMA_VERSION

    rows = []
    for seq in range(40):
        base = {"v": SCHEMA_VERSION, "run": "r", "pump": "p", "broker": "b",
                "link": "b/1", "dir": "ca", "seq": seq, "size": 8}
        rows.append({**base, "step": seq, "time": seq / 100, "kind": "send"})
        rows.append({**base, "step": 100 + seq, "time": 1 + seq / 100, "kind": "deliver"})
    delivered = [r for r in rows if r["kind"] == "deliver"]
    for low in (4, 7, 10):
        a, b = delivered[low], delivered[low + 1]
        a["seq"], b["seq"] = b["seq"], a["seq"]
    whole = _analyze_rows(rows, tmp_path / "whole")
    monkeypatch.setattr(measure, "PIECE_ROWS", piece_rows)
    cut = _analyze_rows(rows, tmp_path / "cut")
    expected = {("out of order", "b/1", "ca", low) for low in (4, 7, 10)}
    assert _found(whole) == _found(cut) == expected
    assert whole["violation_count"] == cut["violation_count"] == 3
    assert [v["detail"] for v in cut["violations"]] == [
        f"delivered after seq {low + 1}" for low in (4, 7, 10)]


def test_long_streams_folded_in_pieces_and_held_in_files_give_the_same_results(
        clean_jsonl: pathlib.Path, tmp_path: pathlib.Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A stream longer than PIECE_ROWS is folded a range of seqs at a time, FIFO checked
    across the ranges by the driver, and blocks past HELD_BYTES wait in a file: the
    summary and the tables are the same."""
    from replay import measure

    whole = analyze(str(clean_jsonl.parent), str(tmp_path / "whole"))
    monkeypatch.setattr(measure, "PIECE_ROWS", 333)
    monkeypatch.setattr(measure, "HELD_BYTES", 0)
    cut = analyze(str(clean_jsonl.parent), str(tmp_path / "cut"))
    assert_same_results(whole, cut, tmp_path / "whole", tmp_path / "cut")


def test_a_corrupt_line_is_reported_and_the_rest_analysed(
        clean_jsonl: pathlib.Path, tmp_path: pathlib.Path) -> None:
    lines = clean_jsonl.read_text().splitlines(keepends=True)
    lines.insert(41, '{"v":3,"run":"echo-1","pump":"echo","step":\n')
    traces = tmp_path / "corrupt"
    traces.mkdir()
    (traces / "t.echo.jsonl").write_text("".join(lines))
    summary = analyze(str(traces))
    assert summary["corrupt_line_count"] == 1
    (bad,) = summary["corrupt_lines"]
    assert bad["file"].endswith("t.echo.jsonl") and bad["line"] == 42
    assert summary["violation_count"] == 0 and summary["messages_matched"] == 8000


def test_clear_errors_for_missing_empty_and_other_versions(
        clean_jsonl: pathlib.Path, tmp_path: pathlib.Path) -> None:
    with pytest.raises(TraceError, match="no such trace directory"):
        analyze(str(tmp_path / "nowhere"))
    (tmp_path / "none").mkdir()
    with pytest.raises(TraceError, match=r"no trace files \(\*.jsonl, \*.parquet\)"):
        analyze(str(tmp_path / "none"))
    for other in (tmp_path / "notes.txt", pathlib.Path(os.devnull)):
        other.touch()
        with pytest.raises(TraceError, match=re.escape(
                f"{other} is not a trace file (*.jsonl, *.parquet) or a directory of them")):
            analyze(str(other))
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "e.p.jsonl").write_text("")
    with pytest.raises(TraceError, match="hold no events"):
        analyze(str(tmp_path / "empty"))
    old = tmp_path / "old"
    old.mkdir()
    shutil.copy(clean_jsonl, old / "new.echo.jsonl")
    (old / "old.echo.jsonl").write_text(
        '{"v":2,"step":0,"time":0.0,"kind":"clock","reason":"12.5"}\n')
    with pytest.raises(TraceError, match=r"version 3 expected: .*old\.echo\.jsonl has version 2"
                                         r".*record the run again"):
        analyze(str(old))


@pytest.mark.slow
def test_a_multi_process_universe_is_joined_across_its_traces(
        tmp_path: pathlib.Path) -> None:
    traces = tmp_path / "traces"
    proc = subprocess.run([sys.executable, "-m", "rdvpump",
                           "universe", "up", str(ROOT / "examples/echo.toml"),
                           "--trace", str(traces), "--run", "mp"],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "COLUMNS": "160"})
    assert proc.returncode == 0, proc.stderr
    files = sorted(p.name for p in traces.iterdir())
    assert files == ["mp.client1.jsonl", "mp.client2.jsonl", "mp.manager.jsonl",
                     "mp.server.jsonl"]
    summary = analyze(str(traces))
    assert summary["violation_count"] == 0
    assert summary["pumps"] == ["client1", "client2", "manager", "server"]
    # every echo crossed processes twice: client -> server, and back
    assert summary["messages_across_pumps"] >= 2 * 4000
    assert summary["latency_s"]["p50"] > 0  # clocks aligned: no negative latencies
    assert summary["latency_s"]["p50"] < 1.0
    # the name service's own links (each process's name client to the manager) are
    # counted apart: a clean run has no undelivered message of the user's
    assert summary["messages_sent"] == summary["messages_matched"] == 8000
    assert summary["undelivered_count"] == 0 and summary["links"] == 2
    assert summary["name_service"]["links"] == 3


def test_long_listings_are_written_whole_and_cut_in_the_summary(
        clean_jsonl: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """Every violation and undelivered message is in the tables; summary.json lists the
    first SUMMARY_LIMIT (on Spark, past COLLECT_LIMIT rows Spark writes the tables:
    test_the_engines_give_the_same_summary_tables_and_plots)."""
    from replay import measure

    rows = _rows(clean_jsonl)
    deliveries = _where(rows, "deliver", "server/1", "ca")[:150]
    for i in deliveries[:120]:
        rows[i]["size"] += 1  # 120 size mismatches
    dropped = set(deliveries[120:])  # and 30 messages never delivered
    kept = [r for i, r in enumerate(rows) if i not in dropped]
    summary = _analyze_rows(kept, tmp_path / "long", out=str(tmp_path / "out"))
    assert summary["violation_count"] == 120 and summary["undelivered_count"] == 30
    assert len(summary["violations"]) == measure.SUMMARY_LIMIT
    assert [v["seq"] for v in summary["violations"]] == sorted(
        v["seq"] for v in summary["violations"])
    assert len(pq.read_table(tmp_path / "out" / "violations")) == 120
    undelivered = pq.read_table(tmp_path / "out" / "undelivered").to_pylist()
    assert len(undelivered) == 30 and {u["cause"] for u in undelivered} == {
        "link closed with it in flight"}


def test_a_long_run_is_binned_wider_and_still_counted_per_second(
        tmp_path: pathlib.Path) -> None:
    """A run of 300 virtual seconds: plot bins of 2 s, and the throughput table still has
    one row per second that saw a delivery."""
    from brokermgr import BrokerManager
    from channels import MessageQueue
    from pump import Pump, open_trace

    traces = tmp_path / "traces"
    pump = Pump(trace=open_trace(traces, pump="p", run="long"), name="p")
    universe = BrokerManager("long", pump=pump)

    class Sink:
        def accepted(self, queue: MessageQueue) -> None:
            queue.set_listener(self)

        def received(self, message: bytes) -> None:
            pass

        def closed(self, reason: str) -> None:
            pass

    class Source(Sink):
        def connected(self, queue: MessageQueue) -> None:
            queue.set_listener(self)
            for at in (0.0, 150.5, 300.25):
                pump.call_later(at, queue.send, b"x" * 10)

        def refused(self, reason: str) -> None:
            raise AssertionError(reason)

    universe.add_broker("b").listen(1, Sink())
    universe.add_broker("a").connect("b", 1, Source())
    pump.run_until_idle()
    pump.close_trace()
    summary = analyze(str(traces), str(tmp_path / "out"))
    assert summary["messages_matched"] == 3 and summary["bin_width_s"] == 2.0
    rows = pq.read_table(tmp_path / "out" / "throughput").to_pylist()
    assert [(r["broker"], r["second"], r["messages"], r["bytes"]) for r in rows] == [
        ("b", 0, 1, 10), ("b", 150, 1, 10), ("b", 300, 1, 10)]


def _odd_lines(rows: list[dict[str, Any]]) -> str:
    """Lines of every kind a JSON Lines trace can hold that is not a clean row: not
    JSON, not an object, values of the wrong type, blank lines; and one row whose
    strings are given as other JSON values."""
    send = dict(next(r for r in rows if r["kind"] == "send"))
    odd = ['{"v":3,"run":"echo-1","pump":"echo","step":', "[1, 2]", "5", '"text"', "",
           "   ", "null", "{}", '{"v": 3}', '{"kind": "send"}', '{"v": "3", "kind": "send"}']
    for field, value in (("seq", "12"), ("seq", 1.5), ("seq", 2**70), ("size", True),
                         ("v", 2**40), ("time", "fast"), ("port", [1]), ("step", {"a": 1})):
        odd.append(json.dumps({**send, field: value}))
    odd.append(json.dumps({**send, "seq": 10**6, "reason": 7, "outcome": [1, "a"],
                           "broker": {"x": None}, "peer": False, "extra": 1}))
    return "\n".join(odd) + "\n"


@pytest.mark.spark
def test_the_engines_give_the_same_summary_tables_and_plots(
        spark: Any, clean_jsonl: pathlib.Path, tmp_path: pathlib.Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """This process and Spark, on traces of every kind: clean (JSON Lines and Parquet),
    a simulation with faults, two runs in one directory, every violation and
    undelivered messages, corrupt and odd lines, long streams in pieces held in files,
    and listings past the collect limit (written by Spark there, by the driver here).

    The only test on the session's Spark (each pytest-xdist worker that ran one would
    start a JVM of its own), so it also checks the Spark engine's shuffle keys and
    `bench replay`'s floor."""
    from pyspark.sql import functions as F

    from rdvpump.bench.replay import latency_floor
    from replay import measure
    from replay.fold import partition_keys

    # each shuffle key is one that Spark's hash partitioning sends to its partition: the
    # pmod of Spark's Murmur3 hash, for every count of partitions in one job, and where a
    # repartition puts the keys (a job each)
    pairs = [(n, key, p) for n in (1, 2, 3, 4, 7, 200)
             for p, key in enumerate(partition_keys(n))]
    frame = spark.createDataFrame(pairs, "n int, key int, p int")
    assert frame.where(F.expr("pmod(hash(key), n) != p")).count() == 0
    for partitions in (1, 3, 7):
        keys = partition_keys(partitions)
        frame = spark.createDataFrame([(k,) for k in keys], "key int")
        landed = frame.repartition(partitions, "key").select(
            "key", F.spark_partition_id().alias("p")).collect()
        assert sorted((keys.index(r["key"]), r["p"]) for r in landed) == [
            (p, p) for p in range(partitions)]
    # `bench replay`'s floor (one shuffle, each message's latency) pairs the messages the
    # analysis matches, so its time is a like-for-like lower bound
    assert latency_floor(spark, str(clean_jsonl.parent)) == 8000

    traces: dict[str, pathlib.Path] = {"clean": clean_jsonl.parent}
    traces["parquet"] = record_echo(tmp_path / "parquet", "parquet").parent
    faults = tmp_path / "faults"
    proc = subprocess.run([sys.executable, "-m", "rdvpump", "universe", "run",
                           str(ROOT / "examples/faults.toml"), "--trace", str(faults)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    traces["faults"] = faults
    runs = tmp_path / "runs"
    runs.mkdir()
    for source in (clean_jsonl, *faults.iterdir()):
        shutil.copy(source, runs / source.name)
    traces["two runs"] = runs
    rows = _rows(clean_jsonl)
    deliver = _where(rows, "deliver", "server/1", "ca")
    send = _where(rows, "send", "server/2", "ac")
    a, b = deliver[100], deliver[101]
    rows[a]["seq"], rows[b]["seq"] = rows[b]["seq"], rows[a]["seq"]
    for i in deliver[200:330]:
        rows[i]["size"] += 1
    rows[send[5]]["seq"] = 10**5
    dropped = set(deliver[400:440])
    edited = [r for i, r in enumerate(rows) if i not in dropped]
    edited += [dict(rows[deliver[600]]), dict(rows[send[7]])]
    violations = tmp_path / "violations"
    violations.mkdir()
    (violations / "e.echo.jsonl").write_text("".join(json.dumps(r) + "\n" for r in edited))
    traces["violations"] = violations
    odd = tmp_path / "odd"
    odd.mkdir()
    lines = clean_jsonl.read_text().splitlines(keepends=True)
    (odd / "o.echo.jsonl").write_text("".join(lines[:50]) + _odd_lines(rows)
                                      + "".join(lines[50:]))
    traces["odd"] = odd

    def both(name: str, where: pathlib.Path) -> dict[str, Any]:
        here = analyze(str(where), str(tmp_path / "out" / name / "local"))
        there = analyze(str(where), str(tmp_path / "out" / name / "spark"), spark=spark)
        assert (here["engine"], there["engine"]) == ("local", "spark")
        assert there["spark_jobs"] > 0 == here["spark_jobs"]
        assert_same_results(here, there, tmp_path / "out" / name / "local",
                            tmp_path / "out" / name / "spark", plots=True)
        return here

    for name, where in traces.items():
        summary = both(name, where)
        if name == "clean":
            assert summary["messages_matched"] == 8000
    monkeypatch.setattr(measure, "PIECE_ROWS", 333)
    monkeypatch.setattr(measure, "HELD_BYTES", 0)
    monkeypatch.setattr(measure, "COLLECT_LIMIT", 100)
    summary = both("pieces and long listings", violations)
    assert summary["violation_count"] > 100 and summary["undelivered_count"] < 100
    written = tmp_path / "out" / "pieces and long listings" / "spark"
    assert (written / "violations" / "_SUCCESS").exists()  # Spark wrote it, not the driver
    assert not (written / "undelivered" / "_SUCCESS").exists()


def test_the_job_file_of_a_checkout_runs_without_rdvpump_installed(
        clean_jsonl: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """``spark-submit replay/job.py`` where rdvpump is not installed: the job file loads
    the checkout's ``pump`` and ``replay`` modules by path (not the pump's package, which
    needs the compiled ring), and the analysis they make is the installed one's.  Run in a
    Python without site processing (so the editable install's finder is not there), with
    only the third-party packages on its path; the analysis runs in that process, the
    error path of ``main`` too."""
    import sysconfig

    code = (
        "import json, runpy, sys\n"
        "job = runpy.run_path(sys.argv[1], run_name='replay_job')\n"
        "pump = sys.modules['pump']\n"
        "assert not hasattr(pump, 'Pump') and pump.__path__ == [sys.argv[4]], pump\n"
        "from replay import analysis\n"
        "print(json.dumps(analysis.analyze(sys.argv[2], sys.argv[3])))\n"
        "sys.exit(job['main'](['--traces', sys.argv[3] + '/none', '--out', sys.argv[3]]))\n")
    proc = subprocess.run(
        [sys.executable, "-S", "-c", code, str(ROOT / "replay/job.py"), str(clean_jsonl),
         str(tmp_path / "out"), str(ROOT / "pump")],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": sysconfig.get_paths()["purelib"],
             "MPLBACKEND": "Agg"})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == f"error: no such trace directory: {tmp_path}/out/none"
    there = json.loads(proc.stdout)
    here = analyze(str(clean_jsonl), str(tmp_path / "here"))
    differ = ("traces", "out")
    assert {k: v for k, v in there.items() if k not in differ} == \
        {k: v for k, v in here.items() if k not in differ}
    assert there["messages_matched"] == 8000
    for name in ("summary.json", "links.png", "latency", "throughput"):
        assert (tmp_path / "out" / name).exists(), name
