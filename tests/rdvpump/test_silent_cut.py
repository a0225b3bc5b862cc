"""A host cut off without a reset, on real network namespaces: a manager on one host, a
broker on another, joined by a veth pair; the broker's host then drops every frame (a
``tc`` filter redirects them to a device that goes nowhere), so no FIN or RST ever
reaches the manager.  Its connection to the broker still closes within seconds
(keepalive and ``TCP_USER_TIMEOUT`` on links), not at the name service's expiry.

Needs root and iproute2; skipped, with the reason, where they are missing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest
import trio

from tests.rdvpump.procs import reap

pytestmark = pytest.mark.slow


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


def _can_make_namespaces() -> str | None:
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "needs iproute2 (ip and tc)"
    if os.geteuid() != 0:
        return "needs root for network namespaces"
    name = f"rdvprobe{uuid.uuid4().hex[:6]}"
    try:
        ip("netns", "add", name)
    except subprocess.CalledProcessError as exc:
        return f"cannot make a network namespace: {exc.stderr.decode().strip()}"
    ip("netns", "del", name)
    return None


@pytest.fixture
def two_hosts() -> Iterator[tuple[str, str]]:
    """Namespaces ``a`` (10.77.0.1) and ``b`` (10.77.0.2) on one veth pair; in ``b``, a
    second veth whose peer is down: where a cut sends frames to vanish."""
    why = _can_make_namespaces()
    if why is not None:
        pytest.skip(why)
    tag = uuid.uuid4().hex[:6]
    a, b = f"rdva{tag}", f"rdvb{tag}"
    ip("netns", "add", a)
    ip("netns", "add", b)
    try:
        ip("link", "add", f"va{tag}", "netns", a, "type", "veth", "peer", "name", f"vb{tag}",
           "netns", b)
        for ns, dev, addr in ((a, f"va{tag}", "10.77.0.1/24"), (b, f"vb{tag}", "10.77.0.2/24")):
            ip("-n", ns, "link", "set", "lo", "up")
            ip("-n", ns, "addr", "add", addr, "dev", dev)
            ip("-n", ns, "link", "set", dev, "up")
        ip("-n", b, "link", "add", "hole", "type", "veth", "peer", "name", "hole-peer")
        ip("-n", b, "link", "set", "hole", "up")  # its peer stays down: frames vanish
        yield a, b
    finally:
        for ns in (a, b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)


def cut(ns: str, dev: str) -> None:
    """Every frame out of and into ``dev`` of ``ns`` goes to the hole: silence, no reset."""
    subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "clsact"],
                   check=True, capture_output=True, timeout=10)
    for direction in ("ingress", "egress"):
        subprocess.run(["ip", "netns", "exec", ns, "tc", "filter", "add", "dev", dev,
                        direction, "protocol", "all", "u32", "match", "u32", "0", "0",
                        "action", "mirred", "egress", "redirect", "dev", "hole"],
                       check=True, capture_output=True, timeout=10)


async def test_a_broker_cut_off_silently_is_dropped_by_the_manager_in_seconds(
        two_hosts: tuple[str, str]) -> None:
    a, b = two_hosts
    env = {**os.environ, "RDVPUMP_TOKEN": "tok"}
    rdvpump = [sys.executable, "-m", "rdvpump"]
    manager = await trio.lowlevel.open_process(
        ["ip", "netns", "exec", a, *rdvpump, "manager", "serve", "--universe", "k",
         "--listen", "10.77.0.1:9876", "--expiry", "120"], env=env,
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    broker = None
    try:
        assert manager.stdout is not None
        with trio.fail_after(30):
            assert b"ready" in await manager.stdout.receive_some(4096)
        broker = await trio.lowlevel.open_process(
            ["ip", "netns", "exec", b, *rdvpump, "broker", "run", "--universe", "k",
             "--id", "far", "--manager", "10.77.0.1:9876", "--listen", "10.77.0.2:0"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert broker.stdout is not None
        with trio.fail_after(30):
            assert b"ready" in await broker.stdout.receive_some(4096)

        async def known() -> bool:
            shown = await trio.run_process(
                ["ip", "netns", "exec", a, *rdvpump, "status", "--universe", "k",
                 "--manager", "10.77.0.1:9876", "--timeout", "5"], capture_stdout=True,
                env={**env, "COLUMNS": "200"})
            return " far " in shown.stdout.decode()

        assert await known()
        cut(b, f"vb{a[4:]}")
        cut_at = trio.current_time()
        with trio.fail_after(30):
            while await known():
                await trio.sleep(0.5)  # polled: the manager's table, bounded
        # the name service's expiry is 120 s: the connection itself closed
        assert trio.current_time() - cut_at < 15
    finally:
        for proc in (broker, manager):
            if proc is not None:
                await reap(proc)
