"""The clients of ``bench nemesis``, each run on a host of its own: a producer or a
consumer of a replicated group's topic that follows the master the name service names
(or of a cluster's shared topic, through one server of the cluster after another: the
next once one fails it) and writes what it saw as history operations
(:mod:`mq._history`), one JSON object a line on stdout, each with ``t``, the machine's
monotonic clock when it happened.

``python -m rdvpump.bench._history_client produce|consume MANAGER UNIVERSE LISTEN
[SERVER,SERVER,...]`` (the cluster's servers' broker ids: a cluster's client; it starts
at the first).
The producer publishes one message at a time (a retry of one not acknowledged keeps its
producer id and sequence, as a routed producer's does) until it reads ``stop`` on stdin,
then says ``{"op": "done"}``; the consumer consumes and acknowledges until ``stop`` (an
ack is sent, not confirmed: ``"status": "sent"``).
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from typing import Any

import trio

from brokermgr import BrokerManager, NameClient, ServiceError
from mq import MqClient
from pump import Pump, RdvpumpError
from rdv import Address

#: Seconds a request may wait for its answer.
TIMEOUT = 1.0
#: Seconds between two questions to the name service when it names no master.
POLL = 0.01
TOPIC = "orders"
GROUP = "a"
BODY = b"x" * 100


def _say(obj: dict[str, Any]) -> None:
    print(json.dumps(obj), flush=True)


def main(role: str, manager: str, universe: str, listen: str, servers: str = "") -> None:
    trio.run(_run, role, manager, universe, listen, servers)


async def _run(role: str, manager: str, universe: str, listen: str, servers: str) -> None:
    side = BrokerManager(universe, pump=Pump(name=role))
    stop = trio.Event()

    async def read_stdin() -> None:
        await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
        stop.set()

    async with trio.open_nursery() as nursery:
        await nursery.start(side.pump.serve)
        await nursery.start(side.serve_network, listen, 0)
        names = NameClient(side, [Address.parse(manager)], lookup_timeout=0.5)
        names.start()
        nursery.start_soon(read_stdin)
        target = _Target(side, names, role, servers.split(",") if servers else [])
        if role == "produce":
            await _produce(target, stop)
            _say({"op": "done"})
        else:
            await _consume(target, stop)
        names.close()
        nursery.cancel_scope.cancel()


class _Target:
    """Where a client publishes and consumes: the master the name service names, or the
    cluster's server it is at (the next once one fails it)."""

    def __init__(self, side: BrokerManager, names: NameClient, role: str,
                 cluster: list[str]) -> None:
        self.side = side
        self.names = names
        self.role = role
        self.cluster = cluster
        self.shared = bool(cluster)  # a cluster's shared topic
        self.at = 0
        self.made = 0

    async def master(self) -> str | None:
        if self.cluster:
            return self.cluster[self.at % len(self.cluster)]
        try:
            group = await self.names.group(GROUP)
        except ServiceError:
            return None
        found = group.get("master")
        return found if isinstance(found, str) else None

    def failed(self, name: str) -> None:
        """``name`` did not answer, or refused: a cluster's client moves on to the next
        server (a group's asks the name service again)."""
        if self.cluster and self.cluster[self.at % len(self.cluster)] == name:
            self.at += 1

    def client_of(self, name: str) -> MqClient:
        self.made += 1
        return MqClient(self.side.add_broker(f"{self.role}{self.made}"), f"{name}:15555",
                        timeout=TIMEOUT)


async def _produce(target: _Target, stop: trio.Event) -> None:
    producer, sequence = f"p{time.monotonic_ns()}", 1
    clients: dict[str, MqClient] = {}
    while not stop.is_set():
        to = await target.master()
        if to is None:
            await trio.sleep(POLL)
            continue
        client = clients.get(to) or clients.setdefault(to, target.client_of(to))
        op: dict[str, Any] = {"op": "publish", "topic": TOPIC, "producer": producer,
                              "sequence": sequence, "partition": GROUP}
        try:
            reply = await client.request({"cmd": "produce", "topic": TOPIC,
                                          "producer": producer, "sequence": sequence}, BODY)
        except ServiceError as exc:  # not stored as far as it knows, or no answer
            _say({**op, "status": "unknown", "t": time.monotonic(), "error": str(exc)})
            if exc.status == 0:
                clients.pop(to).close()  # lost: a new link to whichever is named
            if exc.status == 404:  # the first publish: the topic is declared
                with contextlib.suppress(ServiceError):
                    await client.declare(TOPIC, shared=target.shared)
            else:
                target.failed(to)
            await trio.sleep(POLL)
            continue
        if target.shared:  # a shared topic: its root stored it, at the cluster's epoch;
            # offsets are each root's own, so none is said
            _say({**op, "partition": "cluster", "status": "ok", "server": reply["server"],
                  "epoch": reply.get("root_epoch"), "t": time.monotonic()})
        else:
            _say({**op, "status": "ok", "offset": reply["offset"], "server": reply["server"],
                  "epoch": reply.get("epoch"), "t": time.monotonic()})
        sequence += 1
    for client in clients.values():
        client.close()


async def _consume(target: _Target, stop: trio.Event) -> None:
    while not stop.is_set():
        to = await target.master()
        if to is None:
            await trio.sleep(POLL)
            continue
        client = target.client_of(to)
        try:
            subscription = await client.subscribe(TOPIC, window=500)
            while not stop.is_set():
                with trio.move_on_after(0.25):
                    messages = await subscription.receive_many()
                    _consumed(messages, target.shared)
                    await subscription.ack([m.offset for m in messages])
                    _acked(messages, target.shared)
                    continue
                if await target.master() != to:
                    break  # another master now: follow it
        except (ServiceError, RdvpumpError):  # the link lost, a slave's refusal
            target.failed(to)
            await trio.sleep(POLL)
        finally:
            client.close()


def _consumed(messages: Any, shared: bool) -> None:
    """Messages consumed, as history operations (a shared topic's offsets are each
    root's own: none is said)."""
    now = time.monotonic()
    for m in messages:
        where = {} if shared else {"partition": GROUP, "offset": m.offset}
        _say({"op": "consume", "topic": TOPIC, "group": m.group, "producer": m.producer,
              "sequence": m.sequence, **where, "t": now})


def _acked(messages: Any, shared: bool) -> None:
    """Their acks, sent (not confirmed), as history operations."""
    for m in messages:
        _say({"op": "ack", "topic": TOPIC, "group": m.group,
              "partition": None if shared else GROUP, "offset": m.offset, "status": "sent",
              "t": time.monotonic()})


if __name__ == "__main__":
    main(*sys.argv[1:6])
