"""Replication's throughput and where its CPU goes: `bench failover`'s throughput figures
alone (no failover trials, no JetStream), with the CPU each process used per message.

For each system given (``single``: one MQ server; ``async`` or ``sync``: a group of three,
its master and two replicas), the same processes `rdvpump bench failover` starts, at
``--durability interval:1`` unless a third argument says otherwise: 1 KiB publishes
from 32 publishers each awaiting its reply, then five times as many batched as
`bench mq` sends them.  Each figure is printed with the CPU (user and system, from
Linux's ``/proc``) of every process over it, in microseconds per message: ``client`` is
this process (the publishers), ``s0`` the single server or the group's first member.

``python bench/replication_cpu.py MESSAGES SYSTEMS [DURABILITY]``, for instance
``python bench/replication_cpu.py 20000 single,sync``.  Figures in bench/RESULTS.md.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

from rdvpump.bench import failover

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User and system CPU seconds of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def processes() -> dict[str, int]:
    """This process and the MQ servers it started (``broker run --id NAME``; not other
    programs' brokers on the machine), by name."""
    me = os.getpid()
    found = {"client": me}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                parent = int(stat.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        if parent == me and b"broker" in argv and b"run" in argv and b"--id" in argv:
            found[argv[argv.index(b"--id") + 1].decode()] = int(entry)
    return found


def measured(label: str, rate: Callable[..., Awaitable[float]]) -> Callable[..., Any]:
    """``rate`` (a throughput figure of `bench failover`), printed with each process's
    CPU per message."""
    async def wrapper(client: Any, messages: int, body: bytes, *args: Any) -> float:
        pids = processes()
        before = {name: cpu_s(pid) for name, pid in pids.items()}
        start = time.perf_counter()
        per_s = await rate(client, messages, body, *args)
        count = per_s * (time.perf_counter() - start)
        used = {name: 1e6 * (cpu_s(pid) - before[name]) / count
                for name, pid in sorted(pids.items())}
        print(f"  {label:8s} {per_s:9.0f} msg/s; CPU us a message: "
              + " ".join(f"{name}={us:.1f}" for name, us in used.items()), flush=True)
        return per_s
    return wrapper


async def main(messages: int, systems: list[str], durability: str) -> None:
    failover._rate = measured("awaited", failover._rate)
    failover._batched_rate = measured("batched", failover._batched_rate)
    for system in systems:
        print(system, flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            group = failover._Group(Path(tmp), None if system == "single" else system,
                                    durability)
            await failover._measure(group, messages, failover.PUBLISHERS, 0,
                                    lambda line: None)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        raise SystemExit("usage: python bench/replication_cpu.py MESSAGES SYSTEMS "
                         "[DURABILITY]  (SYSTEMS: single, async, sync, comma-separated)")
    trio.run(main, int(sys.argv[1]), sys.argv[2].split(","),
             sys.argv[3] if len(sys.argv) > 3 else "interval:1")
