"""SIGKILL of a real process writing a queue: every acknowledged message is there after."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import textwrap

import pytest

from mq import TopicLog

#: A producer that acknowledges (prints) an offset only once it is fsynced (``sync``
#: policy, group commit: one fsync per batch of 1 to 50 messages); its full segments
#: sealed before the next append, or in a thread while it appends (``flush_in_thread``:
#: a kill often finds one being sealed).
CHILD = textwrap.dedent("""
    import random, sys
    from mq import TopicLog

    log = TopicLog(sys.argv[1], segment_bytes=64 << 10, flush_in_thread=sys.argv[3] == "1")
    rng = random.Random(int(sys.argv[2]))
    n = log.next_offset
    print("ready", n, flush=True)
    while True:
        batch = [(None, "p", n + i, (b"%08d" % (n + i)) * rng.randrange(1, 40))
                 for i in range(rng.randrange(1, 50))]
        log.append(batch)
        n += len(batch)
        print("acked", log.sync(), flush=True)
""")


def body(offset: int, record_body: bytes | memoryview) -> bool:
    return record_body == b"%08d" % offset * (len(record_body) // 8) and len(record_body) >= 8


@pytest.mark.slow
@pytest.mark.parametrize("run", range(5))
def test_sigkill_mid_stream_loses_nothing_acknowledged(tmp_path: pathlib.Path, run: int) -> None:
    acked = 0
    flush_in_thread = run % 2  # runs 1 and 3
    for restart in range(3):  # kill, restart on the same directory, kill again
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path), str(run),
                                  str(flush_in_thread)], stdout=subprocess.PIPE, text=True)
        try:
            assert child.stdout is not None
            ready = child.stdout.readline().split()
            assert ready[0] == "ready" and int(ready[1]) >= acked  # nothing acked went
            kill_after = 50 + 37 * run + 11 * restart
            for _ in range(kill_after):
                line = child.stdout.readline()
                assert line.startswith("acked"), line
                acked = int(line.split()[1])
            os.kill(child.pid, signal.SIGKILL)
        finally:
            child.kill()
            child.wait(timeout=10)
            if child.stdout is not None:
                child.stdout.close()
        assert child.returncode == -signal.SIGKILL
        log = TopicLog(tmp_path, segment_bytes=64 << 10)
        try:
            assert log.next_offset >= acked
            records = []
            offset = 0
            while batch := log.read(offset, max_count=1000):
                records += batch
                offset = batch[-1].offset + 1
            assert [r.offset for r in records] == list(range(log.next_offset))
            assert all(body(r.offset, r.body) for r in records)
            assert log.corruptions == []
        finally:
            log.close()
