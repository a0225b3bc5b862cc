"""The world tracking tests run in: trackers, servers and clients on one pump, virtual clock.

Intervals are short (report 5 s, expiry 12 s, scan 2 s, retry 3 s) and time
only moves when the test runs the pump.
"""

from __future__ import annotations

from typing import Any

from brokermgr import BrokerManager
from brokermgr.tracking import RouteChange, RouteClient, ServerRole, TrackerRole, TrackNode

TIMING: dict[str, Any] = {"report_interval": 5.0, "expiry": 12.0, "scan_interval": 2.0,
                          "retry": 3.0}


class World:
    def __init__(self) -> None:
        self.universe = BrokerManager("tracking")
        self.pump = self.universe.pump
        self.nodes: dict[str, TrackNode] = {}
        self.log: list[tuple[float, str, str]] = []

    def node(self, name: str, role: str = "both", trackers: tuple[str, ...] = (),
             **options: Any) -> TrackNode:
        broker = self.universe.add_broker(name)
        node = TrackNode(broker, role=role, trackers=[f"{t}:15555" for t in trackers],
                         **{**TIMING, **options})
        self.nodes[name] = node
        return node

    def client(self, name: str, *trackers: str, **options: Any) -> RouteClient:
        client = RouteClient(self.universe.add_broker(name), retry=3.0, **options)

        def record(change: RouteChange) -> None:
            for a in change.joined:
                self.log.append((self.pump.now(), f"{name} join", a))
            for a in change.left:
                self.log.append((self.pump.now(), f"{name} leave", a))

        client.on_change(record)
        for t in trackers:
            client.add_tracker(f"{t}:15555")
        return client

    def run(self, seconds: float) -> None:
        self.pump.run_for(seconds)


def tracker_of(node: TrackNode) -> TrackerRole:
    """The node's tracker role (the node is a tracker)."""
    assert node.tracker is not None
    return node.tracker


def server_of(node: TrackNode) -> ServerRole:
    """The node's server role (the node is a server)."""
    assert node.server is not None
    return node.server


def servers(client: RouteClient) -> list[str]:
    return sorted(a.split(":")[0] for a in client.routes.server_table)


class SlowSubscriber:
    """A raw subscriber that sends ``request`` and then reads nothing until resumed."""

    def __init__(self, request: bytes) -> None:
        self.request = request
        self.got: list[bytes] = []

    def connected(self, queue: Any) -> None:
        self.queue = queue
        queue.set_listener(self)
        queue.send(self.request)
        queue.pause_reading()  # reads nothing for now

    def refused(self, reason: str) -> None:
        raise AssertionError(reason)

    def received(self, message: bytes) -> None:
        self.got.append(message)

    def closed(self, reason: str) -> None:
        raise AssertionError(reason)


def flood_a_slow_subscriber(request: bytes) -> tuple[World, TrackNode, SlowSubscriber]:
    """Small rings; a tracker, a server and a slow subscriber; 200 changes of a few KB
    each while the subscriber reads nothing."""
    world = World()
    world.universe = BrokerManager("tracking", ring_capacity=1024, high_water=4096)
    world.pump = world.universe.pump
    t1 = world.node("t1", role="tracker")
    s1 = world.node("s1", role="server", trackers=("t1",))
    slow = SlowSubscriber(request)
    world.universe.add_broker("slow").connect("t1", 15555, slow)
    world.run(0.1)
    for i in range(200):
        s1.declare_topic(f"topic-{i:04d}-" + "x" * 40)
        world.run(0.001)
    return world, t1, slow
