"""The rendezvous over TCP: real sockets on 127.0.0.1, and memory streams on the mock clock."""

from __future__ import annotations

import gc
import logging
import pathlib
import socket
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing

from brokermgr import BrokerManager
from channels import (
    PROCESS_FRAME_BUDGET,
    AsyncMessageQueue,
    CloseCause,
    Gather,
    close_frame,
    gather,
)
from channels._codec import RING_GROWTH_CAP
from channels._queue import DIRECT_MIN
from pump import ConfigError, Pump
from rdv import LOCAL_CONGESTION, Address, Hello, RefusedError, is_loopback, tls_contexts
from tests.ports import free_port


@asynccontextmanager
async def two_processes_worth(ring: int = 64, token_b: str = "s3cret",
                              universe_b: str = "u") -> AsyncIterator[
        tuple[BrokerManager, BrokerManager, trio.Nursery]]:
    """Two halves of a universe, each on its own pump, linked only by TCP on 127.0.0.1."""
    ua = BrokerManager("u", pump=Pump(name="A"), token="s3cret", ring_capacity=ring)
    ub = BrokerManager(universe_b, pump=Pump(name="B"), token=token_b, ring_capacity=ring)
    async with trio.open_nursery() as nursery:
        await nursery.start(ua.pump.serve)
        await nursery.start(ub.pump.serve)
        ua.directory["server"] = await nursery.start(ub.serve_network)
        await nursery.start(ua.serve_network)
        yield ua, ub, nursery
        nursery.cancel_scope.cancel()


async def echo(queue: AsyncMessageQueue) -> None:
    async for message in queue:
        await queue.send(message)


@pytest.mark.parametrize(("ring", "max_size"), [(4, 300), (64, 10 * 1024), (65536, 10 * 1024)])
async def test_echo_over_tcp_loses_nothing(ring: int, max_size: int) -> None:
    async with two_processes_worth(ring) as (ua, ub, nursery):
        await nursery.start(ub.add_broker("server").serve_queues, 80, echo)
        client = ua.add_broker("client")
        rng = ua.pump.random
        for _ in range(2):
            async with await client.connect_queue("server", 80) as q:
                assert q.remote_id == "server"
                sent = [rng.randbytes(rng.randint(0, max_size)) for _ in range(40)]
                async with trio.open_nursery() as inner:

                    async def send_all(q: AsyncMessageQueue = q,
                                       sent: list[bytes] = sent) -> None:
                        for m in sent:
                            await q.send(m)

                    inner.start_soon(send_all)
                    got = [await q.receive() for _ in sent]
                assert got == sent


@pytest.mark.parametrize(("setup", "target", "port", "reason"), [
    ("none", "server", 80, "not bound"),
    ("bind+accepted", "server", 80, "busy"),
    ("bind", "ghost", 80, "unknown broker"),
])
async def test_refusals_cross_the_wire_with_their_reason(
        setup: str, target: str, port: int, reason: str) -> None:
    async with two_processes_worth() as (ua, ub, _):
        server = ub.add_broker("server")
        ua.directory["ghost"] = ua.directory["server"]  # the address answers, the id does not

        class Keep:
            def accepted(self, queue: object) -> None:
                pass

        if setup.startswith("bind"):
            server.bind(80, Keep())
        if setup == "bind+accepted":
            await ua.add_broker("first").connect_queue("server", 80)
        with pytest.raises(RefusedError) as info:
            await ua.add_broker("client").connect_queue(target, port)
        assert info.value.reason == reason
        assert info.value.refusal == reason  # typed: a Refusal, equal to its text


@pytest.mark.parametrize(("token", "universe"), [("wrong", "u"), ("s3cret", "other")])
async def test_wrong_token_or_universe_is_unauthorized_and_nothing_else(
        token: str, universe: str) -> None:
    async with two_processes_worth(token_b=token, universe_b=universe) as (ua, ub, nursery):
        await nursery.start(ub.add_broker("server").serve_queues, 80, echo)
        with pytest.raises(RefusedError) as info:
            await ua.add_broker("client").connect_queue("server", 80)
        assert info.value.reason == "unauthorized"  # not "busy", "not bound", ...
        assert ub.net.rejected[-1] == "unauthorized connect from 'client' to 'server'"


async def test_an_address_nobody_listens_on_is_unreachable() -> None:
    free = free_port()  # free a moment ago, and no one is handed it meanwhile
    async with two_processes_worth() as (ua, _, _):
        ua.directory["far"] = Address("127.0.0.1", free)
        with pytest.raises(RefusedError, match="unreachable"):
            await ua.add_broker("client").connect_queue("far", 80)


async def test_garbage_peer_is_closed_and_a_healthy_link_goes_on() -> None:
    async with two_processes_worth() as (ua, ub, nursery):
        await nursery.start(ub.add_broker("server").serve_queues, 80, echo)
        q = await ua.add_broker("client").connect_queue("server", 80)
        host, port = ua.directory["server"]
        for garbage in (b"\xff" * 64, b"\x00\x00\x00\x05nope!", b"GET / HTTP/1.1\r\n\r\n"):
            stream = await trio.open_tcp_stream(host, port)
            await stream.send_all(garbage)
            assert await stream.receive_some(100) == b""  # closed on us, nothing revealed
            await stream.aclose()
            await q.send(b"still here")
            assert await q.receive() == b"still here"
        assert len(ub.net.rejected) == 3
        assert "exceeds" in ub.net.rejected[0] and "not JSON" in ub.net.rejected[1]


async def test_a_bad_frame_on_an_established_tcp_link_closes_only_that_link() -> None:
    async with two_processes_worth() as (ua, ub, nursery):
        server = ub.add_broker("server")
        ended: dict[str, str] = {}

        async def keep(q: AsyncMessageQueue) -> None:
            try:
                async for m in q:
                    await q.send(m)
            except trio.BrokenResourceError as exc:
                ended[q.remote_id] = str(exc)

        await nursery.start(server.serve_queues, 80, keep)
        good = await ua.add_broker("good").connect_queue("server", 80)
        host, port = ua.directory["server"]
        evil = await trio.open_tcp_stream(host, port)
        await evil.send_all(Hello("u", "s3cret", "evil", "server", 80).encode())
        reply = await evil.receive_some(100)
        assert b'"accepted":true' in reply
        await evil.send_all((1 << 30).to_bytes(4, "big"))  # a length past the maximum
        said = b""
        with trio.fail_after(5):
            while chunk := await evil.receive_some(1000):
                said += chunk  # up to the end of stream: the server ended that link
        why = "protocol error: frame of 1073741824 bytes exceeds max_message_size 16777216"
        assert said == close_frame(why, "protocol error")  # and said why, on the wire
        await evil.aclose()
        await good.send(b"fine")
        assert await good.receive() == b"fine"
        assert ended == {"evil": "protocol error: frame of 1073741824 bytes exceeds "
                                 "max_message_size 16777216"}


async def test_a_reset_connection_is_lost_not_a_clean_end() -> None:
    """A peer whose connection is reset, or ends without a close frame (as when its process
    dies), breaks the link with CloseCause.LOST; one that sends a close frame first ends
    it with the cause and the reason the frame says."""
    async with two_processes_worth() as (ua, ub, nursery):
        server = ub.add_broker("server")
        ended: dict[str, tuple[CloseCause | None, str]] = {}
        done = trio.Event()

        async def keep(q: AsyncMessageQueue) -> None:
            try:
                async for _ in q:
                    pass
                ended[q.remote_id] = (q.close_cause, "end of channel")
            except trio.BrokenResourceError as exc:
                ended[q.remote_id] = (q.close_cause, str(exc))
            if len(ended) == 3:
                done.set()

        await nursery.start(server.serve_queues, 80, keep)
        host, port = ua.directory["server"]
        for who in ("reset", "eof", "clean"):
            peer = await trio.open_tcp_stream(host, port)
            await peer.send_all(Hello("u", "s3cret", who, "server", 80).encode())
            assert b'"accepted":true' in await peer.receive_some(100)
            await peer.send_all(b"\x00\x00\x00\x02hi")
            if who == "reset":  # SO_LINGER 0: close() sends a reset
                peer.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                       struct.pack("ii", 1, 0))
            if who == "clean":
                await peer.send_all(close_frame("done for today", "clean"))
            await peer.aclose()
        with trio.fail_after(5):
            await done.wait()
        assert ended["reset"][0] is CloseCause.LOST and "connection lost" in ended["reset"][1]
        assert ended["eof"] == (CloseCause.LOST, "connection lost: the peer's end closed "
                                                 "without a close frame")
        assert ended["clean"] == (CloseCause.CLEAN, "end of channel")


async def test_silent_and_slow_peers_time_out_on_the_mock_clock(autojump_clock: object) -> None:
    ub = BrokerManager("u", pump=Pump(), token="t")
    ub.net.handshake_timeout = 2.0
    async with trio.open_nursery() as nursery:
        await nursery.start(ub.pump.serve)
        ours, theirs = trio.testing.memory_stream_pair()
        start = trio.current_time()
        nursery.start_soon(ub.net.run_stream, ours)
        assert await theirs.receive_some(10) == b""  # silent: cut after the timeout
        assert trio.current_time() - start == pytest.approx(2.0)
        ours, theirs = trio.testing.memory_stream_pair()
        nursery.start_soon(ub.net.run_stream, ours)
        hello = Hello("u", "t", "slow", "x", 1).encode()
        for i in range(len(hello)):  # one byte per second
            try:
                await theirs.send_all(hello[i:i + 1])
            except trio.BrokenResourceError:
                break
            await trio.sleep(1)
        assert i < len(hello) - 1
        assert ub.net.rejected == ["handshake timed out", "handshake timed out"]
        nursery.cancel_scope.cancel()


def use_tls(u: BrokerManager, pki: dict[str, str], ca: str = "ca") -> None:
    from rdv import tls_contexts

    u.net.tls_server, u.net.tls_client = tls_contexts(pki["cert"], pki["key"], pki[ca])


async def test_links_over_tls_with_mutual_certificates(pki: dict[str, str]) -> None:
    async with two_processes_worth() as (ua, ub, nursery):
        use_tls(ua, pki)
        use_tls(ub, pki)
        await nursery.start(ub.add_broker("server").serve_queues, 80, echo)
        async with await ua.add_broker("client").connect_queue("server", 80) as q:
            for size in (0, 1, 5000, 70_000):
                await q.send(b"s" * size)
                assert await q.receive() == b"s" * size


def test_a_connection_that_fails_says_why_in_words() -> None:
    """An OS error of a connect (a name that does not resolve, a reset) is its words, as
    the rest of a refusal's reason is, not Python's ``[Errno -2] ...``."""
    from rdv._net import _failure

    assert _failure(socket.gaierror(-2, "Name or service not known")) == \
        "name or service not known"
    assert _failure(ConnectionResetError(104, "Connection reset by peer")) == \
        "connection reset by peer"
    assert _failure(OSError("all attempts to connect to 127.0.0.1:1 failed")) == \
        "all attempts to connect to 127.0.0.1:1 failed"
    assert _failure(trio.TooSlowError()) == "timed out"


def test_tls_files_that_are_not_what_they_should_be_are_named(
        pki: dict[str, str], tmp_path: pathlib.Path) -> None:
    """A certificate and key that do not go together, and a CA file without a
    certificate, are each a ConfigError naming the files (OpenSSL's own error names
    none of them)."""
    junk = tmp_path / "junk.pem"
    junk.write_text("junk\n")
    with pytest.raises(ConfigError, match=f"^{junk} and {pki['key']} are not a PEM "
                       "certificate and its private key$"):
        tls_contexts(str(junk), pki["key"], pki["ca"])
    with pytest.raises(ConfigError, match=f"^{pki['cert']} and {pki['cert']} are not a "
                       r"PEM certificate and its private key( \(.+\))?$"):
        tls_contexts(pki["cert"], pki["cert"], pki["ca"])
    with pytest.raises(ConfigError, match=f"^{junk} holds no PEM certificate of a CA "
                       r"\(no certificate or crl found\)$"):
        tls_contexts(pki["cert"], pki["key"], str(junk))


async def test_tls_refuses_peers_it_cannot_verify(pki: dict[str, str]) -> None:
    async with two_processes_worth() as (ua, ub, nursery):
        use_tls(ub, pki)
        use_tls(ua, pki, ca="other_ca")  # trusts another CA: the server's cert fails
        await nursery.start(ub.add_broker("server").serve_queues, 80, echo)
        with pytest.raises(RefusedError, match="tls handshake failed"):
            await ua.add_broker("client").connect_queue("server", 80)
        ua.net.tls_server = ua.net.tls_client = None  # plain TCP to a TLS server
        with pytest.raises(RefusedError, match="unreachable"):
            await ua.add_broker("plain").connect_queue("server", 80)
        assert any("tls handshake failed" in r for r in ub.net.rejected)


async def test_busy_polling_links_lose_nothing_close_cleanly_and_let_timers_run() -> None:
    ua = BrokerManager("u", pump=Pump(name="A"), token="s3cret", busy_poll=0.02)
    ub = BrokerManager("u", pump=Pump(name="B"), token="s3cret", busy_poll=0.02)
    async with trio.open_nursery() as nursery:
        await nursery.start(ua.pump.serve)
        await nursery.start(ub.pump.serve)
        ua.directory["server"] = await nursery.start(ub.serve_network)
        await nursery.start(ua.serve_network)
        ended = trio.Event()

        async def echo_until_closed(queue: AsyncMessageQueue) -> None:
            await echo(queue)  # ends when the client closes its end
            ended.set()

        await nursery.start(ub.add_broker("server").serve_queues, 80, echo_until_closed)
        q = await ua.add_broker("client").connect_queue("server", 80)
        sent = [bytes([i]) * (i * 97) for i in range(200)]
        for m in sent:
            await q.send(m)
        assert [await q.receive() for _ in sent] == sent
        start = trio.current_time()
        with trio.fail_after(2):  # the idle links poll, then sleep: timers still run
            await trio.sleep(0.05)
        assert trio.current_time() - start < 1
        await q.aclose()
        with trio.fail_after(5):
            await ended.wait()
        nursery.cancel_scope.cancel()
    with pytest.raises(ValueError, match="busy_poll"):
        BrokerManager("u", busy_poll=-1)


@pytest.mark.parametrize("how", ["close", "abort"])
async def test_the_reason_of_a_close_crosses_tcp(how: str) -> None:
    """close(reason) and abort(reason) on one side: the peer across TCP gets that reason
    and cause, after every message sent before a close."""
    async with two_processes_worth() as (ua, ub, nursery):
        server = ub.add_broker("server")
        heard: list[object] = []
        done = trio.Event()

        async def keep(q: AsyncMessageQueue) -> None:
            try:
                async for message in q:
                    heard.append(message)
            except trio.BrokenResourceError:
                heard.append("broken")
            heard.append((q.close_cause, q.close_reason))
            done.set()

        await nursery.start(server.serve_queues, 80, keep)
        queue = await ua.add_broker("client").connect_queue("server", 80)
        for n in range(100):
            await queue.send(b"%d" % n)
        if how == "close":
            queue.queue.close("shutting down for maintenance")
        else:
            queue.queue.abort("gave up")
        with trio.fail_after(5):
            await done.wait()
    if how == "close":
        assert heard == [b"%d" % n for n in range(100)] + [
            (CloseCause.CLEAN, "peer disconnected (shutting down for maintenance)")]
    else:
        assert heard[-2] == "broken" and heard[-1][0] is CloseCause.ABORTED  # type: ignore[index]
        assert heard[-1][1].startswith("peer disconnected (gave up")  # type: ignore[index]


def test_a_flood_of_one_warning_is_one_line_then_a_count(caplog: pytest.LogCaptureFixture
                                                        ) -> None:
    from pump import CollapsingLog

    pump = Pump()
    logger = logging.getLogger("rdvpump.test-collapse")
    warnings = CollapsingLog(logger, pump, window=10.0)
    with caplog.at_level(logging.WARNING, logger=logger.name):
        for n in range(1000):
            warnings.warn(("garbage", "10.0.0.9"), f"closed a connection from 10.0.0.9:{n}")
        warnings.warn(("garbage", "10.0.0.7"), "closed a connection from 10.0.0.7:1")
        pump.run_until_idle()  # the window ends on the pump's clock
        warnings.warn(("garbage", "10.0.0.9"), "closed a connection from 10.0.0.9:5000")
    assert [r.getMessage() for r in caplog.records] == [
        "closed a connection from 10.0.0.9:0",
        "closed a connection from 10.0.0.7:1",
        "999 more like this in the last 10 s (the last: closed a connection from "
        "10.0.0.9:999)",
        "closed a connection from 10.0.0.9:5000",  # a new window
    ]


async def test_a_reset_during_a_plain_handshake_says_nothing_of_tls() -> None:
    async with two_processes_worth() as (ua, ub, nursery):
        host, port = ua.directory["server"]
        peer = await trio.open_tcp_stream(host, port)
        await peer.send_all(Hello("u", "s3cret", "x", "server", 80).encode()[:10])
        peer.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        await peer.aclose()
        with trio.fail_after(5):
            while not ub.net.rejected:
                await trio.sleep(0.01)
        assert ub.net.rejected[-1].startswith("connection lost: ")
        assert "tls" not in ub.net.rejected[-1].lower()


async def test_a_tcp_links_receive_ring_grows_to_hold_two_long_frames_a_memory_ones_never(
) -> None:
    """Frames longer than the ring arrive in pieces at first; then the ring grows to hold
    two of them whole (by what arrived, within the process's budget, which gets the
    bytes back once the ring is freed).  A memory link's rings (another writer in the
    process keeps their size) never grow."""
    budget = PROCESS_FRAME_BUDGET
    gc.collect()  # rings an earlier test left behind are freed before, not during, this one
    grown_before = budget.grown
    async with two_processes_worth(ring=1024) as (ua, ub, nursery):
        await nursery.start(ub.add_broker("server").serve_queues, 80, echo)
        client = ua.add_broker("client")
        async with await client.connect_queue("server", 80) as q:
            assert q.statistics().receive_ring == 1024
            assert q.queue.whole_frame_bytes == RING_GROWTH_CAP  # what the far end's ring grows to
            await q.send(b"s" * 1000)  # fits the ring whole: nothing grows
            assert await q.receive() == b"s" * 1000
            assert q.statistics().receive_ring == 1024
            sent = [bytes([i]) * 3000 for i in range(8)]
            for message in sent:
                await q.send(message)
            assert [await q.receive() for _ in sent] == sent
            assert q.statistics().receive_ring == 8192  # 2 x 3004 bytes, a power of two
            assert budget.grown - grown_before == 2 * (8192 - 1024)  # both ends grew
            await nursery.start(ua.add_broker("local").serve_queues, 81, echo)
            async with await client.connect_queue("local", 81) as local:
                await local.send(b"m" * 3000)
                assert await local.receive() == b"m" * 3000
                assert local.statistics().receive_ring == 1024
                assert local.queue.whole_frame_bytes == 1024
    del ua, ub, client, q, local
    gc.collect()  # the rings are freed with their links
    assert budget.grown == grown_before


async def test_a_ring_does_not_grow_past_the_process_budget() -> None:
    budget = PROCESS_FRAME_BUDGET
    limit = budget.ring_limit
    gc.collect()  # rings an earlier test left behind give their growth back first
    budget.ring_limit = budget.grown + 4096  # room for one ring's growth, not two
    try:
        async with two_processes_worth(ring=1024) as (ua, ub, nursery):
            await nursery.start(ub.add_broker("server").serve_queues, 80, echo)
            async with await ua.add_broker("client").connect_queue("server", 80) as q:
                for _ in range(3):
                    await q.send(b"x" * 1500)  # 2 x 1504: a ring of 4096 holds two
                    assert await q.receive() == b"x" * 1500
                assert q.statistics().receive_ring == 1024  # the server's end took it
    finally:
        budget.ring_limit = limit


def _congestion(queue: AsyncMessageQueue) -> str:
    """The congestion control of the socket under a TCP link's queue."""
    link = queue.queue._channel._peer  # the StreamLink that carries the link's bytes
    sock = link.stream.socket  # type: ignore[union-attr]
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).rstrip(b"\0").decode()


@pytest.mark.skipif(not hasattr(socket, "TCP_CONGESTION"), reason="no TCP_CONGESTION here")
async def test_a_link_within_one_host_paces_nothing_from_its_first_byte() -> None:
    """Both ends of a link over 127.0.0.1 run LOCAL_CONGESTION (Reno) whatever the
    system's default (BBR on some hosts, whose pacing costs a local link CPU for
    nothing), set before the connection was made: the dialler's socket before it
    connected, the listener before it accepted."""
    async with two_processes_worth() as (ua, ub, nursery):
        served: list[AsyncMessageQueue] = []

        async def keep(queue: AsyncMessageQueue) -> None:
            served.append(queue)
            await echo(queue)

        await nursery.start(ub.add_broker("server").serve_queues, 80, keep)
        async with await ua.add_broker("client").connect_queue("server", 80) as q:
            await q.send(b"ping")
            assert await q.receive() == b"ping"
            assert (_congestion(q), _congestion(served[0])) == (LOCAL_CONGESTION, LOCAL_CONGESTION)


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.8.9.10", True), ("::1", True), ("::ffff:127.0.0.1", True),
    ("10.0.0.1", False), ("::ffff:10.0.0.1", False), ("0.0.0.0", False), ("localhost", False),
])
def test_only_a_literal_loopback_address_counts_as_one_host(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


async def test_a_large_message_leaves_from_its_own_pieces_and_arrives_whole_in_order() -> None:
    """A large message, sent while the link's ring is empty, goes straight from its
    pieces to the socket, never copied into the ring: from DIRECT_MIN bytes when it is
    the last one queued, from DIRECT_ANY when others follow (below that the ring
    gathers them); one the socket takes only in part goes on through the ring from
    where it stopped; the small ones after them keep their places.  The queue's byte
    count says all that was sent."""
    async with two_processes_worth(ring=1024) as (ua, ub, nursery):
        await nursery.start(ub.add_broker("server").serve_queues, 80, echo)
        async with await ua.add_broker("client").connect_queue("server", 80) as q:
            ring, queue = q.queue._tx, q.queue
            big = bytes(range(256)) * (DIRECT_MIN // 256)
            rounds: list[list[bytes | Gather]] = [
                [gather([b"head", big, b"tail" * 100])],  # alone: straight out
                [big, big + b"!"],  # two of DIRECT_MIN queued at once: through the ring
                [gather([big * 4] * 3), b"after"],  # 768 KiB, then a small one
            ]
            in_ring = [0, 2 * (DIRECT_MIN + 4) + 1, 0]
            sock = queue._channel._peer.stream.socket  # type: ignore[union-attr]
            for i, sent in enumerate(rounds):
                if i == 2:  # a socket that takes little at a time: the rest of 768 KiB
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
                before = ring.total_written
                for message in sent:
                    queue.send(message)  # queued together, before the link's flush
                assert [await q.receive() for _ in sent] == [bytes(m) for m in sent]
                if i < 2:
                    assert ring.total_written - before == in_ring[i]
                else:
                    assert 4 + 5 < ring.total_written - before < len(sent[0])
            assert q.statistics().bytes_sent == sum(len(m) + 4 for r in rounds for m in r)
        # closed: nothing goes past the ring any more (its descriptor may be reused)
        direct = queue._channel.direct
        assert direct is None or direct(rounds[2][0]) == 0
