"""A broker process under abuse by peers that hold the token, over real TCP on 127.0.0.1:
links that declare huge frames and stall do not grow its memory by what they declare."""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import socket
import subprocess
import sys

import pytest

from rdv import Address, Hello
from tests.ports import free_port

from .procs import finish, read_until

pytestmark = pytest.mark.slow  # real processes

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
        print(f"100 stalled 16 MiB frames: RSS grew by {grown / MiB:.2f} MiB")
        assert grown <= 64 * MiB, f"RSS grew by {grown / MiB:.1f} MiB"
        for sock in links:
            sock.close()
        links.clear()
        echo_round_trip(where, "closed")
        # what the stallers made the broker hold goes with them (an absolute bound: the
        # process's own size at start says nothing of what 100 links may keep)
        left = rss(proc.pid) - start
        assert left <= 8 * MiB, f"{left / MiB:.1f} MiB kept after the links closed"
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

    from brokermgr import BrokerManager, NameService
    from channels import CloseCause

    outcomes = []
    for run in range(20):
        u = BrokerManager("abuse", token=TOKEN)
        service = NameService(u)  # the process is ready once registered here
        async with trio.open_nursery() as nursery:
            await nursery.start(u.pump.serve)
            here = await nursery.start(u.serve_network, "127.0.0.1", 0)
            proc = subprocess.Popen(
                [sys.executable, "-m", "rdvpump", "broker", "run", "--universe", "abuse",
                 "--id", f"b{run}", "--manager", str(here), "--listen", "127.0.0.1:0",
                 "--echo", "80"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                env={**os.environ, "RDVPUMP_TOKEN": TOKEN})
            try:
                ready = await trio.to_thread.run_sync(read_until, proc, proc.stdout, b"\n")
                u.directory[f"b{run}"] = Address.parse(ready.decode().split()[-1])
                queue = await u.add_broker(f"me{run}").connect_queue(f"b{run}", 80)
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
                await service.aclose()
                nursery.cancel_scope.cancel()
            finally:
                proc.kill()
                finish(proc, timeout=30)
    assert outcomes == [f"broken, {CloseCause.LOST}"] * 20


def _flood(where: tuple[str, int], silent: int, garbage: int) -> list[socket.socket]:
    """Connections held open: ``silent`` that send nothing, ``garbage`` that send bytes that
    are no handshake (half an HTTP request: an impossible length; or a frame cut short)."""
    held = []
    for n in range(silent + garbage):
        sock = socket.socket()
        sock.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            sock.connect(where)  # completes in the kernel: the server accepts it
        held.append(sock)
        if n >= silent:
            junk = b"GET / HTTP/1.1\r\n" if n % 2 else b"\x00\x00\x01\x00{\"rdvp"
            with contextlib.suppress(OSError):
                sock.send(junk)
    return held


async def test_a_flood_of_silent_and_garbage_connections_locks_out_no_one() -> None:
    """1,000 silent and 1,000 garbage connections held open, half against a manager and
    half against a broker process: a broker still registers, and a link still connects
    and answers, each within 1 s; both processes stay within 64 MiB of their start and
    write a few log lines, not one per connection."""
    import resource
    import time

    import trio

    from brokermgr import BrokerManager, NameClient

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2500:
        pytest.skip(f"2,000 sockets need more than the {hard} files this process may open")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2500) if hard == resource.RLIM_INFINITY
                                                else min(hard, max(soft, 2500)), hard))
    env = {**os.environ, "RDVPUMP_TOKEN": TOKEN}
    port = free_port()
    manager = subprocess.Popen(
        [sys.executable, "-m", "rdvpump", "manager", "serve", "--universe", "abuse",
         "--listen", f"127.0.0.1:{port}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=env)
    broker = subprocess.Popen(
        [sys.executable, "-m", "rdvpump", "broker", "run", "--universe", "abuse", "--id", "b",
         "--manager", f"127.0.0.1:{port}", "--listen", "127.0.0.1:0", "--echo", "80"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    held: list[socket.socket] = []
    try:
        read_until(manager, manager.stdout, b"ready")
        where = Address.parse(read_until(broker, broker.stdout, b"\n").decode().split()[-1])
        echo_round_trip(where, "warm-up")
        start = {p.pid: rss(p.pid) for p in (manager, broker)}
        held += _flood(("127.0.0.1", port), 500, 500)
        held += _flood(where, 500, 500)
        echo_round_trip(where, "flooded")  # both have seen the flood by now
        u = BrokerManager("abuse", token=TOKEN)
        async with trio.open_nursery() as nursery:
            await nursery.start(u.pump.serve)
            await nursery.start(u.serve_network, "127.0.0.1", 0)
            me = u.add_broker("legit")
            began = time.monotonic()
            names = NameClient(u, [Address("127.0.0.1", port)], retry=0.05)
            names.start()
            with trio.fail_after(10):
                while "legit" not in {b["id"] for b in (await names.list() or [])}:
                    await trio.sleep(0.01)
            registered = time.monotonic() - began
            began = time.monotonic()
            with trio.fail_after(10):
                queue = await me.connect_queue("b", 80)  # found through the manager
                await queue.send(b"hello")
                assert await queue.receive() == b"hello"
            linked = time.monotonic() - began
            await queue.aclose()
            names.close()
            nursery.cancel_scope.cancel()
        grown = {pid: (rss(pid) - before) / MiB for pid, before in start.items()}
    finally:
        for sock in held:
            sock.close()
        logs = []
        for proc in (broker, manager):
            proc.send_signal(signal.SIGINT)
            logs.append(finish(proc, timeout=30)[1].decode())
    print(f"registered in {registered:.3f} s, linked in {linked:.3f} s, RSS grew "
          f"{grown} MiB, log lines {[len(log.splitlines()) for log in logs]}")
    assert registered < 1.0 and linked < 1.0
    assert all(g < 64 for g in grown.values()), grown
    for log in logs:
        assert len(log.splitlines()) < 20, log[-3000:]
        assert "tls" not in log.lower()


def test_garbage_of_every_declared_length_from_one_host_is_a_few_log_lines() -> None:
    """400 connections from one host, each declaring a handshake frame of a different,
    random, impossible length: the manager and the broker each log a few lines for
    them (a warning's kind is its cause, not its text with the length in it), and
    both still serve."""
    import random

    rng = random.Random(32)
    env = {**os.environ, "RDVPUMP_TOKEN": TOKEN}
    port = free_port()
    manager = subprocess.Popen(
        [sys.executable, "-m", "rdvpump", "manager", "serve", "--universe", "abuse",
         "--listen", f"127.0.0.1:{port}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=env)
    broker = subprocess.Popen(
        [sys.executable, "-m", "rdvpump", "broker", "run", "--universe", "abuse", "--id", "b",
         "--manager", f"127.0.0.1:{port}", "--listen", "127.0.0.1:0", "--echo", "80"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        read_until(manager, manager.stdout, b"ready")
        where = Address.parse(read_until(broker, broker.stdout, b"\n").decode().split()[-1])
        for target in (("127.0.0.1", port), (where.host, where.port)):
            for _ in range(200):
                with socket.create_connection(target, timeout=5) as sock:
                    sock.sendall(rng.randrange(4097, 1 << 32).to_bytes(4, "big"))
                    sock.settimeout(5)
                    with contextlib.suppress(OSError):
                        while sock.recv(4096):  # until the server closes it
                            pass
        echo_round_trip(where, "after the garbage")
    finally:
        logs = []
        for proc in (broker, manager):
            proc.send_signal(signal.SIGINT)
            logs.append(finish(proc, timeout=30)[1].decode())
    for log in logs:
        lines = [line for line in log.splitlines() if "exceeds 4096" in line]
        assert 1 <= len(lines) <= 3, log[-3000:]
        assert len(log.splitlines()) < 12, log[-3000:]
