"""Long-running processes: a manager serving the name service, and a process of brokers.

Both run until SIGINT or SIGTERM and then shut down cleanly (brokers
unregister).  ``ready`` is called once with the address being served, so a
parent (the CLI, a test) knows when the process can be used.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable, Sequence
from typing import Any

import trio

from channels import DEFAULT_RING_CAPACITY, AsyncMessageQueue
from pump import Pump, TraceRecorder
from rdv import tls_contexts

from ._broker import BrokerManager
from ._liveness import DEFAULT_EXPIRY, DEFAULT_HEARTBEAT, DEFAULT_SCAN, Address
from ._names import NameClient, NameService

#: The name a process's first tracker also answers to, for ``rdvpump routes --tracker HOST:PORT``.
TRACKER_ALIAS = "@tracker"


def parse_address(text: str, *, default_port: int | None = None) -> Address:
    """``HOST:PORT`` (or ``HOST`` with a default port) to a tuple; ValueError otherwise."""
    host, sep, port = text.rpartition(":")
    if not sep:
        if default_port is None:
            raise ValueError(f"address {text!r} must be HOST:PORT")
        host, port = text, str(default_port)
    if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"address {text!r} must be HOST:PORT with a port within 0..65535")
    return host, int(port)


async def _until_signalled() -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            return


TLSFiles = tuple[str, str, str | None]  # certificate, key, CA (None: system roots)


def _secure(manager: BrokerManager, tls: TLSFiles | None) -> None:
    if tls is not None:
        manager.net.tls_server, manager.net.tls_client = tls_contexts(*tls)


async def run_manager(universe: str, listen: Address, *, token: str = "",
                      expiry: float = DEFAULT_EXPIRY, scan_interval: float = DEFAULT_SCAN,
                      tls: TLSFiles | None = None, trace: TraceRecorder | None = None,
                      ready: Callable[[Address], None] = lambda address: None) -> None:
    manager = BrokerManager(universe, token=token, pump=Pump(trace=trace, name="manager"))
    _secure(manager, tls)
    service = NameService(manager, expiry=expiry, scan_interval=scan_interval)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(manager.pump.serve)
            address = await nursery.start(manager.serve_network, *listen)
            ready(address)
            await _until_signalled()
            service.close()
            nursery.cancel_scope.cancel()
    finally:
        manager.pump.close_trace()


async def _echo(queue: AsyncMessageQueue) -> None:
    try:
        async for message in queue:
            await queue.send(message)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass  # the peer went away; the link says why in its close reason


async def run_brokers(universe: str, broker_ids: list[str], managers: list[Address], *,
                      listen: Address = ("127.0.0.1", 0), token: str = "",
                      echo_ports: Sequence[int] = (), heartbeat: float = DEFAULT_HEARTBEAT,
                      ring_capacity: int | None = None, tls: TLSFiles | None = None,
                      plan: str | None = None, trace: TraceRecorder | None = None,
                      tracking: dict[str, Any] | None = None, busy_poll: float = 0.0,
                      ready: Callable[[Address], None] = lambda address: None) -> None:
    """Brokers of one process: registered with the managers, echoing on ``echo_ports``.

    With ``plan`` (a universe file) they play their roles in it instead and
    print ``stats {json}`` lines, then ``done {json}``, on stdout.  With
    ``tracking`` (keyword arguments of :class:`~brokermgr.tracking.TrackNode`
    plus ``topics``, topics to declare) every broker takes a tracking role;
    the first tracker of the process also answers as ``@tracker``.
    """
    spec = None
    if plan is not None:
        from ._universe import load_universe

        spec = load_universe(plan)
        unknown = [b for b in broker_ids if b not in spec.brokers]
        if unknown:
            raise ValueError(f"{plan}: no broker {unknown[0]!r} in the universe file")
        echo_ports = ()
    manager = BrokerManager(universe, token=token, ring_capacity=ring_capacity or
                            DEFAULT_RING_CAPACITY, busy_poll=busy_poll,
                            pump=Pump(trace=trace, name="+".join(broker_ids)))
    _secure(manager, tls)
    brokers = [manager.add_broker(b) for b in broker_ids]
    try:
        await _serve_brokers(manager, brokers, broker_ids, managers, listen, echo_ports,
                             heartbeat, spec, tracking, ready)
    finally:
        manager.pump.close_trace()


async def _serve_brokers(manager: BrokerManager, brokers: list[Any], broker_ids: list[str],
                         managers: list[Address], listen: Address, echo_ports: Sequence[int],
                         heartbeat: float, spec: Any, tracking: dict[str, Any] | None,
                         ready: Callable[[Address], None]) -> None:
    async with trio.open_nursery() as nursery:
        await nursery.start(manager.pump.serve)
        address = await nursery.start(manager.serve_network, *listen)
        for broker in brokers:
            for port in echo_ports:
                await nursery.start(broker.serve_queues, port, _echo)
        names = NameClient(manager, managers, heartbeat=heartbeat) if managers else None
        if names is not None:
            names.start()
        nodes = _start_tracking(manager, brokers, tracking) if tracking is not None else []
        ready(address)
        if spec is not None and names is not None:
            from ._up import play_plan

            def emit(kind: str, payload: dict[str, object]) -> None:
                print(kind, json.dumps(payload), flush=True)

            for b in broker_ids:
                nursery.start_soon(play_plan, spec, b, manager, names, nursery, emit)
        await _until_signalled()
        for node in nodes:
            node.close()
        if names is not None:
            names.close()
            await trio.sleep(0.05)  # let the unregister leave before the links are cut
        nursery.cancel_scope.cancel()


def _start_tracking(manager: BrokerManager, brokers: list[Any],
                    tracking: dict[str, Any]) -> list[Any]:
    from .tracking import TrackNode

    options = dict(tracking)
    topics = options.pop("topics", ())
    nodes = []
    for broker in brokers:
        node = TrackNode(broker, **options)
        if node.is_server:
            for topic in topics:
                node.declare_topic(topic)
        if node.is_tracker and TRACKER_ALIAS not in manager.aliases:
            manager.aliases[TRACKER_ALIAS] = broker.id
        nodes.append(node)
    return nodes


async def query_status(universe: str, manager_address: Address, *, token: str = "",
                       timeout: float = 5.0, tls: TLSFiles | None = None
                       ) -> list[dict[str, object]]:
    """The broker list of one manager; OSError when it cannot be reached or refuses us."""
    manager = BrokerManager(universe, token=token)
    _secure(manager, tls)
    async with trio.open_nursery() as nursery:
        await nursery.start(manager.pump.serve)
        await nursery.start(manager.serve_network, "127.0.0.1", 0)
        names = NameClient(manager, [manager_address], retry=timeout)
        session = names.sessions[0]
        names.start()
        with trio.move_on_after(timeout):
            while session.queue is None and session.last_refusal is None:
                await trio.sleep(0.01)
        if session.queue is None:
            why = session.last_refusal or "timed out"
            raise OSError(f"manager {manager_address[0]}:{manager_address[1]}: {why}")
        brokers = await names.list()
        names.close()
        nursery.cancel_scope.cancel()
    if brokers is None:
        raise OSError("the manager did not answer")
    return brokers
