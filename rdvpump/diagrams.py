"""The generated files of docs/diagrams: sequence diagrams drawn from real traces of
example scenarios, and the rendezvous state diagram drawn from its table.

``python -m rdvpump.diagrams`` writes them; a test fails when a committed one is stale.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from brokermgr import BrokerManager
from pump import Pump, open_trace
from rdv import state_diagram
from replay.diagram import connect_diagram, link_diagram, read_events

DOCS = Path(__file__).resolve().parents[1] / "docs" / "diagrams"


def _scenarios(directory: Path) -> Iterator[tuple[str, Path, str, str]]:
    """Run the example scenarios on a virtual clock; yield (name, trace, mode, target)."""
    # 1. bind, connect and accept, messages through a ring too small for them
    #    (partial writes), then a disconnect and the close on both ends.
    pump = Pump(trace=open_trace(directory, pump="link", run="example"), name="link")
    universe = BrokerManager("example", pump=pump, ring_capacity=16)
    server, client = universe.add_broker("server"), universe.add_broker("client")

    class Server:
        def accepted(self, queue: Any) -> None:
            queue.set_listener(self)

        def received(self, message: bytes) -> None:
            pass

        def closed(self, reason: str) -> None:
            pass

    class Client:
        def connected(self, queue: Any) -> None:
            queue.set_listener(self)
            queue.send(b"hello")
            queue.send(b"a message longer than the ring")
            queue.close("done")

        def refused(self, reason: str) -> None:
            raise AssertionError(reason)

        def received(self, message: bytes) -> None:
            pass

        def closed(self, reason: str) -> None:
            pass

    server.bind(80, Server())
    client.connect("server", 80, Client())
    pump.run_until_idle()
    pump.close_trace()
    yield "link-life", directory / "example.link.jsonl", "link", "server/1"

    # 2. a refused connect: nobody bound the port; then one to a broker that does not exist.
    pump = Pump(trace=open_trace(directory, pump="refused", run="example"), name="refused")
    universe = BrokerManager("example", pump=pump)
    a = universe.add_broker("a")
    universe.add_broker("b")

    class Refused:
        def connected(self, queue: Any) -> None:
            raise AssertionError("should be refused")

        def refused(self, reason: str) -> None:
            pass

    a.connect("b", 7, Refused())
    a.connect("nobody", 7, Refused())
    pump.run_until_idle()
    pump.close_trace()
    yield "refused-connect", directory / "example.refused.jsonl", "connect", "a"


def example_diagrams() -> dict[str, str]:
    """The example diagrams, by file name, generated now."""
    out = {}
    with tempfile.TemporaryDirectory(prefix="rdvpump-diagrams-") as tmp:
        for name, trace, mode, target in _scenarios(Path(tmp)):
            events = read_events(trace)
            out[f"{name}.mmd"] = (link_diagram(events, target) if mode == "link"
                                  else connect_diagram(events, target))
    return out


def generated_docs() -> dict[str, str]:
    """Every generated file of docs/diagrams, by name: from traces, and from tables."""
    return {**example_diagrams(), "rendezvous-states.mmd": state_diagram()}


def main() -> int:
    for name, text in generated_docs().items():
        (DOCS / name).write_text(text)
        print(f"wrote {DOCS / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
