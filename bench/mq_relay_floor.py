"""The floor of `bench mq` at 64 KiB `sync`: the same bytes through three processes on
127.0.0.1 with nothing but blocking sockets, beside the plain append.

A producer streams 4,000 records of 64 KiB + 36 B (no framing, no replies); a server
appends what each ``recv_into`` brings to a file, fsyncs it and forwards it to a
consumer, which reads until it has every byte.  Its rate against the plain append of
``rdvpump bench mq`` (:func:`rdvpump.bench.mq.plain_append`: 256 KiB writes, each
fsynced) in the same run says how much of the plain append three processes and two
TCP hops leave.

``python bench/mq_relay_floor.py [RUNS]``: one line per run.  Figures in bench/RESULTS.md.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rdvpump.bench.mq import batch_for, plain_append

SIZE, COUNT = 65536, 4000
BATCH = batch_for(SIZE)  # what the bench's producer sends at once
RECORD = SIZE + 36  # a record header's worth more per message, as the plain append
TIMEOUT = 60.0


def producer(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as sock:
        chunk = b"x" * (RECORD * BATCH)
        print(time.time(), flush=True)
        for _ in range(COUNT // BATCH):
            sock.sendall(chunk)
        sock.shutdown(socket.SHUT_WR)
        sock.recv(1)  # the server's close: everything was taken


def consumer(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as sock:
        buf = bytearray(1 << 20)
        got, total = 0, RECORD * COUNT
        while got < total:
            n = sock.recv_into(buf)
            if not n:
                raise SystemExit(f"the server closed after {got} of {total} bytes")
            got += n
        print(time.time(), flush=True)


def server(path: str) -> None:
    listeners = []
    for _ in range(2):
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(TIMEOUT)
        listeners.append(listener)
    print(*(s.getsockname()[1] for s in listeners), flush=True)
    out, _ = listeners[1].accept()
    inp, _ = listeners[0].accept()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    at = 0
    try:
        while n := inp.recv_into(buf):
            os.pwrite(fd, view[:n], at)
            at += n
            os.fsync(fd)
            out.sendall(view[:n])
    finally:
        os.close(fd)
        out.close()
        inp.close()


def one_run(directory: str) -> tuple[float, float]:
    me = [sys.executable, __file__]
    procs: list[tuple[str, subprocess.Popen[str]]] = []
    try:
        srv = subprocess.Popen([*me, "server", f"{directory}/relay"], stdout=subprocess.PIPE,
                               text=True)
        procs.append(("server", srv))
        assert srv.stdout is not None
        in_port, out_port = srv.stdout.readline().split()
        con = subprocess.Popen([*me, "consumer", out_port], stdout=subprocess.PIPE, text=True)
        procs.append(("consumer", con))
        pro = subprocess.Popen([*me, "producer", in_port], stdout=subprocess.PIPE, text=True)
        procs.append(("producer", pro))
        assert pro.stdout is not None and con.stdout is not None
        start, end = float(pro.stdout.readline()), float(con.stdout.readline())
        for role, p in procs:
            if p.wait(timeout=TIMEOUT):
                raise SystemExit(f"the {role} failed with exit {p.returncode}")
    finally:
        for _, p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=TIMEOUT)
            if p.stdout is not None:
                p.stdout.close()
    return COUNT / (end - start), plain_append(SIZE, COUNT, "sync", Path(directory))


def main() -> None:
    role = sys.argv[1] if len(sys.argv) > 1 else ""
    if role == "producer":
        producer(int(sys.argv[2]))
    elif role == "consumer":
        consumer(int(sys.argv[2]))
    elif role == "server":
        server(sys.argv[2])
    else:
        runs = int(role) if role else 3
        with tempfile.TemporaryDirectory(prefix="rdvpump-relay-floor-") as directory:
            for _ in range(runs):
                relay, append = one_run(directory)
                print(f"raw relay {relay:,.0f} msgs/s, plain append {append:,.0f} msgs/s, "
                      f"ratio {relay / append:.2f}")


if __name__ == "__main__":
    main()
