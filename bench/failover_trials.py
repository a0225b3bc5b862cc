"""`bench failover`'s SIGKILL trials alone: no throughput figures, no JetStream, no
SIGSTOP figure printed.

The same processes and the same trials as `rdvpump bench failover` (a ``sync`` group of
three at ``--durability sync``, every setting at its default, its master SIGKILLed and
started again each trial), printed as each trial's time in milliseconds, sorted: from
the kill to the first publish the successor acknowledged, and to the first
acknowledgement by another member that a routed ``mq.Producer`` publishing every 5 ms
got.  Quick (some 15 s for 20 trials) for comparing two trees.

``python bench/failover_trials.py [TRIALS]``.  Figures in bench/RESULTS.md.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import trio

from rdvpump.bench import failover


async def _skipped(*args: Any) -> float:
    return 0.0


async def main(trials: int) -> None:
    failover._rate = _skipped  # type: ignore[assignment]
    failover._batched_rate = _skipped  # type: ignore[assignment]
    with tempfile.TemporaryDirectory(prefix="rdvpump-failover-trials-") as tmp:
        group = failover._Group(Path(tmp), "sync", "sync")
        _, _, tried = await failover._measure(group, 1, failover.PUBLISHERS, trials,
                                              lambda _: None)
    for result in tried:
        seconds = getattr(result, "seconds", None)
        if seconds and result.case.endswith(("sigkill", "routed-producer")):
            print(f"{result.case}: " + " ".join(f"{1000 * s:.0f}" for s in sorted(seconds)))


if __name__ == "__main__":
    trio.run(main, int(sys.argv[1]) if len(sys.argv) > 1 else 20)
