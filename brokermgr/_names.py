"""The name service: a BrokerManager served to other processes, like RocketMQ's NameServer.

The service is a broker (``@manager``) listening on rendezvous port 0; clients
reach it through the same handshake (universe and token) and message queues as
any link.  Requests and replies are JSON messages.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from typing import Any

import trio

from channels import MessageQueue, QueueListener
from pump import Timer
from rdv import Address, RdvNode

from ._broker import BrokerManager
from ._liveness import DEFAULT_SCAN_INTERVAL, LivenessTable

log = logging.getLogger("rdvpump.names")

MANAGER_ID = "@manager"
NAME_PORT = 0
#: Default TCP port of a manager, as RocketMQ's NameServer.
DEFAULT_MANAGER_PORT = 9876
#: Delay before dialling a manager again after a failed attempt.
DEFAULT_RETRY = 1.0
#: Seconds between a broker's registrations (heartbeats), as RocketMQ's brokers.
DEFAULT_HEARTBEAT = 30.0
#: Seconds without a heartbeat before the name service drops a broker, as RocketMQ's.
DEFAULT_BROKER_EXPIRY = 120.0
DEFAULT_LOOKUP_TIMEOUT = 5.0


def _encode(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()


class NameService:
    """Serves a universe's directory: register, heartbeat, unregister, lookup, list.

    A broker is dropped at once when the connection it registered over drops,
    and otherwise when no heartbeat came within ``expiry`` (checked every
    ``scan_interval``).
    """

    def __init__(self, manager: BrokerManager, *, expiry: float = DEFAULT_BROKER_EXPIRY,
                 scan_interval: float = DEFAULT_SCAN_INTERVAL) -> None:
        if not scan_interval > 0:
            raise ValueError(f"scan interval must be positive, got {scan_interval!r}")
        self.manager = manager
        self.pump = manager.pump
        self.table = LivenessTable(expiry=expiry)
        self.scan_interval = scan_interval
        self.broker = manager.add_broker(MANAGER_ID)
        self.broker.listen(NAME_PORT, self)
        self._scan_timer = self.pump.call_later(scan_interval, self._scan)

    def accepted(self, queue: MessageQueue) -> None:
        queue.set_listener(_Session(self, queue))

    def _scan(self) -> None:
        for broker_id in self.table.scan(self.pump.now()):
            log.info("broker %s expired: no heartbeat within %s s", broker_id, self.table.expiry)
            self.pump.emit("expire", broker=broker_id)
        self._scan_timer = self.pump.call_later(self.scan_interval, self._scan)

    def close(self) -> None:
        self._scan_timer.cancel()
        self.broker.close("name service closed")


class _Session(QueueListener):
    """One client connection to the name service."""

    def __init__(self, service: NameService, queue: MessageQueue) -> None:
        self.service = service
        self.queue = queue

    def received(self, message: bytes) -> None:
        try:
            request = json.loads(message)
            if not isinstance(request, dict):
                raise ValueError("request is not a JSON object")
        except ValueError as exc:
            self.queue.abort(f"protocol error: bad name-service request: {exc}")
            return
        seq = request.get("seq")
        try:
            reply = self._handle(request)
        except (KeyError, TypeError, ValueError) as exc:
            reply = {"ok": False, "error": f"bad {request.get('op')!r} request: {exc}"}
        reply["seq"] = seq
        try:
            self.queue.send(_encode(reply))
        except trio.WouldBlock:
            self.queue.abort("client does not read its replies")
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the client left (an unregister before closing); its close follows

    def _handle(self, request: dict[str, Any]) -> dict[str, Any]:
        table, now = self.service.table, self.service.pump.now()
        op = request.get("op")
        if op in ("register", "heartbeat"):
            for b in request["brokers"]:
                if not isinstance(b["id"], str) or not b["id"]:
                    raise ValueError("broker id must be a non-empty string")
                table.register(b["id"], Address.of(b["address"]), now=now,
                               version=int(b.get("version", 0)),
                               topics=tuple(str(t) for t in b.get("topics", ())),
                               connection=self)
            return {"ok": True}
        if op == "unregister":
            for broker_id in request["ids"]:
                table.unregister(broker_id)
            return {"ok": True}
        if op == "lookup":
            address = table.lookup(request["id"])
            return {"ok": True, "address": None if address is None else list(address)}
        if op == "list":
            return {"ok": True, "universe": self.service.manager.name,
                    "brokers": [r.to_dict(now) for r in table.records()]}
        raise ValueError(f"unknown op {op!r}")

    def closed(self, reason: str) -> None:
        for broker_id in self.service.table.connection_lost(self):
            log.info("broker %s dropped: its connection closed (%s)", broker_id, reason)
            self.service.pump.emit("drop", broker=broker_id, reason=reason)


class NameClient:
    """A process's link to one or more managers of its universe.

    Registers the process's brokers with every manager, heartbeats, registers
    again at once when a manager's connection drops (a restarted manager
    relearns us immediately), and resolves broker ids for connects: a cache
    first, then each manager in turn (managers may disagree; the first that
    knows wins).
    """

    def __init__(self, manager: BrokerManager, managers: list[Address], *,
                 heartbeat: float = DEFAULT_HEARTBEAT, retry: float = DEFAULT_RETRY,
                 lookup_timeout: float = DEFAULT_LOOKUP_TIMEOUT, version: int = 0,
                 topics: Callable[[str], tuple[str, ...]] | None = None) -> None:
        if not managers:
            raise ValueError("a name client needs at least one manager address")
        if not heartbeat > 0 or not retry > 0:
            raise ValueError("heartbeat and retry intervals must be positive")
        self.manager = manager
        self.pump = manager.pump
        self.heartbeat = heartbeat
        self.retry = retry
        self.lookup_timeout = lookup_timeout
        self.version = version
        self.topics = topics or (lambda broker_id: ())
        self.cache: dict[str, Address] = {}
        self._node = RdvNode(self.pump, f"@names.{os.getpid()}", manager.channels,
                             lambda _id: None, owner=_NoOwner())
        self._node.network = manager.net
        self.sessions = [_ManagerLink(self, address) for address in managers]
        manager.net.resolver = self.resolve
        base_lookup = manager.net.lookup
        manager.net.lookup = lambda broker_id: base_lookup(broker_id) or self.cache.get(broker_id)

    def start(self) -> None:
        """Connect to every manager (the network must be served already)."""
        for session in self.sessions:
            session.connect()

    def registrations(self) -> list[dict[str, Any]]:
        address = self.manager.net.address
        if address is None:
            return []
        return [{"id": b, "address": list(address), "version": self.version,
                 "topics": list(self.topics(b))}
                for b in self.manager.broker_ids if not b.startswith("@")]

    async def resolve(self, broker_id: str, fresh: bool) -> Address | None:
        """Where ``broker_id`` listens, per the first manager that knows it."""
        if fresh:
            self.cache.pop(broker_id, None)
        elif broker_id in self.cache:
            return self.cache[broker_id]
        for session in self.sessions:
            if session.queue is None:
                continue
            reply = await session.request({"op": "lookup", "id": broker_id},
                                          timeout=self.lookup_timeout)
            if reply is not None and reply.get("address") is not None:
                address = Address.of(reply["address"])
                self.cache[broker_id] = address
                return address
        return None

    async def list(self) -> list[dict[str, Any]] | None:
        for session in self.sessions:
            if session.queue is not None:
                reply = await session.request({"op": "list"}, timeout=self.lookup_timeout)
                if reply is not None:
                    return list(reply["brokers"])
        return None

    def close(self) -> None:
        """Unregister this process's brokers (clean shutdown) and close the links."""
        ids = [r["id"] for r in self.registrations()]
        for session in self.sessions:
            session.close(ids)


class _NoOwner:
    """Owner of the name client's own connect tasks: failures are logged by the pump."""

    def _fail(self, exc: BaseException) -> None:
        log.error("name client task failed: %r", exc)

    def _trace_ids(self) -> tuple[str | None, str | None, int | None, str | None]:
        return None, MANAGER_ID, NAME_PORT, None


class _ManagerLink(QueueListener):
    """The link to one manager: connect, register, heartbeat, reconnect."""

    def __init__(self, client: NameClient, address: Address) -> None:
        self.client = client
        self.address = address
        self.queue: MessageQueue | None = None
        self._seq = 0
        self._waiting: dict[int, tuple[trio.Event, list[dict[str, Any]]]] = {}
        self._timer: Timer | None = None
        self._closing = False
        self.connects = 0
        self.last_refusal: str | None = None

    def connect(self) -> None:
        if self._closing:
            return
        self.client._node.network.dial(self.client._node, MANAGER_ID, NAME_PORT, self,
                                       address=self.address)

    # connect listener
    def connected(self, queue: MessageQueue) -> None:
        self.queue = queue
        self.connects += 1
        queue.set_listener(self)
        self._beat()

    def refused(self, reason: str) -> None:
        self.last_refusal = reason
        log.info("manager %s:%s: %s; retrying in %s s", *self.address, reason, self.client.retry)
        self._timer = self.client.pump.call_later(self.client.retry, self.connect)

    # queue listener
    def received(self, message: bytes) -> None:
        try:
            reply = json.loads(message)
            waiter = self._waiting.pop(reply["seq"], None)
        except (ValueError, KeyError, TypeError):
            if self.queue is not None:
                self.queue.abort("protocol error: bad name-service reply")
            return
        if waiter is not None:
            waiter[1].append(reply)
            waiter[0].set()

    def closed(self, reason: str) -> None:
        self.queue = None
        if self._timer is not None:
            self._timer.cancel()
        for event, _ in self._waiting.values():
            event.set()
        self._waiting.clear()
        if not self._closing:
            log.info("lost manager %s:%s (%s); registering again", *self.address, reason)
            self._timer = self.client.pump.call_later(0, self.connect)

    def _send(self, obj: dict[str, Any]) -> int:
        self._seq += 1
        obj["seq"] = self._seq
        if self.queue is not None:
            self.queue.send(_encode(obj))
        return self._seq

    def _beat(self) -> None:
        if self.queue is None:
            return
        registrations = self.client.registrations()
        if registrations:
            self._send({"op": "register", "brokers": registrations})
        self._timer = self.client.pump.call_later(self.client.heartbeat, self._beat)

    async def request(self, obj: dict[str, Any], *, timeout: float) -> dict[str, Any] | None:
        if self.queue is None:
            return None
        event, box = trio.Event(), []  # type: tuple[trio.Event, list[dict[str, Any]]]
        seq = self._send(obj)
        self._waiting[seq] = (event, box)
        with trio.move_on_after(timeout):
            await event.wait()
        self._waiting.pop(seq, None)
        return box[0] if box and box[0].get("ok") else None

    def close(self, ids: list[str]) -> None:
        self._closing = True
        if self._timer is not None:
            self._timer.cancel()
        if self.queue is not None:
            if ids:
                self._send({"op": "unregister", "ids": ids})
            self.queue.close()
