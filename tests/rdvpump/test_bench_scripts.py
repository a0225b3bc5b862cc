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


@pytest.mark.parametrize(("client", "server"), [("trio", "trio"), ("block", "trio")])
def test_trio_ping_prints_its_median(client: str, server: str) -> None:
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "trio_ping.py"), client,
                           server, "200"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(rf"{client} -> {server}: median \d+\.\d us\n", done.stdout)


def test_mq_relay_floor_prints_its_ratio() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "mq_relay_floor.py"), "1"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    line = re.fullmatch(r"raw relay ([\d,]+) msgs/s, plain append ([\d,]+) msgs/s, "
                        r"ratio (\d+\.\d\d)\n", done.stdout)
    assert line is not None, done.stdout
    relay, append, ratio = (float(x.replace(",", "")) for x in line.groups())
    assert relay > 0 and append > 0 and abs(ratio - relay / append) < 0.01


def test_floor_await_prints_the_channel_the_floor_and_the_ring() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "floor_await.py"), "2000",
                           "1"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    line = re.fullmatch(r"trio memory channel ([\d,]+)/s  floor ([\d,]+)/s \((\d+\.\d\d)x\)  "
                        r"through a ring ([\d,]+)/s \((\d+\.\d\d)x\)\n", done.stdout)
    assert line is not None, done.stdout
    channel, least, least_x, ring, ring_x = (float(x.replace(",", "")) for x in line.groups())
    assert abs(least_x - least / channel) < 0.02 and abs(ring_x - ring / channel) < 0.02


def test_cluster_floor_prints_its_rate() -> None:
    """A root, three fanout servers and their clients' processes, all reaped by the
    script: every client got every byte, or the run fails."""
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "cluster_floor.py"), "1",
                           "1000"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    line = re.fullmatch(r"raw cluster B = 3, Q = 4: ([\d,]+) deliveries/s "
                        r"\((\d+\.\d\d)x OpenAMQ's 480 K\)\n", done.stdout)
    assert line is not None, done.stdout
    rate, ratio = (float(x.replace(",", "")) for x in line.groups())
    assert rate > 0 and abs(ratio - rate / 480_000) < 0.01
