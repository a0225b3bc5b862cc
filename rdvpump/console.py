"""``rdvpump console``: a live web page of a running universe.

Once a second the console asks the universe's name service for its brokers (as
``rdvpump status`` does, with the universe's token) and scrapes the metrics page of
every process that registered one (``--metrics``); from two scrapes in a row it works out
each link's rate.  The page (``console.html``, shipped in the package, no script from
the network) gets each new snapshot as a server-sent event.  It changes nothing in the
universe: it only reads what the processes publish.
"""

from __future__ import annotations

import json
import math
import time
import urllib.request
from collections import deque
from importlib import resources
from typing import Any

import trio

from brokermgr import BrokerManager, NameClient
from rdv import Address

__all__ = ["UniverseConsole", "serve_console"]

#: Seconds between two snapshots, and how many the charts keep (five minutes).
INTERVAL = 1.0
HISTORY = 300
#: Seconds a metrics page has to answer before the snapshot goes on without it.
SCRAPE_TIMEOUT = 2.0


class UniverseConsole:
    """Snapshots of ``universe`` (its manager at ``manager_address``), one per
    :data:`INTERVAL`, for the page."""

    def __init__(self, universe: str, manager_address: Address, *, token: str = "") -> None:
        self.universe = universe
        self.manager_address = manager_address
        self.manager = BrokerManager(universe, token=token)
        self.snapshot: dict[str, Any] = {"universe": universe, "time": 0.0, "brokers": [],
                                         "links": [], "groups": [], "trackers": [],
                                         "chart": [], "warnings": []}
        self.version = 0
        self.changed = trio.Event()
        self._previous: dict[tuple[str, ...], tuple[float, float]] = {}
        self._chart: deque[tuple[float, float, float]] = deque(maxlen=HISTORY)
        self._warnings: deque[str] = deque(maxlen=50)
        self._seen: set[str] = set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(self.manager.pump.serve)
            await nursery.start(self.manager.serve_network, "127.0.0.1", 0)
            names = NameClient(self.manager, [self.manager_address], retry=INTERVAL)
            names.start()
            task_status.started()
            link = names.links[0]
            with trio.move_on_after(SCRAPE_TIMEOUT):  # the first snapshot finds it up
                while link.queue is None and link.last_refusal is None:
                    await link.attempted()
            while True:
                brokers = await names.list() if link.queue is not None else None
                if brokers is None:
                    self._warn(f"no answer from the manager at {self.manager_address[0]}:"
                               f"{self.manager_address[1]}"
                               + (f": {link.last_refusal}" if link.last_refusal else ""))
                await self._take(brokers or [])
                await trio.sleep(INTERVAL)

    async def _take(self, brokers: list[dict[str, Any]]) -> None:
        now = time.time()
        listed = {str(b["id"]) for b in brokers}
        for gone in sorted(self._seen - listed):
            self._warn(f"broker {gone} is gone (unregistered or expired)")
        self._seen = listed
        pages = sorted({str(b["metrics"]) for b in brokers if b.get("metrics")})
        scraped: dict[str, dict[tuple[str, frozenset[tuple[str, str]]], float] | None] = {}
        for page in pages:
            scraped[page] = await trio.to_thread.run_sync(_scrape, page)
            if scraped[page] is None:
                self._warn(f"the metrics page http://{page}/metrics did not answer")
        links, groups, trackers, total_rate = self._figures(scraped, now)
        lag = sum(g["lag"] for g in groups)
        self._chart.append((round(now, 3), round(total_rate, 1), lag))
        self.snapshot = {
            "universe": self.universe, "time": now,
            "manager": f"{self.manager_address[0]}:{self.manager_address[1]}",
            "brokers": [_broker_row(b) for b in sorted(brokers, key=lambda b: str(b["id"]))],
            "links": links, "groups": groups, "trackers": trackers,
            "chart": list(self._chart), "warnings": list(self._warnings)}
        self.version += 1
        self.changed.set()
        self.changed = trio.Event()

    def _warn(self, text: str) -> None:
        stamp = time.strftime("%H:%M:%S")
        if not self._warnings or not self._warnings[-1].endswith(text):
            self._warnings.append(f"{stamp} {text}")

    def _figures(self, scraped: dict[str, Any], now: float
                 ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]],
                            float]:
        links, groups, trackers = [], [], []
        total = 0.0
        for page, samples in sorted(scraped.items()):
            if samples is None:
                continue
            for (name, labels), value in samples.items():
                tags = dict(labels)
                if name == "rdvpump_link_messages_sent_total":
                    key = (page, tags["broker"], tags["peer"], tags["port"], tags["link"])
                    rate = self._rate(key, value, now)
                    total += rate
                    queued = samples.get(("rdvpump_link_queued_bytes", labels), 0.0)
                    high = samples.get(("rdvpump_link_high_water_bytes", labels), 0.0)
                    links.append({"process": page, "broker": tags["broker"],
                                  "peer": tags["peer"], "port": int(tags["port"]),
                                  "sent": int(value), "rate": round(rate, 1),
                                  "queued": int(queued), "high_water": int(high)})
                elif name == "rdvpump_mq_group_lag":
                    groups.append({"server": tags["server"], "topic": tags["topic"],
                                   "group": tags["group"], "lag": int(value)})
                elif name == "rdvpump_tracker_servers":
                    version = samples.get(("rdvpump_tracker_version",
                                           labels), 0.0)
                    trackers.append({"tracker": tags["tracker"], "servers": int(value),
                                     "version": int(version)})
        links.sort(key=lambda link: (link["broker"], link["peer"], link["port"]))
        groups.sort(key=lambda g: (g["server"], g["topic"], g["group"]))
        return links, groups, trackers, total

    def _rate(self, key: tuple[str, ...], value: float, now: float) -> float:
        before = self._previous.get(key)
        self._previous[key] = (now, value)
        if before is None or now <= before[0] or value < before[1]:
            return 0.0
        return (value - before[1]) / (now - before[0])


def _broker_row(b: dict[str, Any]) -> dict[str, Any]:
    group, cluster = b.get("group"), b.get("cluster")
    role = ("master" if group and group.get("role") == "master" else
            "slave" if group else
            f"{cluster['type']}{' (root)' if cluster['root'] == b['id'] else ''}" if cluster
            else "broker")
    return {"id": b["id"], "address": ":".join(str(p) for p in b["address"]), "role": role,
            "uptime": b["age"], "heartbeat": b["since_heartbeat"],
            "metrics": b.get("metrics")}


def _scrape(page: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float] | None:
    """Every sample of a metrics page, or None when it does not answer in time (runs in a
    thread: urllib blocks)."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(f"http://{page}/metrics",
                                    timeout=SCRAPE_TIMEOUT) as answer:
            text = answer.read().decode()
    except (OSError, ValueError):
        return None
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples
            if not math.isnan(s.value)}


async def serve_console(console: UniverseConsole, host: str, port: int, *,
                        task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED
                        ) -> None:
    """The page at ``/`` and its snapshots at ``/events`` (server-sent events) on
    ``host:port``; ``task_status.started(address)``."""
    from ._asgi import serve_asgi

    page = resources.files("rdvpump").joinpath("console.html").read_bytes()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["path"] == "/":
            await _answer(send, 200, "text/html; charset=utf-8", page)
        elif scope["path"] == "/snapshot":
            await _answer(send, 200, "application/json",
                          json.dumps(console.snapshot).encode())
        elif scope["path"] == "/events":
            await _events(console, send)
        else:
            await _answer(send, 404, "text/plain", b"not found\n")

    await serve_asgi(app, host, port, task_status=task_status)


async def _answer(send: Any, status: int, kind: str, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", kind.encode()),
                            (b"cache-control", b"no-store")]})
    await send({"type": "http.response.body", "body": body})


async def _events(console: UniverseConsole, send: Any) -> None:
    """Each snapshot as one server-sent event, the latest first, until the page goes."""
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/event-stream"),
                            (b"cache-control", b"no-store")]})
    while True:
        data = json.dumps(console.snapshot).encode()
        try:
            await send({"type": "http.response.body", "body": b"data: " + data + b"\n\n",
                        "more_body": True})
        except Exception:  # noqa: BLE001 - the page went: nothing more to send
            return
        await console.changed.wait()
