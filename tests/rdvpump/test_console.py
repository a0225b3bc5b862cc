"""``rdvpump console`` over real processes: the page, and the snapshots its event stream
carries as a universe changes (a broker listed, an MQ group's lag going down as it
consumes, a link's rate while a workload runs, a killed broker shown as gone); what a
read-only console refuses and what one started with ``--admin`` changes."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, Any

import pytest

from .procs import DEADLINE, finish, read_until

pytestmark = pytest.mark.slow  # real processes

ENV = {**os.environ, "RDVPUMP_TOKEN": "secret", "COLUMNS": "200"}


def start(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "rdvpump", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=ENV)


def rdvpump(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "rdvpump", *args], input=stdin, text=True,
                          capture_output=True, timeout=60, env=ENV)
    assert proc.returncode == 0, proc.stderr
    return proc


def post(url: str, action: str, fields: dict[str, Any], *,
         headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    """The console's answer to an admin request: its HTTP status and its JSON."""
    request = urllib.request.Request(
        f"{url}admin/{action}", data=json.dumps(fields).encode(), method="POST",
        headers={"content-type": "application/json"} if headers is None else headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())


def console_url(proc: subprocess.Popen[bytes]) -> str:
    said = read_until(proc, proc.stderr, b"/\n").decode()
    found = re.search(r"on (http://\S+/)", said)
    assert found is not None, said
    return found.group(1)


def snapshots(stream: IO[bytes]) -> Iterator[dict[str, Any]]:
    """The events of the page's stream, each a snapshot."""
    data = b""
    for line in stream:
        if line.startswith(b"data: "):
            data = line[6:]
        elif line == b"\n" and data:
            yield json.loads(data)
            data = b""


def wait_for(events: Iterator[dict[str, Any]], check: Callable[[dict[str, Any]], bool]
             ) -> dict[str, Any]:
    """The first snapshot ``check`` holds for (within the deadline)."""
    deadline = time.monotonic() + DEADLINE
    for snapshot in events:
        if check(snapshot):
            return snapshot
        assert time.monotonic() < deadline, snapshot
    raise AssertionError("the event stream ended")


@dataclass
class Watched:
    """A universe of real processes watched by a console: the manager's address, MQ
    server s1's, the echo broker e1's process, the console's URL, and every process."""

    where: str
    at: str
    echo: subprocess.Popen[bytes]
    url: str
    procs: list[subprocess.Popen[bytes]]


@contextlib.contextmanager
def watched_universe(tmp_path: pathlib.Path, *, admin: bool = False) -> Iterator[Watched]:
    """A manager (expiry 3 s), MQ server s1 and echo broker e1 serving metrics, and the
    console (``--admin`` if ``admin``); every process reaped after."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        manager = start("manager", "serve", "--universe", "shop", "--listen", "127.0.0.1:0",
                        "--expiry", "3", "--scan", "0.5")
        procs.append(manager)
        where = read_until(manager, manager.stdout, b"\n").decode().split()[-1]
        ready = []
        for broker, role in (("s1", ["--role", "server", "--mq-dir", str(tmp_path / "data")]),
                             ("e1", ["--echo", "80"])):
            procs.append(start("broker", "run", "--universe", "shop", "--id", broker,
                               "--manager", where, "--listen", "127.0.0.1:0", *role,
                               "--metrics", "127.0.0.1:0", "--heartbeat", "0.5"))
            ready.append(read_until(procs[-1], procs[-1].stdout, b"\n").decode().split()[-1])
        console = start("console", "--universe", "shop", "--manager", where,
                        "--listen", "127.0.0.1:0", *(["--admin"] if admin else []))
        procs.append(console)
        yield Watched(where, ready[0], procs[2], console_url(console), procs)
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.terminate()
            finish(proc)


def test_the_console_shows_a_universe_as_it_changes(tmp_path: pathlib.Path) -> None:
    with watched_universe(tmp_path) as universe:
        where, at, echo, url = universe.where, universe.at, universe.echo, universe.url
        with urllib.request.urlopen(url, timeout=10) as page:
            html = page.read().decode()
        assert "<title>rdvpump console</title>" in html and 'EventSource("/events")' in html
        assert "<script src" not in html  # nothing from the network

        mq: Any = ("--server", f"s1@{at}", "--universe", "shop")
        rdvpump("mq", "declare", "orders", *mq)
        # no consumer: an immediate publish is returned, counted, and stores nothing
        returned = subprocess.run(
            [sys.executable, "-m", "rdvpump", "mq", "publish", "orders", *mq, "--immediate",
             "--json", "--batch", "2"], input="a\nb\nc\n", text=True, capture_output=True,
            timeout=60, env=ENV)
        assert returned.returncode == 1
        assert json.loads(returned.stdout)["published"] == 0
        assert json.loads(returned.stdout)["returned"] == 3
        assert returned.stderr.strip() == (
            "error: 3 messages returned, not stored: no consumer of topic orders was there "
            "to take them (--immediate)")
        # read-only: an admin request is refused, and changes nothing
        assert post(url, "declare", {"server": "s1", "topic": "audit"}) == (403, {
            "error": "this console is read-only: start it with --admin to change the "
                     "universe from the page"})
        rdvpump("mq", "publish", "orders", *mq, stdin="".join(f"{i}\n" for i in range(50)))
        with urllib.request.urlopen(url + "events", timeout=30) as stream:
            events = snapshots(stream)
            # the latest snapshot comes first: it may be from before the publish
            first = wait_for(events, lambda s: {b["id"] for b in s["brokers"]} == {"s1", "e1"}
                             and s["groups"] == [{"server": "s1:15555", "topic": "orders",
                                                  "group": "orders", "lag": 50}])
            assert all(b["metrics"] for b in first["brokers"])
            # the universe's own links (each process's heartbeats to the name service)
            # are counted, not listed beside the brokers' links
            assert first["service_links"] >= 2
            assert not any(link["broker"].startswith("@") or link["peer"].startswith("@")
                           for link in first["links"]), first["links"]
            assert [b["health"] for b in first["brokers"]] == ["ok", "ok"]
            assert not first["admin"] and first["actions"] == []
            rdvpump("mq", "consume", "orders", *mq, "--count", "20")
            wait_for(events, lambda s: [g["lag"] for g in s["groups"]] == [30])
            # a workload on a link: its rate rises above zero on the page
            load = subprocess.Popen(
                [sys.executable, "-c", _ECHO_LOAD, where], env=ENV,
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            universe.procs.append(load)
            busy = wait_for(events, lambda s: any(
                link["broker"] == "e1" and link["rate"] > 0 for link in s["links"]))
            assert any(w for w in busy["links"] if w["peer"] == "load")
            load.kill()
            echo.send_signal(signal.SIGKILL)
            echo.wait()
            killed = time.monotonic()
            gone = wait_for(events, lambda s: "e1" not in {b["id"] for b in s["brokers"]})
            # the manager's expiry (3 s) and scan (0.5 s), then a snapshot a second, with
            # room for a loaded machine
            assert time.monotonic() - killed < 3 + 0.5 + 2 + 4
            assert any("broker e1 is gone" in w for w in gone["warnings"])


def test_an_admin_console_changes_the_universe_as_the_cli_does(tmp_path: pathlib.Path
                                                                ) -> None:
    """``console --admin``: the page's requests declare a consume group on an MQ server
    (as ``rdvpump mq declare``) and switch a replicated group's master (as ``rdvpump mq
    failover``), each listed among its actions; a request from another origin, one not
    sent as JSON, one missing a field, and what the universe refuses are each answered
    with the reason, and change nothing."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        manager = start("manager", "serve", "--universe", "ops", "--listen", "127.0.0.1:0")
        procs.append(manager)
        where = read_until(manager, manager.stdout, b"\n").decode().split()[-1]
        for member, broker in enumerate(("g1", "g2")):
            procs.append(start(
                "broker", "run", "--universe", "ops", "--id", broker, "--manager", where,
                "--listen", "127.0.0.1:0", "--role", "server", "--mq-dir",
                str(tmp_path / broker), "--group", "a", "--group-id", str(member),
                "--replication", "sync", "--heartbeat", "0.5", "--metrics", "127.0.0.1:0"))
            read_until(procs[-1], procs[-1].stdout, b"\n")
        console = start("console", "--universe", "ops", "--manager", where, "--listen",
                        "127.0.0.1:0", "--admin")
        procs.append(console)
        url = console_url(console)
        with urllib.request.urlopen(url + "events", timeout=30) as stream:
            events = snapshots(stream)
            wait_for(events, lambda s: s["admin"] and s["replicated"] == [
                {"group": "a", "master": "g1", "members": ["g1", "g2"]}])
            for fields, headers, answer in (
                    ({"server": "g1", "topic": "orders"},
                     {"content-type": "application/json", "origin": "http://example.com"},
                     (403, "an admin request from another origin (http://example.com) "
                           "is refused")),
                    ({"server": "g1", "topic": "orders"},
                     {"content-type": "application/x-www-form-urlencoded"},
                     (415, "an admin request is a JSON object (content-type: "
                           "application/json)")),
                    ({"server": "g1"}, None, (400, "topic is required (a non-empty string)")),
                    ({"server": "g9", "topic": "orders"}, None,
                     (404, "no broker 'g9' is registered in universe 'ops'"))):
                status, said = post(url, "declare", fields, headers=headers)
                assert (status, said["error"]) == answer
            status, said = post(url, "failover", {"group": "b", "to": "g2"})
            assert (status, said["error"]) == (
                409, "group 'b' has no master to switch from (status 404)")

            assert post(url, "declare", {"server": "g1", "topic": "orders", "group": "audit",
                                         "start": "beginning"}) == (
                200, {"said": "g1: declared orders, group audit"})
            wait_for(events, lambda s: ("orders", "audit") in {
                (g["topic"], g["group"]) for g in s["groups"]})
            deadline = time.monotonic() + DEADLINE
            while True:  # the master reports g2 in sync within a heartbeat or two
                status, said = post(url, "failover", {"group": "a", "to": "g2"})
                if status == 200 or "is not in sync" not in said.get("error", ""):
                    break
                assert time.monotonic() < deadline, said
                time.sleep(0.2)
            assert (status, said) == (200, {"said": "group a: g2 is master at epoch 2"})
            done = wait_for(events, lambda s: len(s["actions"]) == 2 and s["replicated"] == [
                {"group": "a", "master": "g2", "members": ["g1", "g2"]}])
            assert [a.split(" ", 1)[1] for a in done["actions"]] == [
                "g1: declared orders, group audit", "group a: g2 is master at epoch 2"]
        status_table = rdvpump("status", "--universe", "ops", "--manager", where).stdout
        assert re.search(r"g2 .* a/1 master@2", status_table), status_table
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.terminate()
            finish(proc)


#: A client broker in a process of its own that echoes through e1 until killed.
_ECHO_LOAD = """
import sys, trio
from brokermgr import open_universe

async def main():
    async with open_universe("shop", token="secret", managers=[sys.argv[1]]) as universe:
        queue = await universe.add_broker("load").connect_queue("e1", 80)
        while True:
            await queue.send(b"x" * 100)
            await queue.receive()

trio.run(main)
"""


def test_a_taken_or_bad_address_is_one_line(tmp_path: pathlib.Path) -> None:
    """The console's and a broker's metrics page: an address in use or not an address is
    one line naming it, and exit 1; so is an admin console on an address off this
    machine's loopback."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for args, said in (
                (["console", "--manager", "127.0.0.1:1", "--listen", f"127.0.0.1:{port}"],
                 f"error: cannot serve on 127.0.0.1:{port}: address already in use"),
                (["broker", "run", "--id", "b1", "--manager", "127.0.0.1:1", "--listen",
                  "127.0.0.1:0", "--metrics", f"127.0.0.1:{port}"],
                 f"error: cannot serve on 127.0.0.1:{port}: address already in use"),
                (["console", "--listen", "127.0.0.1:x"],
                 "error: address '127.0.0.1:x' must be HOST:PORT with a port within "
                 "0..65535"),
                (["console", "--admin", "--listen", "0.0.0.0:0"],
                 "error: --admin serves only on a loopback address (127.0.0.1): whoever "
                 "reaches the page on 0.0.0.0 could change the universe")):
            proc = subprocess.run([sys.executable, "-m", "rdvpump", *args], text=True,
                                  capture_output=True, timeout=60, env=ENV)
            assert proc.returncode == 1, proc.stderr
            assert proc.stderr.strip().splitlines()[-1] == said
            assert "Traceback" not in proc.stderr
