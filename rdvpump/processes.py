"""Processes of a universe: a manager serving the name service, and a process of brokers
(``universe up``, :mod:`rdvpump.universe_up`, starts one of each per broker).  They run
until SIGINT or SIGTERM and then shut down cleanly (brokers unregister).
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from brokermgr import (
    DEFAULT_BROKER_EXPIRY,
    DEFAULT_HEARTBEAT,
    DEFAULT_SCAN_INTERVAL,
    BrokerManager,
    GroupMember,
    NameClient,
    NameService,
    echo,
)
from channels import DEFAULT_RING_CAPACITY
from pump import ConfigError, Pump, TraceRecorder
from rdv import Address, Refusal

from ._errors import RunError
from .admin import TLSFiles, tls_arguments
from .children import (
    DONE,
    ERROR,
    REPORT_EVERY,
    STATS,
    report,
    stop_signals,
)
from .universe_file import UniverseSpec, load_universe
from .workloads import Stats, drive, payloads, serve_role, sink_payloads

if TYPE_CHECKING:  # loaded by the brokers that take a tracking, MQ or cluster role
    from brokermgr.tracking import TrackNode
    from mq import ClusterConfig, ClusterNode, MqServer

    from .metrics import Metrics

#: Listen on loopback, on a port the kernel picks.
ANY_LOCAL = Address("127.0.0.1", 0)
log = logging.getLogger("rdvpump.mq")



#: Seconds ``broker run`` waits for a manager to accept its brokers before its ready
#: line when none answers (it goes on dialling).
REGISTER_WAIT = 2.0
#: Seconds a link to a manager or tracker that has not connected yet may fail for a reason
#: dialling may mend (a peer started beside this process and still starting) before a
#: warning says so.
STARTING_GRACE = 2.0


async def run_manager(universe: str, listen: Address, *, token: str = "",
                      identities: str | None = None,
                      expiry: float = DEFAULT_BROKER_EXPIRY,
                      scan_interval: float = DEFAULT_SCAN_INTERVAL,
                      tls: TLSFiles | None = None, trace: TraceRecorder | None = None,
                      metrics: Address | None = None,
                      ready: Callable[[Address], None] = lambda address: None) -> None:
    manager = BrokerManager(universe, token=token, pump=Pump(trace=trace, name="manager"),
                            identities=identities,
                            **tls_arguments(tls))
    service = NameService(manager, expiry=expiry, scan_interval=scan_interval)
    try:
        with stop_signals() as until_signalled:
            async with trio.open_nursery() as nursery:
                await nursery.start(manager.pump.serve)
                address = await nursery.start(manager.serve_network, *listen)
                watched = await start_metrics(nursery, manager, metrics, "manager")
                if watched is not None:
                    watched.watch(service)
                ready(address)
                await until_signalled()
                await service.aclose()  # the brokers hear a close, not a lost connection
                nursery.cancel_scope.cancel()
    finally:
        manager.pump.close_trace()


async def run_brokers(universe: str, broker_ids: list[str], managers: list[Address], *,
                      listen: Address = ANY_LOCAL, token: str = "",
                      identity: str | None = None, identities: str | None = None,
                      echo_ports: Sequence[int] = (), heartbeat: float = DEFAULT_HEARTBEAT,
                      ring_capacity: int | None = None, tls: TLSFiles | None = None,
                      plan: str | None = None, trace: TraceRecorder | None = None,
                      tracking: TrackingOptions | None = None, busy_poll: float = 0.0,
                      cluster: ClusterConfig | None = None, cluster_store: Path | None = None,
                      metrics: Address | None = None,
                      ready: Callable[[Address], None] = lambda address: None) -> None:
    """Brokers of one process: registered with the managers, echoing on ``echo_ports``.

    With ``plan`` (a universe file) they play their roles in it instead and
    print ``stats {json}`` lines, then ``done {json}``, on stdout.  With
    ``tracking`` (:class:`TrackingOptions`) every broker takes a tracking role;
    the first tracker of the process also answers as ``@tracker``.  With ``cluster``
    each broker is a server of that cluster, linked to every other (a line on stderr
    each time which peers are linked or the root changes), its epoch and vote kept in
    ``cluster_store``.  With ``metrics`` the process serves its Prometheus metrics there
    (:mod:`rdvpump.metrics`).
    """
    spec = None
    if plan is not None:
        spec = load_universe(plan)
        unknown = [b for b in broker_ids if b not in spec.brokers]
        if unknown:
            raise ConfigError(f"{plan}: no broker {unknown[0]!r} in the universe file")
        echo_ports = ()
    manager = BrokerManager(universe, token=token, identity=identity, identities=identities,
                            ring_capacity=ring_capacity or
                            DEFAULT_RING_CAPACITY, busy_poll=busy_poll,
                            pump=Pump(trace=trace, name="+".join(broker_ids)), **tls_arguments(tls))
    brokers = [manager.add_broker(b) for b in broker_ids]
    try:
        await _serve_brokers(manager, brokers, broker_ids, managers, listen, echo_ports,
                             heartbeat, spec, tracking, (cluster, cluster_store), metrics,
                             ready)
    finally:
        manager.pump.close_trace()


async def _serve_brokers(manager: BrokerManager, brokers: list[Any], broker_ids: list[str],
                         managers: list[Address], listen: Address, echo_ports: Sequence[int],
                         heartbeat: float, spec: Any, tracking: TrackingOptions | None,
                         clustering: tuple[ClusterConfig | None, Path | None],
                         metrics: Address | None, ready: Callable[[Address], None]) -> None:
    process = _BrokerProcess(manager, brokers, broker_ids, tracking)
    with stop_signals() as until_signalled:
        async with trio.open_nursery() as nursery:
            await nursery.start(manager.pump.serve)
            address = await nursery.start(manager.serve_network, *listen)
            for broker in brokers:
                for port in echo_ports:
                    await nursery.start(broker.serve_queues, port, echo)
            # the plan's roles are served before the brokers register: a broker that
            # others find by id serves what the plan says (or a stream's sender, let in
            # first, would be refused for a port not bound yet)
            plan_roles = {} if spec is None else {
                b: await serve_plan(spec, b, manager, nursery) for b in broker_ids}
            names = process.name_client(nursery, managers, heartbeat) if managers else None
            started = process.start_roles(nursery, names)
            cluster, store = clustering
            if cluster is not None:
                process.join_cluster(cluster, store, names)
            watched = await start_metrics(nursery, manager, metrics,
                                          "broker " + "+".join(broker_ids))
            if watched is not None:
                watched.watch(*started.nodes, *([] if names is None else [names.rdv]))
                watched.watch_mq(*started.servers.values(),
                                 *(server for _, found in plan_roles.values() for server in found))
                if names is not None:  # ``rdvpump status`` shows where
                    names.metrics = watched.address
                    names.register_now()
                for broker_id, member in process.clustered.items():
                    watched.watch_cluster(broker_id, member)

            async def announce() -> None:
                if names is not None:
                    # ready means registered: from the ready line on, other processes
                    # find these brokers by id; with no manager in reach, ready after a
                    # bound, dialling on.  A refusal for good ends the process with its
                    # reason, and no ready line: those brokers never were.
                    with trio.move_on_after(REGISTER_WAIT):
                        try:
                            await names.connected()
                        except ConnectionRefusedError:
                            return
                ready(address)
                if spec is not None and names is not None:
                    for b in broker_ids:
                        nursery.start_soon(play_plan, spec, b, manager, plan_roles[b][0],
                                           nursery, report)

            nursery.start_soon(announce)  # while a manager is out of reach, signals stop it
            await until_signalled()
            await process.stop(started, names)
            nursery.cancel_scope.cancel()
    if process.refused:
        raise RunError(process.refused[0])


class _BrokerProcess:
    """The brokers of one ``broker run`` process, and what serves them: the name client,
    tracking and MQ servers, a cluster's servers."""

    def __init__(self, manager: BrokerManager, brokers: list[Any], broker_ids: list[str],
                 tracking: TrackingOptions | None) -> None:
        self.manager = manager
        self.brokers = brokers
        self.broker_ids = broker_ids
        self.tracking = tracking
        self.group = None if tracking is None else tracking.group
        #: A final refusal (manager, tracker) ends the process with it.
        self.refused: list[str] = []
        self.servers: dict[str, MqServer] = {}  # a group member's MQ server, by broker id
        self.clustered: dict[str, ClusterNode] = {}  # a cluster's server, by broker id
        self.mq_servers: dict[str, MqServer] = {}  # every MQ server, by broker id

    def name_client(self, nursery: trio.Nursery, managers: list[Address],
                    heartbeat: float) -> NameClient:
        """The brokers' registrations with ``managers`` (not started yet), each link
        watched for a refusal for good."""
        ids, servers, clustered, group = self.broker_ids, self.servers, self.clustered, self.group

        def on_refused(manager_name: str, reason: str) -> None:
            self.refused.append(f"broker {'+'.join(ids)}: {manager_name} refused it: "
                                f"{reason}")
            nursery.cancel_scope.cancel()

        names = NameClient(self.manager, managers, heartbeat=heartbeat,
                           clusters=lambda b: clustered[b].info() if b in clustered else None,
                           groups=lambda b: servers[b].group if b in servers
                           else group if b in ids else None,
                           progress=lambda b: None if b not in servers or group is None
                           else servers[b].progress(),
                           on_refused=on_refused)
        for link in names.links:
            nursery.start_soon(_watch_link, link, "+".join(ids), self.refused,
                               nursery.cancel_scope)
        return names

    def start_roles(self, nursery: trio.Nursery, names: NameClient | None) -> _Tracking:
        """Tracking roles and MQ servers; then the registrations (once the MQ servers
        have read their topics: a group's member says how many records it holds from its
        first registration on, and a failover chooses by that); a member's role kept."""
        started = (_start_tracking(self.manager, self.brokers, self.tracking)
                   if self.tracking is not None else _Tracking())
        for node in started.nodes:  # a server's links to its trackers (--tracker)
            for publisher in node.server.publishers if node.server is not None else ():
                nursery.start_soon(_watch_link, publisher, node.broker.id, self.refused,
                                   nursery.cancel_scope)
        if self.group is not None:
            self.servers.update(started.servers)
        if names is not None:
            names.start()
        if self.group is not None and names is not None and started.servers:
            from mq import keep_role

            for server in started.servers.values():
                nursery.start_soon(keep_role, server, names)
        self.mq_servers = started.servers
        return started

    def join_cluster(self, cluster: ClusterConfig, store: Path | None,
                     names: NameClient | None) -> None:
        for b in self.brokers:
            server = self.mq_servers.get(b.id)
            self.clustered[b.id] = _cluster_node(b, cluster, store, server, names)
            if server is not None:
                server.join_cluster(self.clustered[b.id])

    async def stop(self, started: _Tracking, names: NameClient | None) -> None:
        for member in self.clustered.values():
            member.close()
        started.close()
        if names is not None:
            await names.aclose()  # the unregisters leave before the links are cut
        for broker in self.brokers:  # its other links end with a close frame, not a cut
            await broker.aclose("broker process stopped")


async def start_metrics(nursery: trio.Nursery, manager: BrokerManager, where: Address | None,
                        who: str) -> Metrics | None:
    """The process's metrics of ``manager``'s brokers served at ``where`` (None: off), with
    a line on stderr that says where."""
    if where is None:
        return None
    from .metrics import Metrics, serve_metrics

    metrics = Metrics(manager)
    metrics.address = await nursery.start(serve_metrics, metrics, where.host, where.port)
    print(f"{who}: metrics on http://{metrics.address}/metrics", file=sys.stderr, flush=True)
    return metrics


@dataclass(frozen=True)
class TrackingOptions:
    """A broker process's tracking role (``broker run --role``), and with ``mq_dir`` the
    settings of an MQ server on each of its server roles (None: the library's
    default)."""

    role: str
    port: int | None = None
    trackers: tuple[str, ...] = ()
    #: Topics each server role declares at start.
    topics: tuple[str, ...] = ()
    report_interval: float | None = None
    expiry: float | None = None
    scan_interval: float | None = None
    state_dir: Path | None = None
    mq_dir: Path | None = None
    durability: str = "sync"
    segment_bytes: int | None = None
    retain_bytes: int | None = None
    retain_age: float | None = None
    group: GroupMember | None = None
    replication: str = "async"
    min_insync: int = 1
    insync_lag: float | None = None
    group_beat: float | None = None
    group_silence: float | None = None

    def node(self) -> dict[str, Any]:
        """:class:`~brokermgr.tracking.TrackNode`'s keyword arguments (those set)."""
        chosen = {"port": self.port, "report_interval": self.report_interval,
                  "expiry": self.expiry, "scan_interval": self.scan_interval}
        return {"role": self.role, "trackers": self.trackers, "state_dir": self.state_dir,
                "group": self.group, **{k: v for k, v in chosen.items() if v is not None}}

    def server(self) -> dict[str, Any]:
        """:class:`~mq.MqServer`'s keyword arguments (those set)."""
        chosen = {"segment_bytes": self.segment_bytes, "insync_lag": self.insync_lag,
                  "group_beat": self.group_beat, "group_silence": self.group_silence}
        return {"durability": self.durability, "retain_bytes": self.retain_bytes,
                "retain_age": self.retain_age, "replication": self.replication,
                "min_insync": self.min_insync,
                **{k: v for k, v in chosen.items() if v is not None}}


@dataclass
class _Tracking:
    """What a broker process's tracking roles started: each broker's node, and its MQ
    server (with ``--mq-dir``) by broker id."""

    nodes: list[TrackNode] = field(default_factory=list)
    servers: dict[str, MqServer] = field(default_factory=dict)

    def close(self) -> None:
        """The MQ servers first (positions saved, files synced), then the nodes."""
        for server in self.servers.values():
            server.close()
        for node in self.nodes:
            node.close()


def _cluster_node(broker: Any, cluster: ClusterConfig, store: Path | None,
                  server: MqServer | None, names: NameClient | None) -> ClusterNode:
    """``broker`` as a server of ``cluster``, its epoch and vote kept in ``store``, the
    cluster's shared topics declared on its MQ ``server``; a line on stderr each time
    which peers are linked to it, or its root, changes, and a registration with the
    name service then (``rdvpump status`` shows the root and epoch)."""
    from mq import ClusterNode, declare_on

    said: list[str] = []

    def changed() -> None:
        line = f"broker {broker.id}: {node.summary()}"
        if not said or said[-1] != line:
            said.append(line)
            print(line, file=sys.stderr, flush=True)
            if names is not None:
                names.register_now()

    node = ClusterNode(broker, cluster, on_change=changed, store=store,
                       on_state=None if server is None else declare_on(server))
    return node


async def _watch_link(link: Any, brokers: str, refused: list[str],
                      scope: trio.CancelScope) -> None:
    """Say on stderr how a link the process keeps (to a manager, to a tracker) goes: a
    final refusal (unauthorized: the token or the universe name is not the other side's)
    ends the process; what may recover (unreachable, or a tracker not registered yet:
    unknown broker) is a warning each time the reason changes, while the link keeps
    dialling.  Until the link first connects, those wait :data:`STARTING_GRACE`: a
    manager or tracker started beside this process is not up yet, and says nothing
    wrong."""
    said: str | None = None
    started, linked = trio.current_time(), False
    while True:
        await link.attempted()
        reason = link.last_refusal
        if reason is None:
            if said is not None:
                print(f"broker {brokers}: connected to {link.name}", file=sys.stderr,
                      flush=True)
            said, linked = None, True
            continue
        if getattr(reason, "refusal", None) == Refusal.UNAUTHORIZED:
            side = link.name.split()[0]  # "manager" or "tracker"
            refused.append(f"broker {brokers}: {link.name} refused it: {reason} (the "
                           f"token or the universe name is not the {side}'s)")
            scope.cancel()
            return
        if not linked and trio.current_time() - started < STARTING_GRACE:
            continue
        if reason != said:
            said = reason
            print(f"warning: broker {brokers}: {link.name}: {reason}; dialling again "
                  f"(backing off up to {link.retry:g} s)", file=sys.stderr, flush=True)


def _start_tracking(manager: BrokerManager, brokers: list[Any],
                    tracking: TrackingOptions) -> _Tracking:
    """TrackNodes (and, with ``mq_dir``, an MQ server on each server role, its topics in
    ``mq_dir/<broker id>``)."""
    from brokermgr.tracking import TRACKER_ALIAS, TrackNode
    from mq import MqServer, ServiceError

    slave = tracking.group is not None and tracking.group.role == "slave"
    started = _Tracking()
    for broker in brokers:
        node = TrackNode(broker, **tracking.node())
        server = None
        if node.is_server and tracking.mq_dir is not None:
            server = MqServer(node, tracking.mq_dir / broker.id, **tracking.server())
            started.servers[broker.id] = server
        if node.is_server and not slave:  # a slave's topics are its master's
            for topic in tracking.topics:
                if server is not None:
                    try:
                        server.handle_local({"cmd": "declare", "topic": topic})
                    except ServiceError as exc:
                        if exc.status != 503:  # a topic on disk that cannot be opened:
                            raise  # reported, and the broker serves the others
                        log.error("%s", exc)
                else:
                    node.declare_topic(topic)
        if node.is_tracker and TRACKER_ALIAS not in manager.aliases:
            manager.aliases[TRACKER_ALIAS] = broker.id
        started.nodes.append(node)
    return started


async def serve_plan(spec: UniverseSpec, broker_id: str, manager: BrokerManager,
                     nursery: trio.Nursery) -> tuple[Stats, list[MqServer]]:
    """The child side, first: serve this broker's roles in the plan (each port bound when
    this returns); its stats, and the MQ servers among them (for the process's
    metrics)."""
    broker = manager.broker(broker_id)
    stats = Stats()
    servers: list[MqServer] = []
    serves, _ = spec.roles(broker_id)
    for kind, port in serves:
        await nursery.start(functools.partial(serve_role, broker, kind, port, stats,
                                              sink_payloads(spec, broker_id),
                                              watch=servers.append))
    return stats, servers


async def play_plan(spec: UniverseSpec, broker_id: str, manager: BrokerManager,
                    stats: Stats, nursery: trio.Nursery,
                    emit: Callable[[str, Mapping[str, object]], None]) -> None:
    """The child side, once registered: drive this broker's workloads (its roles served
    by :func:`serve_plan`), report."""
    broker = manager.broker(broker_id)
    _, drives = spec.roles(broker_id)

    async def report() -> None:
        while True:
            emit(STATS, stats.to_dict())
            await trio.sleep(REPORT_EVERY)

    nursery.start_soon(report)
    reports = []
    try:
        for w in drives:
            for t in w.targets:  # wait until the targets registered with a manager
                with trio.fail_after(30):
                    while await manager.resolver.resolve(t, fresh=True) is None:
                        await trio.sleep(0.05)
            reports.append((await drive(broker, w, stats, payloads(spec, w))).to_dict())
    except trio.TooSlowError:
        emit(ERROR, {"message": "its targets did not register with the manager in 30 s"})
        raise
    except Exception as exc:  # the parent stops the universe and says why
        emit(ERROR, {"message": str(exc) or type(exc).__name__})
        raise
    emit(STATS, stats.to_dict())  # the last figures, then the reports
    emit(DONE, {"reports": reports})
