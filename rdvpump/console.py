"""``rdvpump console``: a live web page of a running universe.

Once a second the console asks the universe's name service for its brokers (as
``rdvpump status`` does, with the universe's token) and scrapes the metrics page of
every process that registered one (``--metrics``); from two scrapes in a row it works out
each link's rate.  The page (``console.html``, shipped in the package, no script from
the network) gets each new snapshot as a server-sent event.

It changes nothing in the universe unless started with ``admin``: then the page may
declare a topic or consume group on an MQ server and switch a replicated group's master,
each through the code ``rdvpump mq declare`` and ``rdvpump mq failover`` run, with the
console's token.  Those requests are POSTs of JSON from the page's own origin: a form of
another site cannot send one (a browser asks first for a JSON POST to another origin,
and the console answers no such question).
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

from brokermgr import DEFAULT_HEARTBEAT, NameClient
from pump import RdvpumpError
from rdv import Address

from ._dial import tool_universe
from ._errors import first_leaf

__all__ = ["AdminError", "UniverseConsole", "check_admin_address", "serve_console"]

#: Seconds between two snapshots, and how many the charts keep (five minutes).
INTERVAL = 1.0
HISTORY = 300
#: Seconds a metrics page has to answer before the snapshot goes on without it.
SCRAPE_TIMEOUT = 2.0
#: A broker is late once this many of its own heartbeat intervals passed with none: one
#: beat missed, not a beat that is merely due.
LATE_AFTER_BEATS = 2.0
#: Seconds an admin request waits for the server or the new master.
ADMIN_TIMEOUT = 10.0
#: The largest admin request body read.
ADMIN_BODY = 64 * 1024


def check_admin_address(host: str) -> None:
    """``--admin`` serves on a loopback address only: whoever reaches the page may change
    the universe with the console's token.  ConfigError otherwise."""
    import ipaddress

    from pump import ConfigError

    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ConfigError(f"--admin serves only on a loopback address (127.0.0.1): whoever "
                          f"reaches the page on {host} could change the universe")


class AdminError(RdvpumpError):
    """An admin request refused or failed: ``status`` is the HTTP status to answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class UniverseConsole:
    """Snapshots of ``universe`` (its manager at ``manager_address``), one per
    :data:`INTERVAL`, for the page."""

    def __init__(self, universe: str, manager_address: Address, *, token: str = "",
                 identity: str | None = None, admin: bool = False) -> None:
        self.universe = universe
        self.manager_address = manager_address
        self.token = token
        #: The console's identity (``NAME:SECRET``): whose rights its admin actions use.
        self.identity = identity
        self.admin = admin
        self.snapshot: dict[str, Any] = {"universe": universe, "time": 0.0, "admin": admin,
                                         "brokers": [], "links": [], "service_links": 0,
                                         "groups": [],
                                         "trackers": [], "topics": [], "replicated": [],
                                         "chart": [], "warnings": [], "actions": []}
        self._brokers: list[dict[str, Any]] = []
        self._actions: deque[str] = deque(maxlen=20)
        self.version = 0
        self.changed = trio.Event()
        self._previous: dict[tuple[str, ...], tuple[float, float]] = {}
        self._chart: deque[tuple[float, float, float]] = deque(maxlen=HISTORY)
        self._warnings: deque[str] = deque(maxlen=50)
        self._seen: set[str] = set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        async with tool_universe(self.universe, name="console", token=self.token,
                                 identity=self.identity) as manager:
            names = NameClient(manager, [self.manager_address], retry=INTERVAL)
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
        self._brokers = brokers
        pages = sorted({str(b["metrics"]) for b in brokers if b.get("metrics")})
        scraped: dict[str, dict[tuple[str, frozenset[tuple[str, str]]], float] | None] = {}
        for page in pages:
            scraped[page] = await trio.to_thread.run_sync(_scrape, page)
            if scraped[page] is None:
                self._warn(f"the metrics page http://{page}/metrics did not answer")
        figures = self._figures(scraped, now)
        lag = sum(g["lag"] for g in figures["groups"])
        self._chart.append((round(now, 3), round(figures.pop("rate"), 1), lag))
        errors = figures.pop("errors")
        rows = [_broker_row(b, scraped, errors)
                for b in sorted(brokers, key=lambda b: str(b["id"]))]
        self.snapshot = {
            "universe": self.universe, "time": now, "admin": self.admin,
            "manager": f"{self.manager_address[0]}:{self.manager_address[1]}",
            "brokers": rows, **figures, "replicated": _replicated(brokers),
            "chart": list(self._chart), "warnings": list(self._warnings),
            "actions": list(self._actions)}
        self._publish()

    def _publish(self) -> None:
        self.version += 1
        self.changed.set()
        self.changed = trio.Event()

    async def act(self, action: str, fields: dict[str, Any]) -> str:
        """An admin request from the page: ``declare`` (a topic, and a consume group, on
        an MQ server: ``rdvpump mq declare``) or ``failover`` (a replicated group's master:
        ``rdvpump mq failover``).  What the CLI would print, or :class:`AdminError`."""
        if not self.admin:
            raise AdminError(403, "this console is read-only: start it with --admin to "
                                  "change the universe from the page")
        try:
            if action == "declare":
                said = await self._declare(fields)
            elif action == "failover":
                said = await self._failover(fields)
            else:
                raise AdminError(404, f"no admin action {action!r}: declare or failover")
        except Exception as exc:  # noqa: BLE001 - an error of the action's own is answered
            leaf = first_leaf(exc)  # (raised inside the CLI code's nurseries)
            if isinstance(leaf, AdminError):
                raise leaf from None
            if not isinstance(leaf, (RdvpumpError, OSError)):
                raise
            # the server's or the manager's refusal, or no answer
            raise AdminError(409 if isinstance(leaf, RdvpumpError) else 502,
                             str(leaf)) from None
        self._actions.append(f"{time.strftime('%H:%M:%S')} {said}")
        self.snapshot = {**self.snapshot, "actions": list(self._actions)}
        self._publish()
        return said

    async def _declare(self, fields: dict[str, Any]) -> str:
        from .admin import declare, declared

        server, topic = _text(fields, "server"), _text(fields, "topic")
        options = {name: _text(fields, name, optional=True)
                   for name in ("group", "filter", "start")}
        shared = fields.get("shared", False)
        if not isinstance(shared, bool):
            raise AdminError(400, "shared must be true or false")
        found = next((b for b in self._brokers if b["id"] == server), None)
        if found is None:
            raise AdminError(404, f"no broker {server!r} is registered in universe "
                                  f"{self.universe!r}")
        host, port = found["address"]
        reply = await declare(self.universe, f"{server}@{host}:{port}", topic,
                              group=options["group"], filter=options["filter"],
                              start=options["start"], shared=shared, token=self.token,
                              identity=self.identity, timeout=ADMIN_TIMEOUT)
        return f"{server}: " + declared(topic, reply, options["filter"])

    async def _failover(self, fields: dict[str, Any]) -> str:
        from .admin import master_switched, switch_master

        group, to = _text(fields, "group"), _text(fields, "to")
        info = await switch_master(self.universe, self.manager_address, group, to,
                                   token=self.token, identity=self.identity,
                                   timeout=ADMIN_TIMEOUT)
        return master_switched(group, info)

    def _warn(self, text: str) -> None:
        stamp = time.strftime("%H:%M:%S")
        if not self._warnings or not self._warnings[-1].endswith(text):
            self._warnings.append(f"{stamp} {text}")

    def _figures(self, scraped: dict[str, Any], now: float) -> dict[str, Any]:
        """The links, MQ groups, trackers and tracked topics the pages show, the total
        rate over every link, and each page's topics in their error state."""
        links, groups, trackers, topics = [], [], [], []
        errors: dict[str, list[str]] = {}
        total = 0.0
        service_links = 0
        for page, samples in sorted(scraped.items()):
            if samples is None:
                continue
            for (name, labels), value in samples.items():
                tags = dict(labels)
                if name == "rdvpump_link_messages_sent_total":
                    if tags["broker"].startswith("@") or tags["peer"].startswith("@"):
                        # the universe's own (a heartbeat to the name service, a report
                        # to a tracker): counted, not shown beside the brokers' links or
                        # in their rate, where their beats drew a sawtooth
                        service_links += 1
                        continue
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
                elif name == "rdvpump_tracker_topic_servers":
                    topics.append({"tracker": tags["tracker"], "topic": tags["topic"],
                                   "servers": int(value)})
                elif name == "rdvpump_mq_topic_error" and value:
                    errors.setdefault(page, []).append(tags["topic"])
        links.sort(key=lambda link: (link["broker"], link["peer"], link["port"]))
        groups.sort(key=lambda g: (g["server"], g["topic"], g["group"]))
        topics.sort(key=lambda t: (t["tracker"], t["topic"]))
        return {"links": links, "service_links": service_links, "groups": groups,
                "trackers": trackers, "topics": topics,
                "rate": total, "errors": errors}

    def _rate(self, key: tuple[str, ...], value: float, now: float) -> float:
        before = self._previous.get(key)
        self._previous[key] = (now, value)
        if before is None or now <= before[0] or value < before[1]:
            return 0.0
        return (value - before[1]) / (now - before[0])


def _broker_row(b: dict[str, Any], scraped: dict[str, Any], errors: dict[str, list[str]]
                ) -> dict[str, Any]:
    group, cluster = b.get("group"), b.get("cluster")
    role = ("master" if group and group.get("role") == "master" else
            "slave" if group else
            f"{cluster['type']}{' (root)' if cluster['root'] == b['id'] else ''}" if cluster
            else "broker")
    page = b.get("metrics")
    problems = []
    # its own interval (registered with it); a registration without one, the default's
    late = b["since_heartbeat"] > LATE_AFTER_BEATS * b.get("heartbeat", DEFAULT_HEARTBEAT)
    if late:
        problems.append(f"heartbeat {b['since_heartbeat']:.0f} s ago")
    if page and scraped.get(page) is None:
        problems.append("metrics page not answering")
    if page and errors.get(page):
        problems.append("topic in error: " + ", ".join(sorted(errors[page])))
    return {"id": b["id"], "address": ":".join(str(p) for p in b["address"]), "role": role,
            "uptime": b["age"], "heartbeat": b["since_heartbeat"], "late": late,
            "metrics": page,
            "health": "; ".join(problems) or "ok"}


def _replicated(brokers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The replicated groups of the registered brokers: each one's members and master."""
    found: dict[str, dict[str, Any]] = {}
    for b in brokers:
        group = b.get("group")
        if not group:
            continue
        row = found.setdefault(str(group["name"]), {"group": str(group["name"]),
                                                     "master": None, "members": []})
        row["members"].append(b["id"])
        if group.get("role") == "master":
            row["master"] = b["id"]
    for row in found.values():
        row["members"].sort()
    return [found[name] for name in sorted(found)]


def _text(fields: dict[str, Any], name: str, *, optional: bool = False) -> Any:
    """A field of an admin request: a non-empty string (or, if ``optional``, None when
    absent or empty)."""
    value = fields.get(name)
    if value in (None, "") and optional:
        return None
    if not isinstance(value, str) or not value:
        raise AdminError(400, f"{name} is required (a non-empty string)")
    return value


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
        if scope["path"].startswith("/admin/"):
            await _admin(console, scope, receive, send)
        elif scope["path"] == "/":
            await _answer(send, 200, "text/html; charset=utf-8", page)
        elif scope["path"] == "/snapshot":
            await _answer(send, 200, "application/json",
                          json.dumps(console.snapshot).encode())
        elif scope["path"] == "/events":
            await _events(console, send)
        else:
            await _answer(send, 404, "text/plain", b"not found\n")

    await serve_asgi(app, host, port, task_status=task_status)


async def _admin(console: UniverseConsole, scope: Any, receive: Any, send: Any) -> None:
    """``POST /admin/ACTION`` with a JSON object: the action's answer as JSON, ``{"said":
    TEXT}`` or ``{"error": TEXT}``."""
    try:
        if scope["method"] != "POST":
            raise AdminError(405, "admin actions are POSTs")
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope["headers"]}
        if headers.get("content-type", "").split(";")[0].strip() != "application/json":
            raise AdminError(415, "an admin request is a JSON object "
                                  "(content-type: application/json)")
        origin = headers.get("origin")
        if origin is not None and origin != f"http://{headers.get('host', '')}":
            raise AdminError(403, f"an admin request from another origin ({origin}) is "
                                  "refused")
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if len(body) > ADMIN_BODY:
                raise AdminError(413, f"an admin request is at most {ADMIN_BODY} bytes")
            if not message.get("more_body"):
                break
        try:
            fields = json.loads(body)
        except ValueError:
            fields = None
        if not isinstance(fields, dict):
            raise AdminError(400, "an admin request is a JSON object")
        said = await console.act(scope["path"].removeprefix("/admin/"), fields)
        await _answer(send, 200, "application/json", json.dumps({"said": said}).encode())
    except AdminError as refused:
        await _answer(send, refused.status, "application/json",
                      json.dumps({"error": str(refused)}).encode())


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
