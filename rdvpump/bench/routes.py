"""Route tables at scale, and how fast a server crash reaches every client.

1. Update cost, 1,000 servers x 100 topics (in one process, same run): one
   server's new ServerInfo merged incrementally (the topic index patched)
   against the same update followed by a full rebuild of the topic table
   (what zbus does on every change); and a tracker's full-snapshot
   TrackerInfo with one server changed, incrementally against with a rebuild.
2. Crash propagation, on the pump's virtual clock (so the figures are pump
   time, not this machine's speed): trackers, servers and clients in one
   universe; a server's broker fails and the time until every client's route
   table has dropped it is measured, beside a hung-but-connected server that
   only the expiry catches (zbus never drops that one).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from typing import Any

from brokermgr import BrokerManager
from brokermgr.tracking import (
    DEFAULT_SCAN_INTERVAL,
    DEFAULT_SERVER_EXPIRY,
    ConsumeGroupInfo,
    RouteChange,
    RouteClient,
    RouteTable,
    ServerAddress,
    ServerInfo,
    TopicInfo,
    TrackerInfo,
    TrackNode,
)


@dataclass
class RoutesResult:
    case: str
    servers: int
    topics: int
    value: float
    unit: str
    baseline: str
    baseline_value: float
    ratio: float | None
    detail: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["value"] = round(self.value, 9)
        d["baseline_value"] = round(self.baseline_value, 9)
        d["ratio"] = None if self.ratio is None else round(self.ratio, 2)
        return d


def make_server(i: int, topics: int, version: int) -> ServerInfo:
    address = ServerAddress(f"s{i:04d}:15555")
    table = {}
    for t in range(topics):
        name = f"topic-{t:03d}"
        table[name] = TopicInfo(address, name, "bench", 0, version % 7, (i + t) % 3,
                                (ConsumeGroupInfo(name, name, consumer_count=(i + t) % 3),))
    return ServerInfo(address, version, "bench", (), table)


def _per_op(fn: Callable[[int], object], ops: int) -> float:
    start = time.perf_counter()
    for k in range(ops):
        fn(k)
    return (time.perf_counter() - start) / ops


def update_cost(servers: int = 1000, topics: int = 100, ops: int = 2000,
                rebuild_ops: int = 40) -> Iterator[RoutesResult]:
    infos = [make_server(i, topics, 1) for i in range(servers)]
    tracker = ServerAddress("t1:15555")
    routes = RouteTable()
    routes.update_tracker("t1", TrackerInfo(tracker, 1, "bench",
                                            {s.server_address.address: s for s in infos}))
    assert sum(len(v) for v in routes.topic_table.values()) == servers * topics
    # new versions of every server, built before the clock starts
    fresh = [replace(s, info_version=s.info_version + 1 + k // servers)
             for k, s in enumerate(infos * (ops // servers + 1))]

    def incremental(k: int) -> None:
        routes.update_server(fresh[k])

    def rebuilt(k: int) -> None:
        routes.update_server(fresh[ops + k] if ops + k < len(fresh) else
                             replace(fresh[k % servers], info_version=10 ** 9 + k))
        routes.rebuild_topic_table()

    inc = _per_op(incremental, ops)
    full = _per_op(rebuilt, rebuild_ops)
    assert sum(len(v) for v in routes.topic_table.values()) == servers * topics
    yield RoutesResult("update-one-server-incremental", servers, topics, inc, "s/op",
                       "update-one-server-then-full-rebuild", full, full / inc,
                       {"ops": ops, "baseline_ops": rebuild_ops})

    # a full TrackerInfo (as trackers send it) with one server changed
    table = {s.server_address.address: s for s in infos}
    version = [10 ** 10]

    def snapshot(k: int) -> TrackerInfo:
        version[0] += 1
        changed = replace(infos[k % servers], info_version=version[0])
        table[changed.server_address.address] = changed
        return TrackerInfo(tracker, version[0], "bench", dict(table))

    snaps = [snapshot(k) for k in range(200)]
    snaps_rebuilt = [snapshot(k) for k in range(rebuild_ops)]
    merge = _per_op(lambda k: routes.update_tracker("t1", snaps[k]), len(snaps))

    def merge_rebuilt(k: int) -> None:
        routes.update_tracker("t1", snaps_rebuilt[k])
        routes.rebuild_topic_table()

    merge_full = _per_op(merge_rebuilt, rebuild_ops)
    yield RoutesResult("tracker-snapshot-one-changed-incremental", servers, topics, merge,
                       "s/op", "tracker-snapshot-then-full-rebuild", merge_full,
                       merge_full / merge, {"ops": len(snaps), "baseline_ops": rebuild_ops})


def crash_propagation(servers: int = 100, topics: int = 10, trackers: int = 2,
                      clients: int = 20) -> Iterator[RoutesResult]:
    """Virtual seconds from a server's failure (or hang) to its removal from every client."""
    universe = BrokerManager("bench-routes")
    pump = universe.pump
    tracker_ids = [f"t{i}" for i in range(trackers)]
    for t in tracker_ids:
        TrackNode(universe.add_broker(t), role="tracker")
    nodes = []
    for i in range(servers):
        node = TrackNode(universe.add_broker(f"s{i:04d}"), role="server",
                         trackers=[f"{t}:15555" for t in tracker_ids])
        for n in range(topics):
            node.declare_topic(f"topic-{n:03d}")
        nodes.append(node)
    gone_at: dict[str, dict[str, float]] = {}
    route_clients = []
    for c in range(clients):
        client = RouteClient(universe.add_broker(f"c{c:03d}"))

        def record(change: RouteChange, name: str = f"c{c:03d}") -> None:
            for address in change.left:
                gone_at.setdefault(address, {})[name] = pump.now()

        client.on_change(record)
        for t in tracker_ids:
            client.add_tracker(f"{t}:15555")
        route_clients.append(client)
    pump.run_for(1)
    assert all(len(c.routes.server_table) == servers for c in route_clients)

    def until_everyone_dropped(address: str, limit: float) -> tuple[float, int, float]:
        start, steps0, wall = pump.now(), pump.step_number, time.perf_counter()
        while len(gone_at.get(address, {})) < clients:
            if pump.now() - start > limit or not pump.step():
                raise RuntimeError(f"{address} still listed after {limit} s of pump time")
        return (max(gone_at[address].values()) - start, pump.step_number - steps0,
                time.perf_counter() - wall)

    def crash() -> None:
        raise RuntimeError("crash")

    quiet = logging.getLogger("rdvpump.pump")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)  # the crash is on purpose: no traceback on stderr
    try:
        pump.post("work", crash, owner=nodes[0].broker)
        crashed = until_everyone_dropped(nodes[0].address.address, 60)
    finally:
        quiet.setLevel(level)
    hung_node = nodes[1]
    assert hung_node.server is not None
    hung_node.server.pause_reports()  # hung: connected, silent
    pump.run_for(0)
    hung = until_everyone_dropped(hung_node.address.address, 10 * DEFAULT_SERVER_EXPIRY)
    yield RoutesResult(
        "server-crash-to-every-client", servers, topics, crashed[0], "pump s",
        "hung-server-to-every-client (expiry)", hung[0],
        # over memory links a crash costs no pump time at all: no finite ratio then
        crashed[0] / hung[0] if hung[0] > 0 else None,
        {"trackers": trackers, "clients": clients, "crash_pump_steps": crashed[1],
         "crash_wall_s": round(crashed[2], 4), "hung_pump_steps": hung[1],
         "expiry_s": DEFAULT_SERVER_EXPIRY, "scan_s": DEFAULT_SCAN_INTERVAL,
         "zbus_hung": "never dropped (no expiry)"})
    universe.close()


def run(servers: int = 1000, topics: int = 100, *, ops: int = 2000,
        progress: Callable[[str], None] | None = None) -> Iterator[RoutesResult]:
    if progress:
        progress(f"route table: {servers} servers x {topics} topics ...")
    yield from update_cost(servers, topics, ops=ops)
    if progress:
        progress("crash propagation on the virtual clock ...")
    yield from crash_propagation()
