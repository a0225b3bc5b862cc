"""Sequence diagrams drawn from real traces; the ones in docs/diagrams are never stale."""

from __future__ import annotations

import pathlib

from typer.testing import CliRunner

from rdvpump.cli import app
from rdvpump.diagrams import DOCS, example_diagrams, generated_docs

runner = CliRunner()


def test_every_generated_diagram_in_docs_is_current() -> None:
    generated = generated_docs()
    assert set(generated) == {p.name for p in DOCS.glob("*.mmd")}
    for name, text in generated.items():
        assert (DOCS / name).read_text() == text, (
            f"docs/diagrams/{name} is stale: run `python -m rdvpump.diagrams`")
    layers = generated["layers.mmd"]
    for edge in ("brokermgr --> rdv", "rdv --> channels", "channels --> pump",
                 "replay -->|trace schema only| pump"):
        assert edge in layers


def test_the_example_diagrams_in_docs_are_generated_from_real_traces() -> None:
    diagrams = example_diagrams()
    assert set(diagrams) == {"link-life.mmd", "refused-connect.mmd"}
    life = diagrams["link-life.mmd"]
    for step in ("bind(80)", "connect(server, 80)", "accepted (link server/1)",
                 "write 16 B (partial: the ring is full)", "read 16 B",
                 "deliver message 2 (30 B)", "disconnect: done", "closed: done"):
        assert step in life, step
    assert "refused: not bound" in diagrams["refused-connect.mmd"]
    assert "refused: unknown broker" in diagrams["refused-connect.mmd"]


def test_trace_diagram_cli(tmp_path: pathlib.Path) -> None:
    from brokermgr import BrokerManager
    from pump import Pump, open_trace

    pump = Pump(trace=open_trace(tmp_path, pump="p", run="r"), name="p")
    u = BrokerManager("u", pump=pump)
    a = u.add_broker("a")

    class Refused:
        def connected(self, queue: object) -> None:
            raise AssertionError("no broker b: must be refused")

        def refused(self, reason: str) -> None:
            pass

    a.connect("b", 1, Refused())
    pump.run_until_idle()
    pump.close_trace()
    trace = tmp_path / "r.p.jsonl"
    result = runner.invoke(app, ["trace", "diagram", str(trace), "--connects-of", "a"])
    assert result.exit_code == 0, result.output
    assert "rdv--xa: refused: unknown broker" in result.output
    result = runner.invoke(app, ["trace", "diagram", str(trace), "--link", "b/9"])
    assert result.exit_code == 1 and "no accept of link 'b/9'" in result.output
    result = runner.invoke(app, ["trace", "diagram", str(tmp_path / "none.jsonl"), "--link", "x"])
    assert result.exit_code == 1 and "no such trace file" in result.output


def test_trace_diagram_cuts_every_repeated_kind_where_it_is_cut(tmp_path: pathlib.Path) -> None:
    from brokermgr import BrokerManager
    from channels import MessageQueue
    from pump import Pump, open_trace

    pump = Pump(trace=open_trace(tmp_path, pump="p", run="r"), name="p")
    u = BrokerManager("u", pump=pump, ring_capacity=256)

    class Sink:
        def accepted(self, queue: MessageQueue) -> None:
            queue.set_listener(self)

        def received(self, message: bytes) -> None:
            pass

        def closed(self, reason: str) -> None:
            pass

    class Source(Sink):
        def connected(self, queue: MessageQueue) -> None:
            queue.set_listener(self)
            for _ in range(40):  # 40 messages through a small ring: many writes and reads
                queue.send(b"x" * 100)

        def refused(self, reason: str) -> None:
            raise AssertionError(reason)

        def drained(self) -> None:
            pass

    u.add_broker("b").listen(1, Sink())
    u.add_broker("a").connect("b", 1, Source())
    pump.run_until_idle()
    pump.close_trace()
    trace = str(tmp_path / "r.p.jsonl")
    cut = runner.invoke(app, ["trace", "diagram", trace, "--link", "b/1"])
    assert cut.exit_code == 0, cut.output
    lines = cut.output.splitlines()
    writes = [i for i, line in enumerate(lines) if "b: write" in line]  # a->>b or a-)b
    sends = [line for line in lines if "send message" in line]
    assert len(sends) == 3 and "... and 37 more send events a to b" in cut.output
    assert len(writes) == 3 and "more write events a to b" in cut.output
    more = next(i for i, line in enumerate(lines) if "more write events" in line)
    assert more > writes[-1]  # the note stands where the writes were cut
    every = runner.invoke(app, ["trace", "diagram", trace, "--link", "b/1", "--all"])
    assert sum("send message" in line for line in every.output.splitlines()) == 40
    assert "more" not in every.output
