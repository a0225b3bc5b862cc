"""Reading a topic's files back: what a consumer behind the in-memory tail costs.

A log of 100,000 records of 1,000 bytes (its tail 64 KiB, so that every read goes to
the files), read from its start in reads of 1,024 records, five times: the best time a
record.  ``python bench/read_back.py``.  Figures in bench/RESULTS.md.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from mq import TopicLog

RECORDS, SIZE, READ = 100_000, 1_000, 1_024


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="rdvpump-read-back-") as directory:
        log = TopicLog(Path(directory) / "t", tail_bytes=64 << 10)
        for first in range(0, RECORDS, 1_000):
            log.append([(None, "producer-1", first + i, b"x" * SIZE) for i in range(1_000)])
        log.sync()
        best = float("inf")
        for _ in range(5):
            started, offset = time.perf_counter(), 0
            while offset < RECORDS:
                offset = log.read(offset, max_count=READ)[-1].offset + 1
            best = min(best, time.perf_counter() - started)
        log.close()
    print(f"{RECORDS:,} records of {SIZE:,} bytes read back from the files: "
          f"{best / RECORDS * 1e9:.0f} ns a record (best of five)")


if __name__ == "__main__":
    main()
