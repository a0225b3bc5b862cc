"""The MQ server over the framework's links, on trio's virtual clock: produce, consume,
ack, errors with reasons, ServerInfo, redelivery, dead letters, restarts, bad input."""

from __future__ import annotations

import errno
import os
import pathlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from brokermgr import BrokerManager, open_universe
from brokermgr.tracking import TrackNode
from channels import MessageTooLargeError
from mq import MqClient, MqServer, ServiceError, Subscription

TIMING: dict[str, Any] = {"report_interval": 5.0, "expiry": 12.0, "scan_interval": 2.0,
                          "retry": 0.5}


class Site:
    def __init__(self, universe: BrokerManager, directory: pathlib.Path | None,
                 **options: Any) -> None:
        self.universe = universe
        self.directory = directory
        # fsyncs on the pump: a thread would let the virtual clock jump while it runs
        self.options = {"fsync_thread": False, **options}
        self.start()

    def start(self) -> None:
        self.node = TrackNode(self.universe.add_broker("s1"), role="server", **TIMING)
        self.server = MqServer(self.node, self.directory, **self.options)

    def crash(self) -> None:
        self.node.broker.close("crash")
        self.server.close()

    def client(self, name: str, **options: Any) -> MqClient:
        return MqClient(self.universe.add_broker(name), "s1:15555", retry=0.5, **options)


@asynccontextmanager
async def site(directory: pathlib.Path | None, **options: Any) -> AsyncIterator[Site]:
    with trio.fail_after(600):  # virtual seconds: a test that waits forever fails
        async with open_universe("mq") as universe:
            s = Site(universe, directory, **options)
            try:
                yield s
            finally:
                s.server.close()


async def test_publish_consume_ack(tmp_path: pathlib.Path, autojump_clock: object) -> None:
    async with site(tmp_path) as s:
        producer, consumer = s.client("p"), s.client("c")
        await producer.declare("orders")
        stored = [await producer.publish("orders", b"m%d" % i, tag="eu.paid") for i in range(3)]
        stored += await producer.publish_many("orders", [b"m3", b"m4"])
        assert [x.offset for x in stored] == [0, 1, 2, 3, 4]
        assert {x.server for x in stored} == {"s1:15555"}
        sub = await consumer.subscribe("orders", window=10)
        got = [await sub.receive() for _ in range(5)]
        assert [m.body for m in got] == [b"m0", b"m1", b"m2", b"m3", b"m4"]
        assert got[0].tag == "eu.paid" and got[3].tag is None
        assert [m.sequence for m in got] == [1, 2, 3, 4, 5]
        assert got[0].producer == producer.producer and producer.producer.startswith("p~")
        assert all(m.deliveries == 1 for m in got)
        await sub.ack([m.offset for m in got])
        await trio.sleep(0.1)
        topic = (await consumer.query("orders"))["orders"]
        assert topic["groups"]["orders"]["lag"] == 0 and topic["depth"] == 0


async def test_unknown_topic_group_and_bad_requests_get_a_reason(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    async with site(tmp_path) as s:
        client = s.client("c")
        with pytest.raises(ServiceError, match="no topic 'nope' on s1:15555") as info:
            await client.publish("nope", b"x")
        assert info.value.status == 404  # zbus: no reply at all unless 'ack' was set
        await client.declare("orders")
        with pytest.raises(ServiceError, match="no consume group 'ghost'") as info:
            await client.subscribe("orders", group="ghost")
        assert info.value.status == 404
        with pytest.raises(ServiceError, match="at most 127 bytes") as info:
            await client.declare("orders", group="g", filter="x" * 128)
        assert info.value.status == 400
        with pytest.raises(ServiceError, match="flags must be a list of memory, rpc"):
            await client.declare("t2", flags=["persistent"])
        with pytest.raises(ServiceError, match="window must be an integer"):
            await client.subscribe("orders", window=0)
        # an empty group is not the topic's own group: names are never empty
        with pytest.raises(ServiceError, match="group must not be empty") as info:
            await client.subscribe("orders", group="")
        assert info.value.status == 400
        for bad in ({"offsets": [1, True]}, {"offsets": 0, "count": 0},
                    {"offsets": 0, "count": (1 << 20) + 1}, {"offsets": -1, "count": 1}):
            with pytest.raises(ServiceError, match="offsets must be a list of integers, "
                                                     "or the first of count") as info:
                await client.request({"cmd": "ack", "topic": "orders", **bad})
            assert info.value.status == 400


async def test_frames_and_acks_name_consecutive_offsets_by_the_first(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    """A frame of one producer's batch sends each column as one value, and an ack of
    consecutive offsets names the first and the count; what the consumer sees and what
    the server frees is the same as with lists."""
    async with site(tmp_path) as s:
        producer, consumer = s.client("p"), s.client("c")
        await producer.declare("orders")
        sub = await consumer.subscribe("orders", window=6)
        await producer.publish_many("orders", [b"a", b"bb", b"", b"dddd"], tag="t")
        await producer.publish("orders", b"e")
        got = await sub.receive_many()
        while len(got) < 5:
            got += await sub.receive_many()
        assert [(m.offset, m.body, m.tag, m.sequence) for m in got] == [
            (0, b"a", "t", 1), (1, b"bb", "t", 2), (2, b"", "t", 3), (3, b"dddd", "t", 4),
            (4, b"e", None, 5)]
        request = sub.ack_request([2, 3, 4])
        assert request is not None and request["offsets"] == 2
        await sub.ack([0, 1, 2, 3, 4])
        await producer.publish_many("orders", [b"f"] * 6)  # credits came back: all six
        assert [m.offset for m in await sub.receive_many()] == [5, 6, 7, 8, 9, 10]
        groups = (await consumer.query("orders"))["orders"]["groups"]
        assert groups["orders"]["inFlight"] == 6 and groups["orders"]["lag"] == 6


async def test_server_info_follows_declares_and_consumers(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    async with site(tmp_path) as s:
        client = s.client("c")
        await client.declare("orders", flags=["exclusive"])
        await client.declare("orders", group="eu", filter="eu.#")
        info = s.node.server_info.topic_table["orders"]
        assert info.mask == 16  # exclusive, zbus 0.9's bit
        assert sorted(g.group_name for g in info.consume_group_list) == ["eu", "orders"]
        assert info.group("eu").filter == "eu.#"  # type: ignore[union-attr]
        await client.subscribe("orders", group="eu")
        info = s.node.server_info.topic_table["orders"]
        assert info.consumer_count == 1 and len(info.group("eu").consumer_list) == 1  # type: ignore[union-attr]
        other = s.client("d")
        with pytest.raises(ServiceError, match="exclusive") as refused:
            await other.subscribe("orders", group="eu")
        assert refused.value.status == 409
        client.close()
        await trio.sleep(1)
        assert s.node.server_info.topic_table["orders"].consumer_count == 0  # the last left
        await other.remove("orders")
        assert "orders" not in s.node.server_info.topic_table


async def test_a_lost_consumer_s_messages_go_to_the_other_with_their_count(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    async with site(tmp_path) as s:
        producer, a, b = s.client("p"), s.client("a"), s.client("b")
        await producer.declare("jobs")
        sub_a = await a.subscribe("jobs", window=2)
        await producer.publish_many("jobs", [b"j0", b"j1"])
        held = [await sub_a.receive() for _ in range(2)]
        sub_b = await b.subscribe("jobs", window=5)
        a.link.broker.close("consumer crashed")  # nothing acknowledged
        again = [await sub_b.receive() for _ in range(2)]
        assert [(m.body, m.deliveries) for m in again] == [(b"j0", 2), (b"j1", 2)]
        assert [m.offset for m in held] == [m.offset for m in again]


async def test_ack_timeout_then_dead_letters(tmp_path: pathlib.Path,
                                             autojump_clock: object) -> None:
    async with site(tmp_path, ack_timeout=5.0, max_deliveries=2) as s:
        client = s.client("c")
        await client.declare("orders")
        sub = await client.subscribe("orders")
        await client.publish("orders", b"poison")
        first = await sub.receive()
        second = await sub.receive()  # after the ack timeout
        assert (first.deliveries, second.deliveries) == (1, 2)
        await trio.sleep(10)  # a second timeout: out of deliveries
        topics = await client.query()
        assert topics["orders"]["groups"]["orders"]["deadLetters"] == 1
        assert topics["orders"]["depth"] == 0
        dead = await client.subscribe("orders.orders.DLQ")
        assert (await dead.receive()).body == b"poison"


async def test_filters_select_per_group(tmp_path: pathlib.Path, autojump_clock: object) -> None:
    async with site(tmp_path) as s:
        client = s.client("c")
        await client.declare("orders")
        await client.declare("orders", group="eu", filter="eu.#", start="beginning")
        eu = await client.subscribe("orders", group="eu")
        for tag in ("eu.paid", "us.paid", None, "eu"):
            await client.publish("orders", (tag or "-").encode(), tag=tag)
        assert [(await eu.receive()).body for _ in range(2)] == [b"eu.paid", b"eu"]


async def test_a_restart_redelivers_what_was_not_acknowledged(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    async with site(tmp_path) as s:
        client = s.client("c")
        await client.declare("orders")
        await client.publish_many("orders", [b"a", b"b", b"c"])
        sub = await client.subscribe("orders")
        got = [await sub.receive() for _ in range(3)]
        await sub.ack([got[0].offset])
        await trio.sleep(2)  # the position is saved within a second
        s.crash()
        await trio.sleep(0.1)
        s.start()  # the same directory
        again = [await sub.receive() for _ in range(2)]  # the client consumes again
        assert [(m.body, m.deliveries) for m in again] == [(b"b", 1), (b"c", 1)]
        assert (await client.publish("orders", b"d")).offset == 3


async def test_a_restarted_server_serves_and_routes_every_group_it_had(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    """A group other than the topic's own is consumed after a restart, and the
    server's ServerInfo (what route tables show) lists it again."""
    async with site(tmp_path) as s:
        client = s.client("c")
        await client.declare("orders", group="audit", filter="eu.*")
        await client.publish("orders", b"x", tag="eu.fr")
        s.crash()
        await trio.sleep(0.1)
        s.start()  # the same directory
        groups = {g.group_name: g.filter
                  for g in s.node.server.topics["orders"].consume_group_list}  # type: ignore[union-attr]
        assert groups == {"orders": None, "audit": "eu.*"}
        sub = await client.subscribe("orders", group="audit")
        assert (await sub.receive()).body == b"x"


async def test_a_receive_waiting_raises_when_the_repeated_consume_is_refused(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    """The server comes back without the topic: the consume the client repeats after
    reconnecting is refused, and a receive already waiting raises that refusal (it
    would otherwise wait for messages that never come)."""
    import shutil

    async with site(tmp_path / "s") as s:
        client = s.client("c")
        await client.declare("orders")
        sub = await client.subscribe("orders")
        def without_the_topic() -> None:
            s.crash()
            shutil.rmtree(tmp_path / "s")
            s.start()

        s.universe.pump.call_later(1.0, without_the_topic)
        with pytest.raises(ServiceError, match="no topic 'orders'") as caught:
            with trio.fail_after(30):
                await sub.receive()  # waiting when the refusal comes
        assert caught.value.status == 404


async def test_a_failed_write_fails_the_publish_and_loses_nothing_acknowledged(
        tmp_path: pathlib.Path, autojump_clock: object,
        monkeypatch: pytest.MonkeyPatch) -> None:
    async with site(tmp_path) as s:
        client = s.client("c")
        await client.declare("orders")
        await client.publish("orders", b"kept")

        def disk_full(fd: int, data: object, at: int) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

        real = os.pwritev
        monkeypatch.setattr(os, "pwritev", disk_full)
        with pytest.raises(ServiceError, match="nothing stored: No space left") as info:
            await client.publish("orders", b"lost")
        assert info.value.status == 500
        monkeypatch.setattr(os, "pwritev", real)
        assert (await client.publish("orders", b"after")).offset == 1
        sub = await client.subscribe("orders")
        assert [(await sub.receive()).body for _ in range(2)] == [b"kept", b"after"]


async def test_a_malformed_command_closes_only_its_link(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    async with site(tmp_path) as s:
        good = s.client("good")
        await good.declare("orders")
        bad = await s.universe.add_broker("bad").connect_queue("s1", 15555)
        await bad.send(b"\xff not json")
        with pytest.raises(trio.BrokenResourceError, match="protocol error"):
            await bad.receive()
        assert (await good.publish("orders", b"still here")).offset == 0


@pytest.mark.parametrize("durability", ["interval:0.5", "none"])
async def test_other_durability_policies_acknowledge_once_written(
        tmp_path: pathlib.Path, autojump_clock: object, durability: str) -> None:
    async with site(tmp_path, durability=durability) as s:
        client = s.client("c")
        await client.declare("orders")
        assert (await client.publish("orders", b"x")).offset == 0
        sub = await client.subscribe("orders")
        assert (await sub.receive()).body == b"x"


async def test_a_memory_topic_works_without_a_directory(autojump_clock: object) -> None:
    async with site(None) as s:
        client = s.client("c")
        await client.declare("ticks", flags=["memory"])
        await client.publish_many("ticks", [b"1", b"2"])
        sub = await client.subscribe("ticks")
        assert [(await sub.receive()).body for _ in range(2)] == [b"1", b"2"]


@pytest.mark.parametrize(("durability", "segment_bytes"),
                         [("sync", None), ("interval:0.05", None), ("sync", 2048)])
async def test_fsyncs_in_a_thread_on_the_real_clock(tmp_path: pathlib.Path, durability: str,
                                                    segment_bytes: int | None) -> None:
    # (segments of 2 KiB: commits that wait for a sealed segment's flush, and new files'
    # directory fsyncs, beside the others)
    sizes = {} if segment_bytes is None else {"segment_bytes": segment_bytes}
    async with site(tmp_path, fsync_thread=True, durability=durability, **sizes) as s:
        client = s.client("c")
        await client.declare("orders")
        async with trio.open_nursery() as nursery:  # concurrent produces share fsyncs
            for k in range(4):
                nursery.start_soon(client.publish_many, "orders",
                                   [b"%d-%d" % (k, i) for i in range(50)])
        sub = await client.subscribe("orders", window=500)
        got: set[bytes] = set()
        with trio.fail_after(10):
            while len(got) < 200:
                got |= {m.body for m in await sub.receive_many()}
        log = s.server.catalogue.topics["orders"].topic.log
        with trio.fail_after(5):  # sync: already; interval: by the next interval
            while log.durable_offset < 200:
                await trio.sleep(0.01)


async def test_rpc_call_reply_timeout_errors_and_a_caller_that_left(
        autojump_clock: object) -> None:
    from mq import Caller, RpcTimeout, Service

    async with site(None) as s:
        admin = s.client("admin")
        await admin.declare("prices", flags=["rpc", "memory"])

        async def price(body: bytes) -> bytes:
            if body == b"ghost":
                raise KeyError("no such item")
            if body == b"slow":
                await trio.sleep(60)
            return b"price of " + body

        service = Service(s.client("pricing"), "prices", price)
        async with trio.open_nursery() as nursery:
            await nursery.start(service.serve)
            caller = Caller(s.client("shop"))
            assert await caller.call("prices", b"apple") == b"price of apple"
            answers = []

            async def ask(item: bytes) -> None:
                answers.append(await caller.call("prices", item))

            async with trio.open_nursery() as calls:  # concurrent calls, each its answer
                for item in (b"a", b"b", b"c"):
                    calls.start_soon(ask, item)
            assert sorted(answers) == [b"price of a", b"price of b", b"price of c"]
            with pytest.raises(ServiceError, match="KeyError: 'no such item'") as info:
                await caller.call("prices", b"ghost")
            assert info.value.status == 500
            with pytest.raises(RpcTimeout, match="no reply from 'prices' within 5"):
                await caller.call("prices", b"slow", timeout=5)
            # the caller left before the slow reply: it is dropped and counted
            gone = Caller(s.client("gone"))
            with trio.move_on_after(1):
                await gone.call("prices", b"slow")
            gone.client.close()
            await trio.sleep(120)
            assert s.server.counts["unroutable"] >= 1
            with pytest.raises(ServiceError, match="no topic 'nope'"):
                await caller.call("nope", b"x")
            nursery.cancel_scope.cancel()


async def test_push_reaches_every_link_answering_to_a_name(autojump_clock: object) -> None:
    async with site(None) as s:
        desk1, desk2, sender = s.client("desk1"), s.client("desk2"), s.client("sender")
        a = await desk1.receive_as("support")
        b = await desk2.receive_as("support")
        assert await sender.push("support", b"ticket 7") == 2
        got = [await a.receive(), await b.receive()]
        assert [p.body for p in got] == [b"ticket 7", b"ticket 7"]
        assert got[0].to == "support" and got[0].sender.startswith("sender#")
        with pytest.raises(ServiceError, match="no receiver 'nobody'") as info:
            await sender.push("nobody", b"x")
        assert info.value.status == 404
        desk2.close()
        await trio.sleep(1)
        assert await sender.push("support", b"ticket 8") == 1  # the one that left is gone
        assert (await a.receive()).body == b"ticket 8"


async def test_retention_removes_old_segments_and_says_which_group_missed_them(
        tmp_path: pathlib.Path, autojump_clock: object,
        caplog: pytest.LogCaptureFixture) -> None:
    async with site(tmp_path, segment_bytes=4096, retain_bytes=8192) as s:
        client = s.client("c")
        await client.declare("orders")
        await client.declare("orders", group="slow")
        for _ in range(6):  # a segment of 10 messages each (about 5 KiB)
            await client.publish_many("orders", [b"x" * 500 for _ in range(10)])
        await trio.sleep(1.5)  # a retention pass
        topic = (await client.query("orders"))["orders"]
        assert topic["start"] > 0 and topic["next"] == 60
        assert s.server.catalogue.topics["orders"].topic.log.size_bytes <= 8192 + 4096  # type: ignore[attr-defined]
        assert "went by retention before the group handled them" in caplog.text
        sub = await client.subscribe("orders", group="slow")
        assert (await sub.receive()).offset == topic["start"]  # it reads from what is kept


async def test_a_delete_on_exit_topic_goes_with_the_link_that_declared_it(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    async with site(tmp_path) as s:
        owner, other = s.client("owner"), s.client("other")
        await owner.declare("scratch", flags=["delete-on-exit"])
        await other.publish("scratch", b"x")
        assert "scratch" in s.node.server_info.topic_table
        owner.close()
        await trio.sleep(1)
        assert "scratch" not in s.node.server_info.topic_table
        assert not (tmp_path / "scratch").exists()
        with pytest.raises(ServiceError, match="no topic 'scratch'"):
            await other.publish("scratch", b"y")


async def test_a_backlog_larger_than_a_message_reaches_a_new_consumer_in_several_frames(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    """A consumer with a wide window subscribing behind a deep backlog gets it all: one
    dispatch's deliveries are cut into frames the link can carry."""
    async with site(tmp_path) as s:
        producer, consumer = s.client("p"), s.client("c")
        await producer.declare("orders")
        body = b"x" * (64 << 10)
        for _ in range(10):
            await producer.publish_many("orders", [body] * 30)  # 300 x 64 KiB: 19 MiB
        sub = await consumer.subscribe("orders", window=1000)
        got: list[int] = []
        while len(got) < 300:
            got += [m.offset for m in await sub.receive_many() if m.body == body]
        assert got == list(range(300))


async def test_a_message_too_large_for_a_link_is_refused_before_it_is_sent(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    """A publish that no link could carry raises at once and closes nothing; one the
    link carries but a delivery could not (its header would not fit) gets a 413."""
    with trio.fail_after(600):
        async with open_universe("mq", max_message_size=256 << 10,
                                 high_water=128 << 10) as universe:
            s = Site(universe, tmp_path)
            try:
                client = s.client("c")
                await client.declare("orders")
                with pytest.raises(MessageTooLargeError, match="exceeds the link's maximum "
                                   "message size of 262144 bytes; nothing was sent"):
                    await client.publish("orders", b"x" * (300 << 10))
                with pytest.raises(ServiceError, match="a message over 196608 bytes") as info:
                    await client.publish_many("orders", [b"y", b"x" * (200 << 10)])
                assert info.value.status == 413
                assert (await client.publish("orders", b"z" * (190 << 10))).offset == 0
                sub = await client.subscribe("orders")
                assert (await sub.receive()).body == b"z" * (190 << 10)
                assert client.link.connects == 1  # the link was never closed
            finally:
                s.server.close()


async def test_closing_a_client_ends_requests_waiting_for_its_link(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    """A subscribe waiting for a server that is down ends with status 0 ("closed") when
    its client is closed, at once rather than at its timeout; a subscribe cancelled after
    the close ends as cancelled (no error of the client's own); and a closed client says
    so to the next request."""
    async with site(tmp_path) as s:
        await s.client("p").declare("orders")
        s.crash()  # nobody answers at s1 now: the client keeps dialling
        ended: list[tuple[float, BaseException]] = []

        async def subscribe(client: MqClient) -> None:
            try:
                await client.subscribe("orders")
            except BaseException as exc:  # what the caller sees, and when
                ended.append((trio.current_time(), exc))
                if not isinstance(exc, ServiceError):
                    raise

        client = s.client("c", timeout=60)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(subscribe, client)
            await trio.sleep(1)
            closed_at = trio.current_time()
            client.close()
        assert ended[-1][0] == closed_at  # at once, not at the 60 s timeout
        assert isinstance(ended[-1][1], ServiceError) and ended[-1][1].status == 0
        assert "closed; consume was not sent" in str(ended[-1][1])
        assert client.subscriptions == {}

        # a subscribe sent, then its client closed and its task cancelled before the
        # reply (as a consumer that closes its clients and then its tasks does)
        s.start()
        other = s.client("d", timeout=60)
        await other.connected()
        send = other.link.request
        async with trio.open_nursery() as nursery:
            def request(*args: Any, **kwargs: Any) -> bool:
                sent = send(*args, **kwargs)
                other.close()
                nursery.cancel_scope.cancel()
                return sent

            other.link.request = request  # type: ignore[method-assign]
            nursery.start_soon(subscribe, other)
        assert isinstance(ended[-1][1], trio.Cancelled)
        assert other.subscriptions == {}
        with pytest.raises(ServiceError, match="closed; declare was not sent"):
            await other.declare("orders")
        with pytest.raises(ServiceError, match="the client is closed"):
            await other.connected()


async def _topics_consumed(s: Site, count: int, *, window: int
                           ) -> tuple[MqClient, list[Subscription]]:
    """Topics ``t0``, ``t1``, ... declared by a client ``admin`` (returned), each consumed
    by a client of its own with ``window``: their subscriptions."""
    admin = s.client("admin")
    subscriptions = []
    for i in range(count):
        await admin.declare(f"t{i}")
        subscriptions.append(await s.client(f"c{i}").subscribe(f"t{i}", window=window))
    return admin, subscriptions


async def test_topics_whose_consumers_keep_up_hold_little_memory(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    """Twenty topics, a consumer each reading as it comes: the server's memory once all
    is read is a small part of what went through (each held up to 8 MiB of its newest
    messages before, read or not: some thousand topics were some GB)."""
    import gc
    import tracemalloc

    async with site(tmp_path) as s:
        admin, subscriptions = await _topics_consumed(s, 20, window=1000)
        got = [0]

        async def read(subscription: Any) -> None:
            while True:
                batch = await subscription.receive_batch()
                got[0] += len(batch)
                await batch.ack()

        gc.collect()
        tracemalloc.start()
        try:
            async with trio.open_nursery() as readers:
                for subscription in subscriptions:
                    readers.start_soon(read, subscription)
                for i in range(20):
                    for _ in range(10):  # 1 MB a topic
                        await admin.publish_many(f"t{i}", [b"x" * 1000] * 100)
                while got[0] < 20_000:
                    await trio.sleep(0.01)
                readers.cancel_scope.cancel()
            await trio.sleep(1)  # the acks' commit
            gc.collect()
            held = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
    assert held < 4_000_000, f"{held / 1e6:.1f} MB held after 20 MB went through"


async def test_topics_whose_consumers_are_behind_hold_the_server_s_budget_together(
        tmp_path: pathlib.Path, autojump_clock: object, monkeypatch: pytest.MonkeyPatch
        ) -> None:
    """Ten topics, each with a consumer that has not read 90 of its 100 messages: the
    server keeps at most its budget of their bodies in memory together (here 300,000
    bytes, each topic's newest message aside), not 90,000 bytes a topic; the topics it
    let go of are read from their files, and every consumer gets every message."""
    from mq.storage import _tail

    monkeypatch.setattr(_tail, "KEPT_BYTES", 300_000)
    async with site(tmp_path) as s:
        admin, subscriptions = await _topics_consumed(s, 10, window=10)
        sent = [[b"%d.%03d" % (i, n) + b"x" * 994 for n in range(100)] for i in range(10)]
        for i in range(10):
            await admin.publish_many(f"t{i}", sent[i])
        await trio.sleep(1)  # the hand-outs (10 a topic, the consumers' windows)
        topics = s.server.catalogue.topics
        held = sum(sum(len(r.body) for r in topics[f"t{i}"].topic.log.tail.held())
                   for i in range(10))
        assert held <= 300_000 + 10 * 1_000, held
        assert s.server.catalogue.kept.total <= 300_000
        for i, subscription in enumerate(subscriptions):
            got: list[bytes] = []
            while len(got) < 100:
                batch = await subscription.receive_batch()
                got += batch.bodies
                await batch.ack()
            assert got == sent[i]


async def test_a_server_of_many_topics_visits_them_a_slice_at_a_time(
        tmp_path: pathlib.Path, autojump_clock: object,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Past ``TICK_TOPICS`` topics, each tick's work (ack timeouts, positions) is spread
    over ten calls a tenth of a second apart instead of stopping the pump for all at
    once; every topic's message past its ack timeout still comes again."""
    from mq.server import _server

    monkeypatch.setattr(_server, "TICK_TOPICS", 5)  # 20 topics count as many here
    async with site(tmp_path, ack_timeout=5.0) as s:
        visits: list[tuple[float, str]] = []  # the tick's visits, topic by topic
        quiet = s.server.catalogue.forget_quiet

        def visited(state: Any, now: float) -> None:
            visits.append((now, state.topic.name))
            quiet(state, now)

        s.server.catalogue.forget_quiet = visited  # type: ignore[method-assign]
        client = s.client("c")
        subscriptions = []
        for i in range(20):
            await client.declare(f"t{i}")
            subscriptions.append(await client.subscribe(f"t{i}"))
            await client.publish(f"t{i}", b"never acknowledged")
        first = [await sub.receive() for sub in subscriptions]
        again = [await sub.receive() for sub in subscriptions]  # each past its timeout
        assert {m.deliveries for m in first} == {1} and {m.deliveries for m in again} == {2}
        by_call: dict[float, int] = {}
        for at, _ in visits:
            by_call[at] = by_call.get(at, 0) + 1
        assert max(by_call.values()) == 2  # 20 topics over ten calls
        last_ten = sorted(by_call)[-10:]  # a second's calls
        seen = [name for at, name in visits if at in last_ten]
        assert sorted(seen) == sorted(f"t{i}" for i in range(20))  # each once


async def test_a_query_since_a_generation_lists_topics_only_when_one_came_or_went(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    """``query`` names the topic set's generation; asked ``since`` it, the answer lists no
    topic (``unchanged``) until a topic is declared or removed.  A ``since`` that is not
    a generation is refused with the reason."""
    async with site(tmp_path) as s:
        client = s.client("c")
        await client.declare("orders")
        first = await client.query_all()
        assert sorted(first["topics"]) == ["orders"]
        since = first["generation"]
        again = await client.request({"cmd": "query", "since": since})
        assert again["unchanged"] is True and "topics" not in again
        await client.declare("orders", group="eu")  # a group: the topic set is the same
        assert (await client.request({"cmd": "query", "since": since}))["unchanged"]
        await client.declare("audit")
        grown = await client.request({"cmd": "query", "since": since})
        assert sorted(grown["topics"]) == ["audit", "orders"] and "unchanged" not in grown
        await client.remove("audit")
        shrunk = await client.request({"cmd": "query", "since": grown["generation"]})
        assert sorted(shrunk["topics"]) == ["orders"]
        for bad in (-1, "3", True, 2**63):
            with pytest.raises(ServiceError, match="since must be an integer") as info:
                await client.request({"cmd": "query", "since": bad})
            assert info.value.status == 400


@pytest.mark.parametrize("durability", ["sync", "interval:1"])
async def test_a_group_commit_dispatches_only_the_topics_it_made_durable(
        tmp_path: pathlib.Path, autojump_clock: object, durability: str) -> None:
    """After a group commit, the topics it made durable are dispatched (under ``sync``
    that is what delivers their messages), not every topic of the server: a server of
    many idle topics does no work for them at each commit or each second."""
    async with site(tmp_path, durability=durability) as s:
        client = s.client("c")
        for i in range(30):
            await client.declare(f"t{i}")
        sub = await client.subscribe("t3")
        dispatched: list[str] = []
        dispatch = s.server._dispatch

        def counted(state: Any) -> None:
            dispatched.append(state.topic.name)
            dispatch(state)

        s.server._dispatch = counted  # type: ignore[method-assign]
        await trio.sleep(2.5)  # idle: a commit a second under interval:1
        assert dispatched == []
        await client.publish("t3", b"x")
        assert (await sub.receive()).body == b"x"
        await trio.sleep(1.5)
        assert set(dispatched) == {"t3"}, dispatched


async def test_a_tick_saves_positions_in_a_thread_and_a_restart_starts_there(
        tmp_path: pathlib.Path) -> None:
    """On the real clock, the positions a tick saves are written (and fsynced) by the
    saver's thread, not on the pump (which goes on meanwhile); after a restart each
    group starts at what it acknowledged."""
    import threading

    from mq.storage import _cursor

    writers: list[str] = []
    save = _cursor.save_cursor

    def recorded(path: pathlib.Path, offset: int) -> None:
        writers.append(threading.current_thread().name)
        save(path, offset)

    _cursor.save_cursor = recorded  # type: ignore[assignment]
    try:
        async with site(tmp_path, fsync_thread=True) as s:
            client = s.client("c")
            subs = []
            for i in range(5):
                await client.declare(f"t{i}")
                await client.publish_many(f"t{i}", [b"m"] * 10)
                subs.append(await client.subscribe(f"t{i}", window=10))
            writers.clear()  # (a declare saves its group's start at once, on the pump)
            for sub in subs:
                got = await sub.receive_many()
                await sub.ack([m.offset for m in got[:4]])
            saved = s.server.catalogue.topics["t4"].cursors
            assert saved is not None
            with trio.fail_after(5):  # the next tick's saves
                while saved.load(["t4"]) != {"t4": 4}:
                    await trio.sleep(0.05)
            assert writers and set(writers) == {"mq cursors"}
            client.close()
            s.crash()
            s.start()
            again = s.client("again")
            sub = await again.subscribe("t2", window=10)
            assert [m.offset for m in await sub.receive_many()] == list(range(4, 10))
            again.close()
    finally:
        _cursor.save_cursor = save  # type: ignore[assignment]
