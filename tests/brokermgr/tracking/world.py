"""The world tracking tests run in: trackers, servers and clients on one pump, virtual clock.

Intervals are short (report 5 s, expiry 12 s, scan 2 s, retry 3 s) and time
only moves when the test runs the pump.
"""

from __future__ import annotations

from typing import Any

from brokermgr import BrokerManager
from brokermgr.tracking import RouteChange, RouteClient, TrackNode

TIMING = {"report_interval": 5.0, "expiry": 12.0, "scan_interval": 2.0, "retry": 3.0}


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


def servers(client: RouteClient) -> list[str]:
    return sorted(a.split(":")[0] for a in client.routes.server_table)
