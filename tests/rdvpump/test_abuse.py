"""A broker process under abuse by peers that hold the token, over real TCP on 127.0.0.1:
links that declare huge frames and stall do not grow its memory by what they declare."""

from __future__ import annotations

import os
import pathlib
import signal
import socket
import subprocess
import sys

from rdv import Address, Hello

from .procs import finish, read_until

TOKEN = "tok"
MiB = 1 << 20


def rss(pid: int) -> int:
    """Resident set size of ``pid`` in bytes (Linux)."""
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    got = b""
    while len(got) < n:
        chunk = sock.recv(n - len(got))
        assert chunk, f"connection closed after {len(got)} of {n} bytes"
        got += chunk
    return got


def open_link(where: tuple[str, int], src: str) -> socket.socket:
    """A raw link to the echo port of broker ``b``: the handshake, done by hand."""
    sock = socket.create_connection(where, timeout=30)
    sock.sendall(Hello("abuse", TOKEN, src, "b", 80).encode())
    length = int.from_bytes(recv_exactly(sock, 4), "big")
    reply = recv_exactly(sock, length)
    assert b'"accepted":true' in reply, reply
    return sock


def echo_round_trip(where: tuple[str, int], src: str) -> None:
    with open_link(where, src) as sock:
        sock.sendall((4).to_bytes(4, "big") + b"ping")
        assert recv_exactly(sock, 8) == (4).to_bytes(4, "big") + b"ping"


def test_links_that_declare_16_mib_and_stall_do_not_grow_the_broker_by_it() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "rdvpump", "broker", "run", "--universe", "abuse", "--id", "b",
         "--manager", "127.0.0.1:1", "--listen", "127.0.0.1:0", "--echo", "80"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        env={**os.environ, "RDVPUMP_TOKEN": TOKEN})
    links: list[socket.socket] = []
    try:
        ready = read_until(proc, proc.stdout, b"\n").decode().split()
        where = Address.parse(ready[-1])
        echo_round_trip(where, "warm-up")
        start = rss(proc.pid)
        for i in range(100):
            sock = open_link(where, f"staller{i}")
            sock.sendall((16 * MiB).to_bytes(4, "big") + b"x" * 4096)  # then nothing more
            links.append(sock)
        echo_round_trip(where, "after")  # the broker has read what the stallers sent
        grown = rss(proc.pid) - start
        assert grown <= 64 * MiB, f"RSS grew by {grown / MiB:.1f} MiB"
        for sock in links:
            sock.close()
        links.clear()
        echo_round_trip(where, "closed")
        assert rss(proc.pid) <= start * 1.10
    finally:
        for sock in links:
            sock.close()
        proc.send_signal(signal.SIGINT)
        finish(proc, timeout=30)
    assert proc.returncode == 0


async def test_a_sigkilled_peer_breaks_the_link_and_never_looks_like_a_clean_close() -> None:
    """20 runs: a broker process with an open link to this one is SIGKILLed; the async face
    here raises BrokenResourceError (CloseCause.LOST), never EndOfChannel."""
    import trio

    from brokermgr import BrokerManager
    from channels import CloseCause

    outcomes = []
    for run in range(20):
        proc = subprocess.Popen(
            [sys.executable, "-m", "rdvpump", "broker", "run", "--universe", "abuse", "--id",
             "b", "--manager", "127.0.0.1:1", "--listen", "127.0.0.1:0", "--echo", "80"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            env={**os.environ, "RDVPUMP_TOKEN": TOKEN})
        try:
            where = Address.parse(read_until(proc, proc.stdout, b"\n").decode().split()[-1])
            u = BrokerManager("abuse", token=TOKEN)
            u.directory["b"] = where
            async with trio.open_nursery() as nursery:
                await nursery.start(u.pump.serve)
                await nursery.start(u.serve_network, "127.0.0.1", 0)
                queue = await u.add_broker(f"me{run}").connect_queue("b", 80)
                await queue.send(b"ping")
                assert await queue.receive() == b"ping"
                proc.kill()
                with trio.fail_after(10):
                    try:
                        await queue.receive()
                        outcomes.append("a message")
                    except trio.EndOfChannel:
                        outcomes.append("EndOfChannel")
                    except trio.BrokenResourceError:
                        outcomes.append(f"broken, {queue.close_cause}")
                nursery.cancel_scope.cancel()
        finally:
            proc.kill()
            finish(proc, timeout=30)
    assert outcomes == [f"broken, {CloseCause.LOST}"] * 20
