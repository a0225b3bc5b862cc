"""The scripts in bench/ that bench/RESULTS.md quotes still run and print their figure
(small counts: a smoke test, not a measurement)."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # real processes

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _output(script: str, *args: str, timeout: float = 120) -> str:
    """What ``bench/SCRIPT ARGS`` printed, once it ended well."""
    done = subprocess.run([sys.executable, str(ROOT / "bench" / script), *args],
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize(("client", "server"), [("trio", "trio"), ("block", "trio")])
def test_trio_ping_prints_its_median(client: str, server: str) -> None:
    assert re.fullmatch(rf"{client} -> {server}: median \d+\.\d us\n",
                        _output("trio_ping.py", client, server, "200"))


def test_mq_relay_floor_prints_its_ratio() -> None:
    out = _output("mq_relay_floor.py", "1", timeout=300)
    line = re.fullmatch(r"raw relay ([\d,]+) msgs/s, plain append ([\d,]+) msgs/s, "
                        r"ratio (\d+\.\d\d)\n", out)
    assert line is not None, out
    relay, append, ratio = (float(x.replace(",", "")) for x in line.groups())
    assert relay > 0 and append > 0 and abs(ratio - relay / append) < 0.01


def test_sync_latency_prints_its_percentiles() -> None:
    out = _output("sync_latency.py", "1024", "20000", "0.3", timeout=300)
    line = re.fullmatch(r"(\d+) probes: p50 (\d+\.\d\d) ms, p90 (\d+\.\d\d) ms, "
                        r"p99 (\d+\.\d\d) ms\n", out)
    assert line is not None, out
    probes, p50, p90, p99 = map(float, line.groups())
    assert probes > 0 and 0 < p50 <= p90 <= p99


def test_bench_mq_s_relay_floor_moves_every_byte_and_reaps_its_processes(
        tmp_path: pathlib.Path) -> None:
    """``bench mq``'s ``relay-floor`` row: three processes that move every byte (the
    consumer counts them), and none is left."""
    from rdvpump.bench._relay import relay_floor

    before = _children()
    rate = relay_floor(1024, 3000, "sync", 200, tmp_path)  # bench mq's smoke runs the rest
    assert rate > 0 and _children() == before
    assert not list(tmp_path.iterdir())  # its file removed


def _children() -> set[int]:
    """This process's live children."""
    import os

    found = set()
    for task in pathlib.Path(f"/proc/{os.getpid()}/task").iterdir():
        children = task / "children"
        if children.exists():
            found |= {int(pid) for pid in children.read_text().split()}
    return found


def test_floor_await_prints_the_channel_the_floor_and_the_ring() -> None:
    out = _output("floor_await.py", "2000", "1")
    line = re.fullmatch(r"trio memory channel ([\d,]+)/s  floor ([\d,]+)/s \((\d+\.\d\d)x\)  "
                        r"through a ring ([\d,]+)/s \((\d+\.\d\d)x\)\n", out)
    assert line is not None, out
    channel, least, least_x, ring, ring_x = (float(x.replace(",", "")) for x in line.groups())
    assert abs(least_x - least / channel) < 0.02 and abs(ring_x - ring / channel) < 0.02


def test_cluster_floor_prints_its_rate() -> None:
    """A root, three fanout servers and their clients' processes, all reaped by the
    script: every client got every byte, or the run fails."""
    out = _output("cluster_floor.py", "1", "1000")
    line = re.fullmatch(r"raw cluster B = 3, Q = 4: ([\d,]+) deliveries/s "
                        r"\((\d+\.\d\d)x OpenAMQ's 480 K\)\n", out)
    assert line is not None, out
    rate, ratio = (float(x.replace(",", "")) for x in line.groups())
    assert rate > 0 and abs(ratio - rate / 480_000) < 0.01


def test_page_touch_prints_each_file_of_both_passes(tmp_path: pathlib.Path) -> None:
    """Two passes over the files, each line a file's write time and system CPU; the
    files are gone afterwards."""
    out = _output("page_touch.py", "2", "4", str(tmp_path))
    lines = out.splitlines()
    assert len(lines) == 4, out
    for line, (run, file) in zip(lines, [(1, 1), (1, 2), (2, 1), (2, 2)], strict=True):
        found = re.fullmatch(rf"pass {run} file {file}: 4 MiB in (\d+\.\d\d) s, "
                             r"(\d+\.\d) us of system CPU per 64 KiB", line)
        assert found is not None, line
    assert list(tmp_path.iterdir()) == []


def test_replication_cpu_prints_each_figure_with_each_process_s_cpu() -> None:
    """One server's awaited and batched figures, each with the CPU a message of this
    process (the publishers) and of the server.  Without arguments it says how to call
    it, in one line."""
    out = _output("replication_cpu.py", "400", "single")
    lines = out.splitlines()
    assert lines[0] == "single", out
    for line, kind in zip(lines[1:], ("awaited", "batched"), strict=True):
        assert re.fullmatch(rf"  {kind} +\d+ msg/s; CPU us a message: client=\d+\.\d "
                            r"s0=\d+\.\d", line), out
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "replication_cpu.py")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith("usage: python bench/replication_cpu.py MESSAGES SYSTEMS")
    assert len(done.stderr.splitlines()) == 1
