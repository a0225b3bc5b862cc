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
3. Subscriber traffic over a seeded churn (servers crash, restart, declare
   and remove topics, change consumer counts) on the virtual clock: bytes and
   messages the trackers send their subscribers with deltas, against zbus's
   full snapshots, the same churn in the same run; the clients' tables must
   end the same.
4. One change at 1,000 servers x 100 topics: the wall time until all 10 (``--subscribers``)
   subscribers' tables show it (the pump on its virtual clock, so only
   computing counts), and the bytes it costs against one full snapshot each.
"""

from __future__ import annotations

import logging
import random
import statistics
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

from .._errors import RunError


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


def _tracked_servers(universe: BrokerManager, tracker_ids: list[str], servers: int,
                     topics: int) -> list[TrackNode]:
    """The trackers, and ``servers`` servers of ``topics`` topics each reporting to them."""
    for t in tracker_ids:
        TrackNode(universe.add_broker(t), role="tracker")
    nodes = []
    for i in range(servers):
        node = TrackNode(universe.add_broker(f"s{i:04d}"), role="server",
                         trackers=[f"{t}:15555" for t in tracker_ids])
        for n in range(topics):
            node.declare_topic(f"topic-{n:03d}")
        nodes.append(node)
    return nodes


def crash_propagation(servers: int = 100, topics: int = 10, trackers: int = 2,
                      clients: int = 20) -> Iterator[RoutesResult]:
    """Virtual seconds from a server's failure (or hang) to its removal from every client."""
    universe = BrokerManager("bench-routes")
    pump = universe.pump
    tracker_ids = [f"t{i}" for i in range(trackers)]
    nodes = _tracked_servers(universe, tracker_ids, servers, topics)
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
                raise RunError(f"{address} still listed after {limit} s of pump time")
        return (max(gone_at[address].values()) - start, pump.step_number - steps0,
                time.perf_counter() - wall)

    def crash() -> None:
        raise RunError("crash")

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


def _churn(seed: int, *, deltas: bool, servers: int, trackers: int, clients: int,
           seconds: float, topics: int = 10) -> tuple[int, int, int, list[Any]]:
    """Bytes and messages trackers sent subscribers over a seeded churn, the number of
    churn steps, and the clients' final tables (servers and their topics)."""
    universe = BrokerManager("bench-churn")
    pump = universe.pump
    rng = random.Random(seed)
    tracker_ids = [f"t{i}" for i in range(trackers)]
    tracker_nodes = [TrackNode(universe.add_broker(t), role="tracker") for t in tracker_ids]
    running: dict[int, TrackNode] = {}

    def start(i: int) -> None:
        reports_to = [f"{t}:15555" for k, t in enumerate(tracker_ids) if k != i % trackers]
        node = TrackNode(universe.add_broker(f"s{i:04d}"), role="server",
                         trackers=reports_to or [f"{tracker_ids[0]}:15555"])
        for n in range(topics):
            node.declare_topic(f"topic-{n:03d}")
        running[i] = node

    for i in range(servers):
        start(i)
    route_clients = [RouteClient(universe.add_broker(f"c{c:03d}"), deltas=deltas)
                     for c in range(clients)]
    for client in route_clients:
        for t in tracker_ids:
            client.add_tracker(f"{t}:15555")
    pump.run_for(1)
    steps = 0
    end = pump.now() + seconds
    while pump.now() < end:
        pump.run_for(rng.uniform(0.5, 3.5))
        steps += 1
        what = rng.random()
        if what < 0.15 and len(running) > servers // 2:
            running.pop(rng.choice(sorted(running))).broker.close("crash")
        elif what < 0.3 and len(running) < servers:
            start(rng.choice([i for i in range(servers) if i not in running]))
        else:
            node = running[rng.choice(sorted(running))]
            topic = f"topic-{rng.randrange(topics + 5):03d}"
            held = node.server_info.topic_table
            if what < 0.5:
                node.declare_topic(topic)
            elif what < 0.6 and topic in held:
                node.remove_topic(topic)
            elif topic in held:
                node.update_group(topic, topic, consumers=[f"c{k}" for k in
                                                           range(rng.randrange(4))])
    pump.run_for(10)
    sent = sum(n.sent_bytes.get("track_pub", 0) + n.sent_bytes.get("track_delta", 0)
               for n in tracker_nodes)
    messages = sum(n.sent.get("track_pub", 0) + n.sent.get("track_delta", 0)
                   for n in tracker_nodes)
    tables = [sorted((a, sorted(i.topic_table)) for a, i in c.routes.server_table.items())
              for c in route_clients]
    universe.close()
    return sent, messages, steps, tables


def churn_traffic(servers: int = 50, trackers: int = 3, clients: int = 10,
                  seconds: float = 1000.0, seed: int = 1) -> Iterator[RoutesResult]:
    """Subscriber bytes with deltas against full snapshots, the same seeded churn."""
    full = _churn(seed, deltas=False, servers=servers, trackers=trackers, clients=clients,
                  seconds=seconds)
    delta = _churn(seed, deltas=True, servers=servers, trackers=trackers, clients=clients,
                   seconds=seconds)
    if delta[3] != full[3]:
        raise RunError("deltas and full snapshots ended with different route tables")
    yield RoutesResult(
        "churn-subscriber-bytes-deltas", servers, 10, delta[0], "bytes",
        "churn-subscriber-bytes-full-snapshots", full[0], full[0] / delta[0],
        {"trackers": trackers, "clients": clients, "virtual_s": seconds, "seed": seed,
         "churn_steps": delta[2], "messages": delta[1], "baseline_messages": full[1],
         "tables_equal": True})


def one_change(servers: int = 1000, topics: int = 100, subscribers: int = 10,
               changes: int = 20) -> Iterator[RoutesResult]:
    """Wall time and bytes for one server's change to reach every subscriber."""
    universe = BrokerManager("bench-one-change")
    pump = universe.pump
    tracker = TrackNode(universe.add_broker("t0"), role="tracker")
    nodes = []
    for i in range(servers):
        node = TrackNode(universe.add_broker(f"s{i:04d}"), role="server",
                         trackers=["t0:15555"])
        for n in range(topics):  # before its link opens: one report with all of them
            node.declare_topic(f"topic-{n:03d}")
        nodes.append(node)
    pump.run_for(1)
    route_clients = []
    for c in range(subscribers):
        client = RouteClient(universe.add_broker(f"c{c:03d}"))
        client.add_tracker("t0:15555")
        route_clients.append(client)
    pump.run_for(1)
    if not all(len(c.routes.server_table) == servers for c in route_clients):
        raise RunError("the subscribers did not get the whole table")
    assert tracker.tracker is not None
    snapshot_bytes = len(tracker.tracker.snapshot())
    walls = []
    sent0 = tracker.sent_bytes.get("track_delta", 0)
    for k in range(changes):
        node = nodes[(k * 37) % servers]
        topic = f"new-{k}"
        wall = time.perf_counter()
        node.declare_topic(topic)
        while not all(topic in c.routes.topic_table for c in route_clients):
            if not pump.step():
                raise RunError(f"{topic} never reached every subscriber")
        walls.append(time.perf_counter() - wall)
    # what the tracker sent all its subscribers for one change (it counts every send)
    per_change = (tracker.sent_bytes.get("track_delta", 0) - sent0) / changes
    yield RoutesResult(
        "one-change-to-every-subscriber-wall", servers, topics, statistics.median(walls), "s",
        "target", 0.05, 0.05 / statistics.median(walls),
        {"subscribers": subscribers, "changes": changes, "max_s": round(max(walls), 4),
         "snapshot_pieces": tracker.sent.get("track_pub", 0) // subscribers})
    yield RoutesResult(
        "one-change-subscriber-bytes-deltas", servers, topics, per_change,
        "bytes", "one-change-subscriber-bytes-full-snapshots", snapshot_bytes * subscribers,
        snapshot_bytes * subscribers / per_change,
        {"subscribers": subscribers, "full_snapshot_bytes": snapshot_bytes,
         "fits_one_message": snapshot_bytes <= 16 << 20})
    universe.close()


def run(servers: int = 1000, topics: int = 100, *, ops: int = 2000,
        churn_seconds: float = 1000.0, subscribers: int = 10,
        progress: Callable[[str], None] | None = None) -> Iterator[RoutesResult]:
    """Every figure of ``bench routes``; ``churn_seconds`` of virtual time for the churn."""
    quiet = logging.getLogger("rdvpump.tracking")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # the clock warning, drops and expiries: on purpose
    try:
        yield from _run(servers, topics, ops=ops, churn_seconds=churn_seconds,
                        subscribers=subscribers, progress=progress)
    finally:
        quiet.setLevel(level)


def _run(servers: int, topics: int, *, ops: int, churn_seconds: float, subscribers: int,
         progress: Callable[[str], None] | None) -> Iterator[RoutesResult]:
    if progress:
        progress(f"route table: {servers} servers x {topics} topics ...")
    yield from update_cost(servers, topics, ops=ops)
    if progress:
        progress("crash propagation on the virtual clock ...")
    yield from crash_propagation()
    if progress:
        progress("subscriber traffic over a churn, deltas and full snapshots ...")
    yield from churn_traffic(seconds=churn_seconds)
    if progress:
        progress(f"one change at {servers} servers x {topics} topics ...")
    yield from one_change(servers, topics, subscribers)
