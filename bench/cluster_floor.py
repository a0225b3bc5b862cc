"""The floor of `bench cluster`'s external switching rate: the same bytes through the same
processes on 127.0.0.1 with nothing but blocking sockets.

A faucet streams messages of 1,000 B to a root in batches of 100, as the bench's faucet
publishes them (no framing, no replies); the root appends what each ``recv_into``
brings to a file (fsynced once a second, as ``interval:1``) and sends it to each of B
fanout servers; each fanout server sends it to each of its Q clients; the Q clients of
one fanout server are one process, as in the bench, reading their sockets until each
has every byte.  No message is looked at: no per-message work, no acknowledgement.  A
delivery is one message reaching one client; the rate is deliveries per second from the
faucet's first send to the last client's last byte.  It says how much of OpenAMQ's
480 K deliveries/s for B = Q = 4 the processes, the kernel's copies and two TCP hops
leave on this machine, whatever the server does per message.

``python bench/cluster_floor.py [RUNS] [MESSAGES]``: one line per run (B = 3, Q = 4, as
`rdvpump bench cluster`'s first case).  Figures in bench/RESULTS.md.
"""

from __future__ import annotations

import os
import selectors
import socket
import subprocess
import sys
import tempfile
import time

from rdvpump.bench._relay import reap

B, Q = 3, 4
SIZE, BATCH = 1000, 100
TIMEOUT = 120.0


def _listen() -> socket.socket:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(TIMEOUT)
    return listener


def faucet(port: int, messages: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as sock:
        chunk = b"x" * (SIZE * BATCH)
        print(time.time(), flush=True)
        for _ in range(messages // BATCH):
            sock.sendall(chunk)
        sock.shutdown(socket.SHUT_WR)
        sock.recv(1)  # the root's close: everything was taken


def root(path: str) -> None:
    fanouts, taps = _listen(), _listen()
    print(fanouts.getsockname()[1], taps.getsockname()[1], flush=True)
    outs = [fanouts.accept()[0] for _ in range(B)]
    inp, _ = taps.accept()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    synced = time.monotonic()
    try:
        while n := inp.recv_into(buf):
            os.write(fd, view[:n])
            if time.monotonic() - synced >= 1.0:
                os.fsync(fd)
                synced = time.monotonic()
            for out in outs:
                out.sendall(view[:n])
        os.fsync(fd)
    finally:
        os.close(fd)
        for out in outs:
            out.close()
        inp.close()


def fanout(root_port: int) -> None:
    listener = _listen()
    print(listener.getsockname()[1], flush=True)
    outs = [listener.accept()[0] for _ in range(Q)]
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    with socket.create_connection(("127.0.0.1", root_port), timeout=TIMEOUT) as inp:
        try:
            while n := inp.recv_into(buf):
                for out in outs:
                    out.sendall(view[:n])
        finally:
            for out in outs:
                out.close()


def clients(port: int, messages: int) -> None:
    total = SIZE * (messages // BATCH * BATCH)
    socks = [socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
             for _ in range(Q)]
    got = dict.fromkeys(socks, 0)
    buf = bytearray(1 << 20)
    with selectors.DefaultSelector() as sel:
        for sock in socks:
            sel.register(sock, selectors.EVENT_READ)
        deadline = time.monotonic() + TIMEOUT
        while sel.get_map():
            if time.monotonic() > deadline:
                raise SystemExit("the clients timed out")
            for key, _ in sel.select(timeout=1.0):
                ready = key.fileobj
                assert isinstance(ready, socket.socket)
                n = ready.recv_into(buf)
                got[ready] += n
                if not n or got[ready] >= total:
                    sel.unregister(ready)
    short = [n for n in got.values() if n != total]
    if short:
        raise SystemExit(f"a client got {short[0]} of {total} bytes")
    print(time.time(), flush=True)
    for sock in socks:
        sock.close()


def one_run(directory: str, messages: int) -> float:
    me = [sys.executable, __file__]
    procs: list[tuple[str, subprocess.Popen[str]]] = []

    def start(role: str, *args: object) -> subprocess.Popen[str]:
        proc = subprocess.Popen([*me, role, *map(str, args)], stdout=subprocess.PIPE,
                                text=True)
        procs.append((role, proc))
        return proc

    def line(proc: subprocess.Popen[str]) -> str:
        assert proc.stdout is not None
        return proc.stdout.readline()

    try:
        fanout_port, tap_port = line(start("root", f"{directory}/root")).split()
        ends = []
        for _ in range(B):
            port = line(start("fanout", fanout_port)).strip()
            ends.append(start("clients", port, messages))
        began = float(line(start("faucet", tap_port, messages)))
        end = max(float(line(proc)) for proc in ends)
        for role, proc in procs:
            if proc.wait(timeout=TIMEOUT):
                raise SystemExit(f"the {role} process failed with exit {proc.returncode}")
    finally:
        reap(procs)
    return (messages // BATCH * BATCH) * B * Q / (end - began)


def main() -> None:
    role = sys.argv[1] if len(sys.argv) > 1 else ""
    if role == "faucet":
        faucet(int(sys.argv[2]), int(sys.argv[3]))
    elif role == "root":
        root(sys.argv[2])
    elif role == "fanout":
        fanout(int(sys.argv[2]))
    elif role == "clients":
        clients(int(sys.argv[2]), int(sys.argv[3]))
    else:
        runs = int(role) if role else 3
        messages = int(sys.argv[2]) if len(sys.argv) > 2 else 100_000
        with tempfile.TemporaryDirectory(prefix="rdvpump-cluster-floor-") as directory:
            for _ in range(runs):
                rate = one_run(directory, messages)
                print(f"raw cluster B = {B}, Q = {Q}: {rate:,.0f} deliveries/s "
                      f"({rate / 480_000:.2f}x OpenAMQ's 480 K)", flush=True)


if __name__ == "__main__":
    main()
