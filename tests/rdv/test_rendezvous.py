"""The rendezvous between brokers on one pump: every refusal, with its reason."""

from __future__ import annotations

import pytest
import trio

from brokermgr import BrokerManager
from channels import MessageQueue
from pump import ListSink, Pump
from rdv import AcceptListener, ConnectListener, RdvUsageError


class Accepts(AcceptListener):
    def __init__(self) -> None:
        self.queues: list[MessageQueue] = []

    def accepted(self, queue: MessageQueue) -> None:
        self.queues.append(queue)


class Connects(ConnectListener):
    def __init__(self) -> None:
        self.outcomes: list[str] = []
        self.queues: list[MessageQueue] = []

    def connected(self, queue: MessageQueue) -> None:
        self.outcomes.append("connected")
        self.queues.append(queue)

    def refused(self, reason: str) -> None:
        self.outcomes.append(f"refused: {reason}")


def universe() -> tuple[Pump, BrokerManager]:
    pump = Pump()
    return pump, BrokerManager("u", pump=pump, ring_capacity=64)


def test_connect_to_a_bound_port_pairs_both_sides() -> None:
    pump, u = universe()
    server, client = u.add_broker("server"), u.add_broker("client")
    acc, con = Accepts(), Connects()
    server.bind(80, acc)
    client.connect("server", 80, con)
    pump.run_until_idle()
    assert con.outcomes == ["connected"]
    (q_server,), (q_client,) = acc.queues, con.queues
    assert (q_server.remote_id, q_client.remote_id) == ("client", "server")
    assert q_server.link_id == q_client.link_id and q_server.port == 80


# (what the server does first, connect target, expected outcome)
REFUSALS = [
    ("nothing", "server", "refused: not bound"),
    ("bind+accepted", "server", "refused: busy"),
    ("bind+unbind", "server", "refused: not bound"),
    ("bind", "nobody", "refused: unknown broker"),
]


@pytest.mark.parametrize(("setup", "target", "outcome"), REFUSALS)
def test_refusals_carry_their_reason(setup: str, target: str, outcome: str) -> None:
    pump, u = universe()
    server, client = u.add_broker("server"), u.add_broker("client")
    if setup.startswith("bind"):
        server.bind(80, Accepts())
    if setup == "bind+accepted":
        u.add_broker("first").connect("server", 80, Connects())
        pump.run_until_idle()
    if setup == "bind+unbind":
        server.unbind(80)
    con = Connects()
    client.connect(target, 80, con)
    pump.run_until_idle()
    assert con.outcomes == [outcome]


def test_a_connect_that_arrives_before_the_bind_is_refused_not_queued() -> None:
    pump, u = universe()
    server, client = u.add_broker("server"), u.add_broker("client")
    con = Connects()
    client.connect("server", 80, con)  # posted first ...
    server.bind(80, Accepts())         # ... but the bind happens before the task runs
    pump.run_until_idle()
    assert con.outcomes == ["connected"]
    con2 = Connects()
    client.connect("server", 81, con2)
    pump.run_until_idle()
    server.bind(81, Accepts())
    pump.run_until_idle()
    assert con2.outcomes == ["refused: not bound"]  # never retried behind the caller's back


def test_listen_re_arms_after_every_accept() -> None:
    pump, u = universe()
    server = u.add_broker("server")
    acc = Accepts()
    server.listen(80, acc)
    cons = [Connects() for _ in range(5)]
    for i, con in enumerate(cons):
        u.add_broker(f"c{i}").connect("server", 80, con)
    pump.run_until_idle()
    assert [c.outcomes for c in cons] == [["connected"]] * 5
    assert sorted(q.remote_id for q in acc.queues) == [f"c{i}" for i in range(5)]


def test_binding_a_bound_port_raises_and_unbinding_an_unbound_one_too() -> None:
    _, u = universe()
    server = u.add_broker("server")
    server.bind(80, Accepts())
    with pytest.raises(RdvUsageError, match="already bound"):
        server.bind(80, Accepts())
    with pytest.raises(RdvUsageError, match="already bound"):
        server.listen(80, Accepts())
    with pytest.raises(RdvUsageError, match="not bound"):
        server.unbind(81)


def test_bad_arguments_are_caught_at_the_call() -> None:
    _, u = universe()
    b = u.add_broker("b")
    with pytest.raises(TypeError, match="lacks refused"):
        b.connect("x", 1, type("OnlyConnected", (), {"connected": lambda s, q: None})())
    with pytest.raises(TypeError, match="lacks accepted"):
        b.bind(1, object())
    with pytest.raises(TypeError, match="broker id must be a str"):
        b.connect(42, 1, Connects())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="port must be within"):
        b.connect("x", 70000, Connects())


def test_duplicate_broker_ids_raise() -> None:
    _, u = universe()
    u.add_broker("dup")
    with pytest.raises(ValueError, match="already has a broker 'dup'"):
        u.add_broker("dup")
    with pytest.raises(ValueError, match="non-empty"):
        u.add_broker("")


def test_universes_on_one_pump_are_isolated() -> None:
    pump = Pump()
    u1 = BrokerManager("one", pump=pump)
    u2 = BrokerManager("two", pump=pump)
    u1.add_broker("server").bind(80, Accepts())
    u2.add_broker("server")  # same id in another universe is fine
    con = Connects()
    u2.add_broker("client").connect("server", 80, con)
    con_other = Connects()
    u2.broker("client").connect("nope", 80, con_other)
    pump.run_until_idle()
    assert con.outcomes == ["refused: not bound"]  # u2's server, not u1's
    assert con_other.outcomes == ["refused: unknown broker"]


def test_a_raising_accept_listener_fails_only_that_link() -> None:
    pump, u = universe()
    server = u.add_broker("server")

    class Bad(AcceptListener):
        def accepted(self, queue: MessageQueue) -> None:
            raise KeyError("oops")

    server.listen(80, Bad())
    server.listen(81, Accepts())
    con, con2 = Connects(), Connects()
    client = u.add_broker("client")
    client.connect("server", 80, con)
    client.connect("server", 81, con2)
    pump.run_until_idle()
    assert con.queues[0].closed
    assert "listener error" in (con.queues[0].close_reason or "")
    assert not con2.queues[0].closed
    assert server.ports == [80, 81]  # the broker itself is fine


def test_a_raising_refused_listener_fails_its_broker() -> None:
    pump, u = universe()
    client = u.add_broker("client")
    acc = Accepts()
    client.listen(9, acc)

    class Bad(Connects):
        def refused(self, reason: str) -> None:
            raise RuntimeError("cannot cope")

    client.connect("nobody", 80, Bad())
    pump.run_until_idle()
    assert client.closed and client.ports == []
    with pytest.raises(trio.BrokenResourceError, match="broker failed"):
        client.bind(10, Accepts())


def test_closing_a_broker_refuses_later_connects_as_unknown() -> None:
    pump, u = universe()
    server = u.add_broker("server")
    server.listen(80, Accepts())
    server.close()
    con = Connects()
    u.add_broker("client").connect("server", 80, con)
    pump.run_until_idle()
    assert con.outcomes == ["refused: unknown broker"]
    assert "server" not in u


def test_rendezvous_events_are_traced() -> None:
    sink = ListSink()
    pump = Pump(trace=sink)
    u = BrokerManager("u", pump=pump)
    u.add_broker("s").bind(80, Accepts())
    c = u.add_broker("c")
    c.connect("s", 80, Connects())
    c.connect("s", 80, Connects())
    pump.run_until_idle()
    seen = {(e.kind, e.broker, e.peer, e.port, e.reason) for e in sink.events}
    assert ("bind", "s", None, 80, None) in seen
    assert ("connect", "c", "s", 80, None) in seen
    assert ("accept", "s", "c", 80, None) in seen
    assert ("refuse", "c", "s", 80, "busy") in seen
