"""The floor of `bench mq` at 64 KiB `sync` (since then a baseline row of ``rdvpump
bench mq`` itself, ``relay-floor``): 4,000 records of 64 KiB + 36 B through three
processes on 127.0.0.1 with nothing but blocking sockets (:mod:`rdvpump.bench._relay`),
beside the plain append of ``rdvpump bench mq`` (256 KiB writes, each fsynced).

``python bench/mq_relay_floor.py [RUNS]``: one line per run.  Figures in bench/RESULTS.md.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from rdvpump.bench._relay import relay_floor
from rdvpump.bench.mq import batch_for, plain_append

SIZE, COUNT = 65536, 4000


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    with tempfile.TemporaryDirectory(prefix="rdvpump-relay-floor-") as directory:
        for _ in range(runs):
            relay = relay_floor(SIZE, COUNT, "sync", batch_for(SIZE), Path(directory))
            append = plain_append(SIZE, COUNT, "sync", Path(directory))
            print(f"raw relay {relay:,.0f} msgs/s, plain append {append:,.0f} msgs/s, "
                  f"ratio {relay / append:.2f}")


if __name__ == "__main__":
    main()
