"""Bad input on the network side: fuzzed peers over real sockets, and resource limits.

Every bad connection is closed with a logged reason while a healthy link on
the same server keeps going and loses nothing.
"""

from __future__ import annotations

import contextlib
import logging
import re

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from brokermgr import BrokerManager
from channels import CLOSE_MARK, AsyncMessageQueue
from pump import Pump
from rdv import AcceptListener, Hello
from rdv._wire import MAX_HANDSHAKE_SIZE

from .test_net import echo, two_processes_worth


async def test_at_the_cap_a_new_connection_evicts_the_oldest_pending_handshake(
        autojump_clock: object) -> None:
    ub = BrokerManager("u", pump=Pump(), token="t")
    ub.add_broker("server").bind(80, AcceptListener())
    ub.net.handshake_timeout = 5.0
    ub.net.max_pending = 2
    async with trio.open_nursery() as nursery:
        await nursery.start(ub.pump.serve)
        start = trio.current_time()
        ends: dict[int, float] = {}

        async def silent(n: int, task_status: trio.TaskStatus[None]) -> None:
            ours, theirs = trio.testing.memory_stream_pair()
            nursery.start_soon(ub.net.run_stream, ours)
            task_status.started()
            assert await theirs.receive_some(10) == b""
            ends[n] = trio.current_time() - start

        async with trio.open_nursery() as peers:
            for n in range(3):
                await peers.start(silent, n)
                await trio.testing.wait_all_tasks_blocked()
            # the cap is full of silent connections: a handshake still goes through, at once
            ours, theirs = trio.testing.memory_stream_pair()
            nursery.start_soon(ub.net.run_stream, ours)
            await theirs.send_all(Hello("u", "t", "legit", "server", 80).encode())
            assert b'"accepted":true' in await theirs.receive_some(100)
            assert trio.current_time() == start
        # the third evicted the first at once, the legit one the second; the third timed out
        assert ends == {0: 0.0, 1: 0.0, 2: pytest.approx(5.0)}
        assert ub.net.rejected == ["evicted before its handshake: 2 newer connections were "
                                   "pending"] * 2 + ["handshake timed out"]
        nursery.cancel_scope.cancel()


# -- hypothesis over a real socket ------------------------------------------------------

HELLO_BYTES = Hello("u", "s3cret", "x", "server", 80).encode()


def _after_hello(src: str, tail: bytes) -> bytes:
    return Hello("u", "s3cret", src, "server", 80).encode() + tail


#: One bad connection: what it sends, and whether it passes the handshake first.
bad_inputs = st.one_of(
    st.binary(max_size=300).map(lambda b: ("raw", b)),
    st.integers(0, len(HELLO_BYTES) - 1).map(lambda k: ("raw", HELLO_BYTES[:k])),
    st.integers(MAX_HANDSHAKE_SIZE + 1, 2**32 - 1).map(lambda n: ("raw", n.to_bytes(4, "big"))),
    st.integers(1, 3000).map(lambda depth: ("raw", _frame(b"[" * depth))),
    st.integers(1, 5000).flatmap(lambda n: st.integers(0, n - 1).map(
        lambda k: ("linked", n.to_bytes(4, "big") + b"\xab" * k))),
    st.integers(1, 3).map(lambda k: ("linked", b"\x00\x00\x00\x09"[:k])),
    # headers past the largest message: too long, or a close frame cut short (a bare
    # CLOSE_MARK is a whole close frame with no reason: the peer's close, not bad input)
    st.integers(16 * 1024 * 1024 + 1, 2**32 - 1).filter(lambda n: n != CLOSE_MARK).map(
        lambda n: ("linked", n.to_bytes(4, "big"))),
)


def _frame(body: bytes) -> bytes:
    return len(body).to_bytes(4, "big") + body


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(bad=st.lists(bad_inputs, min_size=1, max_size=4))
@example(bad=[("linked", (300).to_bytes(4, "big") + b"\xab" * 299)])  # more than the ring
@example(bad=[("raw", _frame(b"[" * 3000))])  # deeper than json's recursion limit
async def test_fuzzed_peers_are_closed_with_a_reason_while_a_healthy_link_loses_nothing(
        bad: list[tuple[str, bytes]]) -> None:
    records = _Records()
    logging.getLogger("rdvpump").addHandler(records)
    try:
        async with two_processes_worth(ring=256) as (ua, ub, nursery):
            ended: dict[str, str] = {}
            linked = {f"evil{n}" for n, (kind, _) in enumerate(bad) if kind == "linked"}
            all_ended = trio.Event()
            if not linked:
                all_ended.set()

            async def keep(q: AsyncMessageQueue) -> None:
                try:
                    async for m in q:
                        await q.send(m)
                except trio.BrokenResourceError as exc:
                    ended[q.remote_id] = str(exc)
                    if set(ended) >= linked:
                        all_ended.set()

            await nursery.start(ub.add_broker("server").serve_queues, 80, keep)
            healthy = await ua.add_broker("good").connect_queue("server", 80)
            host, port = ua.directory["server"]
            sent: list[bytes] = []
            stop = trio.Event()

            got: list[bytes] = []

            async def stream_healthy() -> None:
                i = 0
                while not stop.is_set():
                    message = i.to_bytes(4, "big") * (i % 50)
                    await healthy.send(message)
                    sent.append(message)
                    i += 1
                    if i % 20 == 0:
                        await trio.sleep(0)
                await healthy.send(b"end")

            async def receive_healthy() -> None:
                while (message := await healthy.receive()) != b"end":
                    got.append(message)

            async def evil(n: int, kind: str, payload: bytes) -> None:
                if kind == "linked":
                    payload = _after_hello(f"evil{n}", payload)
                with trio.fail_after(10):
                    stream = await trio.open_tcp_stream(host, port)
                    try:
                        with contextlib.suppress(trio.BrokenResourceError):
                            await stream.send_all(payload)
                            await stream.send_eof()
                            while await stream.receive_some(4096):
                                pass  # a linked peer gets its accepting reply first
                    finally:
                        await stream.aclose()

            rejected_before = len(ub.net.rejected)
            with trio.fail_after(20):
                async with trio.open_nursery() as inner:
                    inner.start_soon(stream_healthy)
                    inner.start_soon(receive_healthy)
                    for n, (kind, payload) in enumerate(bad):
                        await evil(n, kind, payload)
                    stop.set()
                await all_ended.wait()  # the server hears of each closed link
            assert sent and got == sent  # nothing lost, nothing reordered, nothing doubled

            handshake_bad = sum(1 for kind, _ in bad if kind == "raw")
            assert len(ub.net.rejected) - rejected_before == handshake_bad
            assert set(ended) == linked
            assert all(r.startswith("protocol error") for r in ended.values()), ended
            # each kind of failure is logged (repeats of a cause from one host are
            # collapsed into a count, logged when its window ends, whatever sizes or
            # ports their texts carry)
            for cause in ub.net.rejected_causes[rejected_before:]:
                assert any(f"({cause}): " in m for m in records.messages), cause
            logged = [re.sub(r"[0-9]+", "N", m) for m in records.messages]
            for reason in ended.values():
                kind = re.sub(r"[0-9]+", "N", reason.split(":")[0])
                assert any(kind in m for m in logged), reason
    finally:
        logging.getLogger("rdvpump").removeHandler(records)


async def test_a_peer_sending_one_byte_per_second_is_cut_at_the_handshake_timeout() -> None:
    async with two_processes_worth() as (ua, ub, nursery):
        ub.net.handshake_timeout = 1.5
        await nursery.start(ub.add_broker("server").serve_queues, 80, echo)
        healthy = await ua.add_broker("good").connect_queue("server", 80)
        host, port = ua.directory["server"]
        stream = await trio.open_tcp_stream(host, port)
        start = trio.current_time()
        try:
            with trio.fail_after(10):
                for i in range(len(HELLO_BYTES)):
                    try:
                        await stream.send_all(HELLO_BYTES[i:i + 1])
                    except trio.BrokenResourceError:
                        break
                    with trio.move_on_after(1):  # one byte per second, unless cut meanwhile
                        if await stream.receive_some(10) == b"":
                            break
                    await healthy.send(b"%d" % i)
                    assert await healthy.receive() == b"%d" % i
        finally:
            await stream.aclose()
        # cut at the timeout, not at the first byte: the server's timer counts from its
        # pump's time at the accept, which may be read a little before this side's start
        assert 1.4 <= trio.current_time() - start < 3.5
        assert ub.net.rejected == ["handshake timed out"]
