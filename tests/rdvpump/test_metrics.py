"""``--metrics``: a manager and an MQ server, real processes, each serve Prometheus's text
format; what a user does to them (declare, publish, consume, a refused connect, a wrong
token) shows in the figures a scrape reads."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import time
import urllib.request
from typing import Any

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from .procs import finish, read_until

pytestmark = pytest.mark.slow  # real processes

ENV = {**os.environ, "RDVPUMP_TOKEN": "secret", "COLUMNS": "200"}


def start(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "rdvpump", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=ENV)


def rdvpump(*args: str, stdin: str = "", env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rdvpump", *args], input=stdin, text=True,
                          capture_output=True, timeout=60, env=env or ENV)


def scrape(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of the page: (name, labels) -> value."""
    with urllib.request.urlopen(url, timeout=10) as page:
        assert page.headers["Content-Type"].startswith("text/plain")
        text = page.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str,
          **labels: str) -> float:
    found = [v for (n, ls), v in samples.items()
             if n == name and set(labels.items()) <= ls]
    assert len(found) == 1, (name, labels, found)
    return found[0]


def named(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str
          ) -> list[tuple[dict[str, str], float]]:
    return [(dict(ls), v) for (n, ls), v in samples.items() if n == name]


def metrics_url(proc: subprocess.Popen[bytes]) -> str:
    said = read_until(proc, proc.stderr, b"/metrics\n").decode()
    found = re.search(r"metrics on (http://\S+/metrics)", said)
    assert found is not None, said
    return found.group(1)


def test_a_manager_and_an_mq_server_serve_what_users_did_to_them(
        tmp_path: pathlib.Path) -> None:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        manager = start("manager", "serve", "--universe", "shop", "--listen", "127.0.0.1:0",
                        "--metrics", "127.0.0.1:0")
        procs.append(manager)
        manager_page = metrics_url(manager)
        where = read_until(manager, manager.stdout, b"\n").decode().split()[-1]
        started = time.monotonic()
        server = start("broker", "run", "--universe", "shop", "--id", "s1", "--manager", where,
                       "--listen", "127.0.0.1:0", "--role", "server", "--mq-dir",
                       str(tmp_path / "data"), "--durability", "sync",
                       "--metrics", "127.0.0.1:0")
        procs.append(server)
        server_page = metrics_url(server)
        at = read_until(server, server.stdout, b"\n").decode().split()[-1]
        mq: Any = ("--server", f"s1@{at}", "--universe", "shop")
        assert rdvpump("mq", "declare", "orders", *mq).returncode == 0
        published = rdvpump("mq", "publish", "orders", *mq, "--batch", "10",
                            stdin="".join(f"{i}\n" for i in range(50)))
        assert published.returncode == 0, published.stderr
        assert rdvpump("mq", "consume", "orders", *mq, "--count", "10").returncode == 0
        # a connect to a port nothing is bound on, and one with another universe's token
        assert rdvpump("mq", "topics", *mq, "--track-port", "15999",
                       "--timeout", "5").returncode == 1
        wrong = rdvpump("mq", "topics", *mq, "--timeout", "5",
                        env={**ENV, "RDVPUMP_TOKEN": "wrong"})
        assert wrong.returncode == 1

        served = scrape(server_page)
        topic = {"server": "s1:15555", "topic": "orders"}
        assert value(served, "rdvpump_mq_next_offset", **topic) == 50
        assert value(served, "rdvpump_mq_durable_offset", **topic) == 50
        assert value(served, "rdvpump_mq_group_lag", **topic, group="orders") == 40
        assert value(served, "rdvpump_mq_group_consumers", **topic, group="orders") == 0
        assert value(served, "rdvpump_mq_topic_error", **topic) == 0
        assert value(served, "rdvpump_mq_messages_total", server="s1:15555",
                     outcome="stored") == 50
        assert value(served, "rdvpump_mq_messages_total", server="s1:15555",
                     outcome="acked") == 10
        commits = value(served, "rdvpump_mq_fsync_seconds_count", server="s1:15555")
        assert 1 <= commits <= 5  # sync: one group commit per batch of 10 at most
        assert value(served, "rdvpump_mq_fsync_seconds_bucket", server="s1:15555",
                     le="+Inf") == commits
        # the link of the process's name client to the manager: registered, heartbeats
        (link,) = [labels for labels, _ in named(served, "rdvpump_link_bytes_sent_total")
                   if labels["peer"] == "@manager"]
        assert value(served, "rdvpump_link_bytes_sent_total", **link) > 0
        assert value(served, "rdvpump_link_messages_sent_total", **link) >= 1
        assert value(served, "rdvpump_link_high_water_bytes", **link) > 0
        # the CLI's clients came and went: each link closed cleanly
        assert value(served, "rdvpump_link_closes_total", broker="s1", cause="clean") >= 3
        refused = named(served, "rdvpump_connects_refused_total")
        assert [labels["reason"] for labels, _ in refused] == ["not bound"], refused
        assert refused[0][1] >= 1  # the CLI dials again within its grace: one or more
        assert value(served, "rdvpump_handshakes_rejected_total", kind="unauthorized") == 1

        # rdvpump status says where the server's process serves its metrics
        shown = rdvpump("status", "--manager", where, "--universe", "shop", "--wait", "s1")
        assert shown.returncode == 0, shown.stderr
        (row,) = [line for line in shown.stdout.splitlines() if " s1 " in line]
        assert server_page.removeprefix("http://").removesuffix("/metrics") in row

        names = scrape(manager_page)
        assert value(names, "rdvpump_names_registered_brokers", universe="shop") == 1
        # heard from since it registered (its heartbeat is every 30 s: it may not have
        # beaten again since, on a slow machine)
        assert 0 <= value(names, "rdvpump_names_heartbeat_age_seconds", universe="shop",
                          broker="s1") <= time.monotonic() - started
    finally:
        for proc in reversed(procs):
            proc.terminate()
            finish(proc)


def test_metrics_are_off_by_default() -> None:
    broker = start("broker", "run", "--universe", "shop", "--id", "b1", "--manager",
                   "127.0.0.1:1", "--listen", "127.0.0.1:0")
    try:
        read_until(broker, broker.stdout, b"\n")  # ready
    finally:
        broker.terminate()
        _, errs = finish(broker)
    assert b"metrics" not in errs


def test_a_bad_metrics_address_is_one_line() -> None:
    proc = rdvpump("broker", "run", "--universe", "shop", "--id", "b1", "--manager",
                   "127.0.0.1:1", "--metrics", "nowhere")
    assert proc.returncode == 1
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: ") and "nowhere" in line


async def test_each_link_end_is_one_series_even_where_two_links_share_a_number() -> None:
    """Each process numbers the links it accepts from 1, so a process that accepts one
    link and dials another to the same peer and port may hold two ends of link 1: their
    series differ, as the traces name each link, by the broker that accepted it."""
    from prometheus_client.core import Metric

    from brokermgr import BrokerManager
    from pump import Pump
    from rdvpump.metrics import Metrics

    left = BrokerManager("u", pump=Pump(name="left"))
    right = BrokerManager("u", pump=Pump(name="right"))
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            for manager in (left, right):
                await nursery.start(manager.pump.serve)
            left.directory["b"] = await nursery.start(right.serve_network, "127.0.0.1", 0)
            right.directory["a"] = await nursery.start(left.serve_network, "127.0.0.1", 0)
            a, b = left.add_broker("a"), right.add_broker("b")
            for broker in (a, b):  # each dials the other's port 80: link 1 of each process
                nursery.start_soon(broker.accept_queue, 80)
            queues = [await a.connect_queue("b", 80), await b.connect_queue("a", 80)]
            links: list[Metric] = [family for family in Metrics(left).collect()
                                   if family.name == "rdvpump_link_messages_sent"]
            labels = [tuple(sorted(s.labels.items())) for s in links[0].samples]
            assert len(labels) == 2 and len(set(labels)) == 2, labels
            assert {dict(label)["link"] for label in labels} == {"a/1", "b/1"}
            for queue in queues:
                await queue.aclose()
            nursery.cancel_scope.cancel()
