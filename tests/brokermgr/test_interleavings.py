"""Random interleavings of rendezvous calls, sends, closes and single pump steps.

Whatever the order, each connect ends exactly once, each link delivers a
prefix of what was sent on it (in order, exact bytes, no duplicates), a queue
closes at most once, and once the pump is idle a cleanly closed link has
delivered everything sent before the close.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from brokermgr import BrokerManager
from channels import MessageQueue, QueueFullError
from pump import Pump
from rdv import RdvUsageError

BROKERS = ["a", "b", "c"]
PORTS = [1, 2]


class End:
    """One side of a link as the test sees it."""

    def __init__(self, queue: MessageQueue) -> None:
        self.queue = queue
        self.sent: list[bytes] = []
        self.got: list[bytes] = []
        self.closes: list[str] = []
        self.peer: End | None = None
        self.closed_cleanly_at: int | None = None  # len(sent) when close() was called
        self.ended_here = False  # close() or abort() was called on this end
        queue.set_listener(self)

    def received(self, message: bytes) -> None:
        self.got.append(message)

    def closed(self, reason: str) -> None:
        self.closes.append(reason)


class Universe(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.pump = Pump(seed=1)
        self.u = BrokerManager("fuzz", pump=self.pump, ring_capacity=16, high_water=256)
        for b in BROKERS:
            self.u.add_broker(b)
        self.ends: dict[int, list[End]] = {}  # link id -> the two ends
        self.outcomes: list[list[str]] = []
        self.counter = 0

    # -- listeners -----------------------------------------------------------------

    def acceptor(self) -> object:
        machine = self

        class Acceptor:
            def accepted(self, queue: MessageQueue) -> None:
                machine.add_end(queue)

        return Acceptor()

    def connector(self) -> object:
        machine = self
        record: list[str] = []
        self.outcomes.append(record)

        class Connector:
            def connected(self, queue: MessageQueue) -> None:
                record.append("connected")
                machine.add_end(queue)

            def refused(self, reason: str) -> None:
                record.append(reason)

        return Connector()

    def add_end(self, queue: MessageQueue) -> None:
        end = End(queue)
        pair = self.ends.setdefault(queue.link_id, [])
        pair.append(end)
        if len(pair) == 2:
            pair[0].peer, pair[1].peer = pair[1], pair[0]

    # -- rules -----------------------------------------------------------------------

    @rule(b=st.sampled_from(BROKERS), port=st.sampled_from(PORTS), listen=st.booleans())
    def bind(self, b: str, port: int, listen: bool) -> None:
        broker = self.u.broker(b)
        try:
            (broker.listen if listen else broker.bind)(port, self.acceptor())
        except RdvUsageError:
            assert port in broker.ports

    @rule(b=st.sampled_from(BROKERS), port=st.sampled_from(PORTS))
    def unbind(self, b: str, port: int) -> None:
        broker = self.u.broker(b)
        try:
            broker.unbind(port)
        except RdvUsageError:
            assert port not in broker.ports

    @rule(src=st.sampled_from(BROKERS), dst=st.sampled_from(BROKERS + ["ghost"]),
          port=st.sampled_from(PORTS))
    def connect(self, src: str, dst: str, port: int) -> None:
        self.u.broker(src).connect(dst, port, self.connector())

    def all_ends(self) -> list[End]:
        return [e for pair in self.ends.values() for e in pair]

    @precondition(lambda self: bool(self.ends))
    @rule(data=st.data(), size=st.integers(0, 40), n=st.integers(1, 5))
    def send(self, data: st.DataObject, size: int, n: int) -> None:
        end = data.draw(st.sampled_from(self.all_ends()))
        for _ in range(n):
            self.counter += 1
            message = (b"%d:" % self.counter).ljust(size, b"m")
            try:
                end.queue.send(message)
            except QueueFullError:
                break
            except Exception:  # closed or broken links refuse, and that is all they do
                assert end.queue.closed or end.closed_cleanly_at is not None or \
                    end.queue._channel.peer_disconnected
                break
            end.sent.append(message)

    @precondition(lambda self: bool(self.ends))
    @rule(data=st.data(), clean=st.booleans())
    def close(self, data: st.DataObject, clean: bool) -> None:
        end = data.draw(st.sampled_from(self.all_ends()))
        end.ended_here = True
        if clean:
            if end.closed_cleanly_at is None and not end.queue.closed:
                end.closed_cleanly_at = len(end.sent)
            end.queue.close()
        else:
            end.queue.abort("test abort")

    @rule(steps=st.integers(1, 20))
    def run_a_little(self, steps: int) -> None:
        self.pump.run_until_idle(max_steps=steps)

    # -- invariants ------------------------------------------------------------------

    @invariant()
    def links_deliver_a_prefix_in_order(self) -> None:
        for end in self.all_ends():
            if end.peer is not None:
                assert end.got == end.peer.sent[:len(end.got)]
            assert len(end.closes) <= 1

    @invariant()
    def connects_end_at_most_once(self) -> None:
        for record in self.outcomes:
            assert len(record) <= 1
            assert not record or record[0] in ("connected", "not bound", "busy",
                                               "unknown broker")
        assert self.pump.failures == 0

    def teardown(self) -> None:
        self.pump.run_until_idle(max_steps=100_000)
        assert self.pump.pending() == 0
        for record in self.outcomes:
            assert len(record) == 1  # every connect ended
        for end in self.all_ends():
            peer = end.peer
            if peer is None:
                continue
            # A clean close that completed loses nothing sent before it, as long as the
            # peer was still there to read: it did not close or abort on its own (a
            # closing end drops what still arrives, by design).
            if end.queue.close_reason == "closed" and not peer.ended_here:
                assert (peer.queue.close_reason or "").startswith("peer disconnected (closed)")
                assert peer.got == end.sent


TestUniverse = Universe.TestCase
TestUniverse.settings = settings(stateful_step_count=40)
