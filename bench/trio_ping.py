"""Ping-pong of 68 B over 127.0.0.1 with both processes on core 0: plain trio and
blocking sockets, as the floor for a same-core round trip.

``python bench/trio_ping.py CLIENT SERVER [PINGS]``, CLIENT ``trio`` or ``block``,
SERVER ``trio`` or ``block``: the median round trip.  Figures in bench/RESULTS.md.
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import time

import trio

MSG = b"p" * 68


def _nodelay(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def serve(kind: str) -> None:
    """The echo side, in a child process: prints its port, echoes until EOF."""
    if kind == "block":
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        print("ready", listener.getsockname()[1], flush=True)
        conn, _ = listener.accept()
        _nodelay(conn)
        while data := conn.recv(65536):
            conn.sendall(data)
        return

    async def main() -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        print("ready", listeners[0].socket.getsockname()[1], flush=True)
        stream = await listeners[0].accept()
        while data := await stream.receive_some(65536):
            await stream.send_all(data)

    trio.run(main)


def ping(kind: str, port: int, pings: int) -> list[float]:
    if kind == "block":
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        _nodelay(sock)
        rtts = []
        with sock:
            for _ in range(pings):
                t0 = time.perf_counter()
                sock.sendall(MSG)
                sock.recv(65536)
                rtts.append(time.perf_counter() - t0)
        return rtts

    async def main() -> list[float]:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        rtts = []
        async with stream:
            for _ in range(pings):
                t0 = time.perf_counter()
                await stream.send_all(MSG)
                await stream.receive_some(65536)
                rtts.append(time.perf_counter() - t0)
        return rtts

    return trio.run(main)


def main() -> None:
    if sys.argv[1] == "--serve":
        os.sched_setaffinity(0, {0})
        serve(sys.argv[2])
        return
    client, server = sys.argv[1], sys.argv[2]
    pings = int(sys.argv[3]) if len(sys.argv) > 3 else 20_000
    os.sched_setaffinity(0, {0})
    child = subprocess.Popen([sys.executable, __file__, "--serve", server],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline().split()[1])
        rtts = ping(client, port, pings)
    finally:
        child.kill()
        child.wait(timeout=10)
    print(f"{client} -> {server}: median {statistics.median(rtts) * 1e6:.1f} us")


if __name__ == "__main__":
    main()
