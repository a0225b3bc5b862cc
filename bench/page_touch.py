"""What a write into the page cache costs, in memory the machine used lately and in memory
it did not: the swing under `bench mq`'s plain append at 64 KiB.

Two passes over FILES files of MIB MiB each, written 256 KiB at a time (the plain
append's writes at 64 KiB) with no fsync, every file of a pass kept until the pass ends;
between the passes the files are deleted, so the second pass's pages are the ones the
first freed.  On a virtual machine whose freed memory goes back to the host after a
while, a page the guest takes that the host has not backed lately costs a fault on the
host the first time it is touched: the first pass pays it beyond what recent runs
freed, the second does not.  A pass's figure is the system CPU of its writes per 64 KiB.

``python bench/page_touch.py [FILES] [MIB] [DIR]`` (default 3 files of 1,024 MiB in a
temporary directory): one line per file and pass.  Figures in bench/RESULTS.md.
"""

from __future__ import annotations

import os
import resource
import sys
import tempfile
import time
from pathlib import Path

CHUNK = 256 << 10


def write_one(path: Path, mib: int) -> tuple[float, float]:
    """Write ``mib`` MiB to ``path``: (wall seconds, system CPU seconds)."""
    data = b"x" * CHUNK
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_stime
        start = time.perf_counter()
        for _ in range(mib * (1 << 20) // CHUNK):
            os.write(fd, data)
        wall = time.perf_counter() - start
        return wall, resource.getrusage(resource.RUSAGE_SELF).ru_stime - before
    finally:
        os.close(fd)


def main() -> None:
    files = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    mib = int(sys.argv[2]) if len(sys.argv) > 2 else 1024
    where = sys.argv[3] if len(sys.argv) > 3 else None
    with tempfile.TemporaryDirectory(prefix="rdvpump-page-touch-", dir=where) as directory:
        paths = [Path(directory) / f"f{i}" for i in range(files)]
        for run in (1, 2):
            for i, path in enumerate(paths, 1):
                wall, system = write_one(path, mib)
                per = system * 1e6 / (mib * 16)  # 16 pieces of 64 KiB a MiB
                print(f"pass {run} file {i}: {mib} MiB in {wall:.2f} s, "
                      f"{per:.1f} us of system CPU per 64 KiB", flush=True)
            for path in paths:
                path.unlink()


if __name__ == "__main__":
    main()
