"""The random faults the seeded simulations of this folder apply with the fault kit, and
the directories their servers keep."""

from __future__ import annotations

import contextlib
import os
import pathlib
import random
import tempfile
from collections.abc import Iterable, Iterator

from rdvpump.testing import Faults

#: Where the simulations' servers keep their directories: in memory where the machine has
#: a tmpfs.  What a simulation checks is the protocol (roles, epochs, replication), not
#: the disk: on a disk, its servers' fsyncs only cost time (the tests of ``mq``'s
#: durability use real disks).
MEMORY = "/dev/shm" if os.path.isdir("/dev/shm") else None


@contextlib.contextmanager
def memory_dir(prefix: str) -> Iterator[pathlib.Path]:
    """A scratch directory under :data:`MEMORY`, removed on the way out."""
    with tempfile.TemporaryDirectory(prefix=prefix, dir=MEMORY) as store:
        yield pathlib.Path(store)


class Chaos:
    """Partitions (kept until healed), heals, crashes and restarts of ``servers`` (one
    always stays up), chosen with ``rng``; :meth:`end` heals every partition and brings
    every server back."""

    def __init__(self, faults: Faults, rng: random.Random, servers: Iterable[str]) -> None:
        self.faults = faults
        self.rng = rng
        self.servers = tuple(servers)
        self.crashed: set[str] = set()
        self.cut: list[tuple[list[str], list[str]]] = []
        self.delayed: set[tuple[str, str]] = set()

    @property
    def live(self) -> list[str]:
        return [s for s in self.servers if s not in self.crashed]

    def partition(self, side: list[str], other: list[str]) -> None:
        self.faults.partition(side, other)
        self.cut.append((side, other))

    def apply(self, action: str) -> None:
        """``heal`` a partition, ``crash`` a live server or ``restart`` a crashed one, at
        random, when there is one to act on; ``delay`` every byte between two servers
        (their links now and later) by up to 1.5 s, or end such a delay."""
        rng = self.rng
        if action == "delay":
            pair = tuple(sorted(rng.sample(self.servers, 2)))
            assert len(pair) == 2
            if pair in self.delayed and rng.random() < 0.5:
                self.faults.delay(pair, 0)
                self.delayed.discard(pair)
            else:
                self.faults.delay(pair, rng.uniform(0.01, 1.0), jitter=rng.uniform(0, 0.5))
                self.delayed.add(pair)
        elif action == "heal" and self.cut:
            self.faults.heal(*self.cut.pop(rng.randrange(len(self.cut))))
        elif action == "crash" and len(self.live) > 1:
            victim = rng.choice(self.live)
            self.faults.crash(victim)
            self.crashed.add(victim)
        elif action == "restart" and self.crashed:
            back = rng.choice(sorted(self.crashed))
            self.faults.restart(back)
            self.crashed.discard(back)

    def crash(self, server: str) -> None:
        """Crash ``server`` (a live one, chosen by the caller)."""
        self.faults.crash(server)
        self.crashed.add(server)

    def end(self) -> None:
        for pair in sorted(self.delayed):
            self.faults.delay(pair, 0)
        self.delayed.clear()
        for side, other in self.cut:
            self.faults.heal(side, other)
        self.cut.clear()
        for server in sorted(self.crashed):
            self.faults.restart(server)
        self.crashed.clear()
