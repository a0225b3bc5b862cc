"""The nemesis's user-space switch: frames between hosts' veths, with latency, jitter,
loss and duplication drawn from a seed, where the kernel has no ``sch_netem``.

Run inside the network's switch namespace by :class:`rdvpump.nemesis.Network`::

    python -m rdvpump._switch --ports port0,port1 --delay 0.05 --jitter 0.02 --loss 0.02

Each port is read through a raw ``AF_PACKET`` socket; a frame's source address teaches
the switch its port, and a frame goes to its destination's port (to every other port
while that is unknown, or for broadcast).  Each frame is dropped with probability
``loss``, sent twice with probability ``duplicate``, and sent after ``delay`` plus a
uniform draw in ``[-jitter, jitter]`` (frames of one flow may so overtake each other,
as under netem's jitter).  Settings change at run time: a line ``delay jitter loss
duplicate`` on stdin replaces them.  SIGTERM ends it.
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import random
import selectors
import socket
import sys
import time

ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4
MAX_FRAME = 65536 + 64


class Switch:
    def __init__(self, ports: list[str], *, delay: float, jitter: float, loss: float,
                 duplicate: float, seed: int) -> None:
        self.rng = random.Random(seed)
        self.delay, self.jitter, self.loss, self.duplicate = delay, jitter, loss, duplicate
        self.sockets: dict[str, socket.socket] = {}
        for port in ports:
            s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
            s.bind((port, 0))
            s.setblocking(False)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
            self.sockets[port] = s
        self.where: dict[bytes, str] = {}
        self.due: list[tuple[float, int, str, bytes]] = []
        self.seq = 0

    def settings(self, line: str) -> None:
        delay, jitter, loss, duplicate = (float(x) for x in line.split())
        self.delay, self.jitter, self.loss, self.duplicate = delay, jitter, loss, duplicate

    def arrived(self, port: str) -> None:
        s = self.sockets[port]
        while True:
            try:
                frame, address = s.recvfrom(MAX_FRAME)
            except BlockingIOError:
                return
            if address[2] == PACKET_OUTGOING:
                continue  # what this switch sent out of the port
            self.where[frame[6:12]] = port
            to = self.where.get(frame[0:6])
            targets = [to] if to is not None and frame[0] & 1 == 0 else [
                p for p in self.sockets if p != port]
            if self.loss and self.rng.random() < self.loss:
                continue
            copies = 2 if self.duplicate and self.rng.random() < self.duplicate else 1
            now = time.monotonic()
            for _ in range(copies):
                wait = max(0.0, self.delay + self.rng.uniform(-self.jitter, self.jitter))
                for target in targets:
                    if target != port:
                        self.seq += 1
                        heapq.heappush(self.due, (now + wait, self.seq, target, frame))

    def send_due(self) -> float | None:
        """Send what is due; the seconds until the next (None: nothing waits)."""
        now = time.monotonic()
        while self.due and self.due[0][0] <= now:
            _, _, port, frame = heapq.heappop(self.due)
            with contextlib.suppress(OSError):  # a port gone: lost, as on a wire
                self.sockets[port].send(frame)
        return None if not self.due else max(0.0, self.due[0][0] - now)

    def run(self) -> None:
        selector = selectors.DefaultSelector()
        for port, s in self.sockets.items():
            selector.register(s, selectors.EVENT_READ, port)
        with contextlib.suppress(PermissionError, ValueError):  # settings, from a pipe
            selector.register(sys.stdin, selectors.EVENT_READ, None)
        while True:
            for key, _ in selector.select(self.send_due()):
                if key.data is None:
                    line = sys.stdin.readline()
                    if not line:
                        selector.unregister(sys.stdin)
                    elif line.strip():
                        self.settings(line)
                else:
                    self.arrived(key.data)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ports", required=True)
    for name in ("delay", "jitter", "loss", "duplicate"):
        parser.add_argument(f"--{name}", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    switch = Switch(args.ports.split(","), delay=args.delay, jitter=args.jitter,
                    loss=args.loss, duplicate=args.duplicate, seed=args.seed)
    print("ready", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        switch.run()


if __name__ == "__main__":
    main()
