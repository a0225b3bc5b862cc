"""The floor of ``bench mq``: the same bytes through three processes on 127.0.0.1 with
nothing but blocking sockets and the file.

A producer streams ``count`` records of ``size`` + 36 bytes (a record header's worth
more per message), :func:`~rdvpump.bench.mq.batch_for` records per ``sendall``, with no
framing and no replies; a server appends what each ``recv_into`` brings to a file
(fsynced after each under ``sync``, every second otherwise, as the plain append) and
forwards it to a consumer, which reads until it has every byte.  No parsing, no
checksums, no acknowledgements: what three processes and two TCP hops leave of the
plain append, the least an MQ server between two clients can cost here.  Its sockets
have the congestion control an MQ's links on one host have (:data:`rdv.LOCAL_CONGESTION`,
set before they connect), so that the floor and the MQ pay the same kernel.

``python -m rdvpump.bench._relay ROLE ...``: one side (the parent is :func:`relay_floor`).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from rdv import local_congestion

#: Seconds any side waits for the others.
TIMEOUT = 60.0
#: A record header's worth of bytes more per message, as the plain append writes.
HEADER = 36


def _dial(port: int) -> socket.socket:
    sock = socket.socket()
    try:
        local_congestion(sock)
        sock.settimeout(TIMEOUT)
        sock.connect(("127.0.0.1", port))
    except BaseException:
        sock.close()
        raise
    return sock


def _producer(port: int, size: int, count: int, batch: int) -> None:
    record = size + HEADER
    with _dial(port) as sock:
        chunk = b"x" * (record * batch)
        print(time.time(), flush=True)
        sent = 0
        while sent < count:
            n = min(batch, count - sent)
            sock.sendall(chunk if n == batch else chunk[:n * record])
            sent += n
        sock.shutdown(socket.SHUT_WR)
        sock.recv(1)  # the server's close: everything was taken


def _consumer(port: int, size: int, count: int) -> None:
    with _dial(port) as sock:
        buf = bytearray(1 << 20)
        got, total = 0, (size + HEADER) * count
        while got < total:
            n = sock.recv_into(buf)
            if not n:
                raise SystemExit(f"the server closed after {got} of {total} bytes")
            got += n
        print(time.time(), flush=True)


def _server(path: str, durability: str) -> None:
    listeners = []
    for _ in range(2):
        listener = socket.socket()
        local_congestion(listener)
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
    at, last_sync = 0, time.perf_counter()
    try:
        while n := inp.recv_into(buf):
            os.pwrite(fd, view[:n], at)
            at += n
            now = time.perf_counter()
            if durability == "sync" or now - last_sync >= 1.0:
                os.fsync(fd)
                last_sync = now
            out.sendall(view[:n])
        os.fsync(fd)
    finally:
        os.close(fd)
        out.close()
        inp.close()
        for listener in listeners:
            listener.close()


def relay_floor(size: int, count: int, durability: str, batch: int, tmp: Path) -> float:
    """Messages per second through the three processes (the module says how)."""
    from .._errors import RunError  # here: the children start without trio's import

    me = [sys.executable, "-m", "rdvpump.bench._relay"]
    shape = [str(size), str(count)]
    procs: list[tuple[str, subprocess.Popen[str]]] = []
    path = tmp / f"relay-{size}"
    try:
        server = subprocess.Popen([*me, "server", str(path), durability],
                                  stdout=subprocess.PIPE, text=True)
        procs.append(("server", server))
        assert server.stdout is not None
        ports = server.stdout.readline().split()
        if len(ports) != 2:
            raise RunError("the relay floor's server did not start")
        consumer = subprocess.Popen([*me, "consumer", ports[1], *shape],
                                    stdout=subprocess.PIPE, text=True)
        procs.append(("consumer", consumer))
        producer = subprocess.Popen([*me, "producer", ports[0], *shape, str(batch)],
                                    stdout=subprocess.PIPE, text=True)
        procs.append(("producer", producer))
        assert producer.stdout is not None and consumer.stdout is not None
        start, end = producer.stdout.readline(), consumer.stdout.readline()
        for role, proc in procs:
            if proc.wait(timeout=TIMEOUT):
                raise RunError(f"the relay floor's {role} failed with exit {proc.returncode}")
        return count / (float(end) - float(start))
    finally:
        reap(procs)
        path.unlink(missing_ok=True)


def reap(procs: list[tuple[str, subprocess.Popen[str]]]) -> None:
    """Kill what is still running of a floor's ``(role, process)`` pairs, wait for each,
    and close its stdout (the floor scripts in ``bench/`` share it)."""
    for _, proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=TIMEOUT)
        if proc.stdout is not None:
            proc.stdout.close()


def main(args: list[str]) -> None:
    role = args[0]
    if role == "producer":
        _producer(int(args[1]), int(args[2]), int(args[3]), int(args[4]))
    elif role == "consumer":
        _consumer(int(args[1]), int(args[2]), int(args[3]))
    elif role == "server":
        _server(args[1], args[2])
    else:
        raise SystemExit(f"unknown relay role {role!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
