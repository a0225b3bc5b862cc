"""Replication, the records' part: a replica follows its master's topic over a link and
stores its records as the master did, resumes after the link is lost, refuses a damaged
frame (closing only that link, with the reason), cuts a tail its master's history
replaced, and is refused when it holds records of its master's epoch that the master
does not.  On trio's virtual clock, fsyncs on the pump."""

from __future__ import annotations

import pathlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from brokermgr import BrokerManager, ServiceError, Status, open_universe
from brokermgr.tracking import TrackNode
from mq import MqClient, MqServer, TopicLog
from mq.replication._follower import Follower
from mq.storage._epochs import Epochs
from mq.storage._record import encode_records

from .test_log import records

TIMING: dict[str, Any] = {"report_interval": 5.0, "expiry": 12.0, "scan_interval": 2.0,
                          "retry": 0.5}


@asynccontextmanager
async def master(tmp_path: pathlib.Path, **options: Any
                 ) -> AsyncIterator[tuple[BrokerManager, MqServer, MqClient]]:
    """A universe with an MQ server s1 (``options``: MqServer's) holding topic
    ``orders``, and a client of it."""
    with trio.fail_after(600):  # virtual seconds
        async with open_universe("replicated") as universe:
            node = TrackNode(universe.add_broker("s1"), role="server", **TIMING)
            server = MqServer(node, tmp_path / "s1", fsync_thread=False, **options)
            client = MqClient(universe.add_broker("app"), "s1:15555", retry=0.5, timeout=60)
            await client.declare("orders")
            try:
                yield universe, server, client
            finally:
                client.close()
                server.close()


@asynccontextmanager
async def group_of_two(tmp_path: pathlib.Path, *, confirmed: bool = True
                       ) -> AsyncIterator[tuple[BrokerManager, MqServer, MqServer]]:
    """A universe with replicated group ``a``: s1 its master at epoch 1 (confirmed, as
    the name service would, unless not ``confirmed``), s2 its slave (not copying yet)."""
    from brokermgr import GroupMember

    with trio.fail_after(600):  # virtual seconds
        async with open_universe("replicated") as universe:
            nodes = {name: TrackNode(universe.add_broker(name), role="server",
                                     group=GroupMember("a", i, role, epoch=1), **TIMING)
                     for i, (name, role) in enumerate((("s1", "master"), ("s2", "slave")))}
            s1, s2 = (MqServer(nodes[n], tmp_path / n, fsync_thread=False) for n in nodes)
            if confirmed:
                s1.confirm()
            try:
                yield universe, s1, s2
            finally:
                s1.close()
                s2.close()


async def two_replicas(universe: BrokerManager, tmp_path: pathlib.Path
                       ) -> tuple[dict[str, TopicLog], dict[str, Follower]]:
    """Replicas r1 and r2 of s1's topic ``orders`` (plain logs), following it."""
    logs = {name: TopicLog(tmp_path / name / "orders") for name in ("r1", "r2")}
    followers = {name: Follower(universe.add_broker(name), "s1:15555",
                                {"orders": logs[name]}, retry=0.5) for name in logs}
    for follower in followers.values():
        while "orders" not in follower.followed:
            await follower.changed.wait()
    return logs, followers


def sync_master(tmp_path: pathlib.Path) -> Any:
    return master(tmp_path, replication="sync", min_insync=1, insync_lag=5.0)


async def until(follower: Follower, replica: TopicLog, offset: int) -> None:
    while replica.next_offset < offset:
        await follower.changed.wait()


async def test_a_replica_over_tcp_is_sent_large_records_a_dozen_to_a_frame(
        tmp_path: pathlib.Path) -> None:
    """Over TCP (real sockets on 127.0.0.1, each side a pump of its own) a replica's ring
    grows to 1 MiB for long frames, and its master sends it 64 KiB records up to twelve to
    a frame, not the three that 192 KiB holds: each frame costs both ends whatever it
    carries.  The replica stores every record as the master did."""
    from channels import DEFAULT_RING_CAPACITY
    from tests.rdv.test_net import two_processes_worth

    with trio.fail_after(60):
        async with two_processes_worth(ring=DEFAULT_RING_CAPACITY) as (ua, ub, _):
            node = TrackNode(ub.add_broker("server"), role="server", **TIMING)
            server = MqServer(node, tmp_path / "s1", fsync_thread=False)
            client = MqClient(ub.add_broker("app"), "server:15555", retry=0.5, timeout=30)
            await client.declare("orders")
            for i in range(12):  # 48 records of 64 KiB, four a request
                await client.publish_many("orders", [bytes([4 * i + j]) * (64 << 10)
                                                     for j in range(4)])
            replica = TopicLog(tmp_path / "r1" / "orders")
            follower = Follower(ua.add_broker("r1"), "server:15555", {"orders": replica},
                                retry=0.5)
            await until(follower, replica, 48)  # caught up from the master's log
            assert records(replica) == records(server.catalogue.topics["orders"].topic.log)
            assert follower.counts["frames"] <= 6  # 16 or more at three a frame
            follower.close()
            client.close()
            server.close()
            replica.close()


async def test_a_replica_stores_what_its_master_stored_and_resumes_after_a_lost_link(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    async with master(tmp_path) as (universe, server, client):
        for i in range(30):  # about 160 KB: the catch-up takes three windows of 64 KiB
            await client.publish_many("orders", [b"m%04d" % (i * 10 + j) * (100 + j)
                                                 for j in range(10)], tag=f"t{i % 3}")
        replica = TopicLog(tmp_path / "r1" / "orders")
        follower = Follower(universe.add_broker("r1"), "s1:15555", {"orders": replica},
                            window=64 << 10, retry=0.5)
        await until(follower, replica, 300)  # the catch-up, within a 64 KiB window
        # then as records are written
        await client.publish_many("orders", [b"later"] * 50)
        await until(follower, replica, 350)
        master_log = server.catalogue.topics["orders"].topic.log
        assert records(replica) == records(master_log)
        assert follower.counts["records"] == 350 and follower.counts["frames"] >= 4
        # the link is lost; what is written meanwhile comes once it is back
        assert follower.link.queue is not None
        follower.link.abort("test: the link is cut")
        await client.publish_many("orders", [b"while cut"] * 20)
        await until(follower, replica, 370)
        assert records(replica) == records(master_log)
        assert follower.link.connects == 2
        follower.close()
        replica.close()


async def test_a_master_keeps_no_appends_as_written_once_its_replicas_were_sent_them(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    """A replica that keeps up is sent each append as the log wrote it; once every
    replica was sent it, the master lets go of it (it kept its newest 64 appends, up to
    8 MiB a topic, whatever was sent)."""
    async with master(tmp_path) as (universe, server, client):
        master_log = server.catalogue.topics["orders"].topic.log
        replica = TopicLog(tmp_path / "r1" / "orders")
        follower = Follower(universe.add_broker("r1"), "s1:15555", {"orders": replica},
                            window=64 << 10, retry=0.5)
        while "orders" not in follower.followed:
            await follower.changed.wait()
        for i in range(40):
            await client.publish_many("orders", [b"%05d" % (i * 10 + j) * 200
                                                 for j in range(10)])
            await until(follower, replica, (i + 1) * 10)
        assert master_log.written is not None and master_log.written.bytes == 0
        assert follower.counts["records"] == 400
        # what comes next is sent as written all the same
        await client.publish_many("orders", [b"late%04d" % j * 100 for j in range(60)])
        await until(follower, replica, 460)
        assert records(replica) == records(master_log)
        follower.close()
        replica.close()


async def test_a_damaged_frame_stores_nothing_and_closes_only_its_link(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    async with master(tmp_path) as (universe, server, client):
        await client.publish_many("orders", [b"x" * 100] * 5)
        replica = TopicLog(tmp_path / "r1" / "orders")
        follower = Follower(universe.add_broker("r1"), "s1:15555", {"orders": replica},
                            retry=0.5)
        await until(follower, replica, 5)
        master_log = server.catalogue.topics["orders"].topic.log
        chunks, lengths = encode_records(master_log.read(0, max_count=5), 1 << 20)
        damaged = bytearray(b"".join(bytes(c) for c in chunks))
        damaged[lengths[0] - 2] ^= 0x40  # in the first record's body
        closed: list[str] = []
        assert follower.link.queue is not None
        follower.link.lost = closed.append  # type: ignore[method-assign,assignment]
        follower.copies(follower.link, {"cmd": "copies", "topic": "orders", "first": 5,
                                        "count": 5, "body": bytes(damaged)})
        assert replica.next_offset == 5 and follower.counts["refused frames"] == 1
        while not closed:  # the link closes with the reason
            await follower.link.room.wait()
        assert closed and "a bad copies frame" in closed[0] and "checksum" in closed[0]
        # the master and its clients go on; the replica asks again from what it holds
        await client.publish_many("orders", [b"y"] * 3)
        await until(follower, replica, 8)
        assert records(replica) == records(server.catalogue.topics["orders"].topic.log)
        # consume-group positions that are not [floor, filter] close the link the same way
        for groups, why in (({"g": [-1, None]}, "is not [floor, filter]"),
                            ({"g": [1, "a..b"]}, "empty segment"), ([1], "not a mapping"),
                            ({"": [1, None]}, "group")):
            while follower.link.queue is None or "orders" not in follower.followed:
                await follower.changed.wait()  # connected again, following again
            closed.clear()
            follower.positions(follower.link, {"cmd": "positions", "topic": "orders",
                                               "groups": groups})
            while not closed:
                await follower.link.room.wait()
            assert "bad positions" in closed[0] and why in closed[0], closed
        assert follower.counts["positions"] == 0
        # and so does a committed offset that is not one, or of a topic not followed
        for topic, offset, why in (("orders", -1, "-1"), ("orders", "3", "'3'"),
                                   ("other", 3, "'other'")):
            while follower.link.queue is None or "orders" not in follower.followed:
                await follower.changed.wait()
            closed.clear()
            follower.committed(follower.link, topic, offset)
            while not closed:
                await follower.link.room.wait()
            assert "a bad committed offset" in closed[0] and why in closed[0], closed
        follower.close()
        replica.close()


async def test_a_follow_that_could_not_be_sent_is_asked_again_at_the_next_scan(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    """The master's answer naming a new topic reaches the replica while the replica's
    link to the master is past its high-water mark: the follow is not sent then, and is
    asked at the next scan once the link has room; the topic's records reach the
    replica."""
    from rdvpump.testing import Faults

    with trio.fail_after(600):  # virtual seconds
        async with open_universe("replicated") as universe:
            faults = Faults(universe)
            node = TrackNode(universe.add_broker("s1"), role="server", **TIMING)
            server = MqServer(node, tmp_path / "s1", fsync_thread=False)
            client = MqClient(universe.add_broker("app"), "s1:15555", retry=0.5, timeout=60)
            await client.declare("orders")
            logs = {name: TopicLog(tmp_path / "r1" / name) for name in ("orders", "refunds")}
            follower = Follower(universe.add_broker("r1"), "s1:15555", logs, retry=0.5)
            while "orders" not in follower.followed:
                await follower.changed.wait()
            await client.declare("refunds")
            await client.publish_many("refunds", [b"r1", b"r2", b"r3"])
            queue = follower.link.queue
            assert queue is not None
            (link,) = faults.find(queue)
            link.ba.held = True  # the master's answers wait
            follower.scan()  # asks for the topics: the answer names "refunds"
            await trio.sleep(0.5)
            link.ab.held = True  # and the replica's link fills up
            sent = 0
            while follower.link.request({"cmd": "query"}, lambda _: None):
                sent += 1
                if sent % 100 == 0:
                    await trio.sleep(0)  # the pump moves what fits into the ring
            link.ba.release()  # the answer comes: the follow cannot be sent
            await trio.sleep(0.5)
            assert logs["refunds"].next_offset == 0
            link.ab.release()
            with trio.fail_after(5):  # the next scan is a second away
                await until(follower, logs["refunds"], 3)
            assert [r.body for r in logs["refunds"].read(0, max_count=3)] == [b"r1", b"r2",
                                                                              b"r3"]
            follower.close()
            for log in logs.values():
                log.close()
            client.close()
            server.close()


async def test_a_replica_ahead_of_its_master_is_refused_with_the_reason(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    async with master(tmp_path) as (universe, server, client):
        await client.publish_many("orders", [b"z"] * 3)
        ahead = TopicLog(tmp_path / "r1" / "orders")
        ahead.append([(None, "old master", i, b"divergent") for i in range(5)])
        follower = Follower(universe.add_broker("r1"), "s1:15555", {"orders": ahead},
                            retry=0.5)
        while "orders" not in follower.refused:
            await follower.changed.wait()
        assert follower.refused["orders"] == (
            "orders: the replica holds offsets up to 4 of epoch 0, this master's last is 2: "
            "it holds records this one does not")
        assert ahead.next_offset == 5  # records of the master's own epoch are never cut
        follower.close()
        ahead.close()


async def test_sync_replication_acknowledges_only_what_a_replica_stored(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    async with sync_master(tmp_path) as (universe, server, client):
        master_log = server.catalogue.topics["orders"].topic.log
        # no replica in sync: refused with the reason, nothing stored
        with pytest.raises(ServiceError) as caught:
            await client.publish("orders", b"alone")
        assert caught.value.status == Status.UNAVAILABLE
        assert "orders: 0 replicas in sync, 1 needed (replication sync)" in caught.value.reason
        assert master_log.next_offset == 0
        replica = TopicLog(tmp_path / "r1" / "orders")
        follower = Follower(universe.add_broker("r1"), "s1:15555", {"orders": replica},
                            retry=0.5)
        while "orders" not in follower.followed:
            await follower.changed.wait()
        for n in range(1, 6):
            stored = await client.publish_many("orders", [b"kept"] * 10)
            # acknowledged: the replica has every message of it already
            assert replica.next_offset >= stored[-1].offset + 1 == 10 * n
        topic = (await client.query("orders"))["orders"]
        assert list(topic["replicas"].values()) == [{"next": 50, "inSync": True}]
        assert records(replica) == records(master_log)
        # the replica hangs (takes frames, stores nothing, acknowledges nothing): after the
        # in-sync lag the waiting produce is answered with the reason
        follower.copies = lambda link, obj: None  # type: ignore[method-assign]
        with pytest.raises(ServiceError) as caught:
            await client.publish("orders", b"unconfirmed")
        assert caught.value.status == Status.UNAVAILABLE
        assert caught.value.reason.startswith(
            "not acknowledged, stored here but it may or may not stay: orders: 0 replicas in "
            "sync, 1 needed")
        assert server.shipper.counts["refused"] == 1
        follower.close()
        replica.close()


async def test_a_link_refused_by_a_master_not_confirmed_yet_is_told_once_it_is(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    """A group's master the name service has not confirmed yet (a former master that
    restarted, until the name service answers) refuses a publish (503); the link is
    told once it is confirmed (a ``writable`` push), not when a slave would be asked,
    and the publish then goes through."""
    async with group_of_two(tmp_path, confirmed=False) as (universe, s1, s2):
        client = MqClient(universe.add_broker("c"), "s1:15555", timeout=60)
        told: list[str] = []
        pushed = trio.Event()

        def writable(topic: str) -> None:
            told.append(topic)
            pushed.set()

        client.on_writable = writable
        at_slave = MqClient(universe.add_broker("c2"), "s2:15555", timeout=60)
        wrongly: list[str] = []
        at_slave.on_writable = wrongly.append
        with pytest.raises(ServiceError, match="is not confirmed as the master of group a"):
            await client.publish("orders", b"too soon")
        with pytest.raises(ServiceError, match="is a slave of group a"):
            await at_slave.publish("orders", b"to a slave")
        assert told == []
        s1.confirm()  # as the name service's answer does
        with trio.fail_after(5):
            await pushed.wait()
        assert told == ["orders"]
        await client.declare("orders")
        assert (await client.publish("orders", b"now")).offset == 0
        assert wrongly == []
        client.close()
        at_slave.close()


async def test_a_link_refused_for_too_few_replicas_in_sync_is_told_when_there_are_enough(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    """Under sync, a producer refused (503) for too few replicas in sync is told once the
    topic has enough (a ``writable`` push): when a replica follows it at its end, and
    when one catches up with it.  A link that was not refused is told nothing."""
    async with sync_master(tmp_path) as (universe, server, client):
        told: list[str] = []
        changed = trio.Event()

        def writable(topic: str) -> None:
            nonlocal changed
            told.append(topic)
            changed.set()
            changed = trio.Event()

        client.on_writable = writable
        bystander = MqClient(universe.add_broker("other"), "s1:15555", timeout=60)
        wrongly: list[str] = []
        bystander.on_writable = wrongly.append
        await bystander.declare("audit")  # connected, and never refused
        for _ in range(2):  # told once, however often it was refused
            with pytest.raises(ServiceError, match="orders: 0 replicas in sync"):
                await client.publish("orders", b"too soon")
        replicas = {name: TopicLog(tmp_path / name / "orders") for name in ("r1", "r2")}
        # a replica that follows from the topic's end is in sync at once
        first = Follower(universe.add_broker("r1"), "s1:15555", {"orders": replicas["r1"]},
                         retry=0.5)
        with trio.fail_after(5):
            await changed.wait()
        assert told == ["orders"]
        await client.publish_many("orders", [b"kept"] * 20)
        # that replica leaves: refused again; a new one is in sync once it caught up
        first.close()
        with pytest.raises(ServiceError, match="orders: 0 replicas in sync"):
            await client.publish("orders", b"alone again")
        second = Follower(universe.add_broker("r2"), "s1:15555", {"orders": replicas["r2"]},
                          retry=0.5)
        with trio.fail_after(5):
            await changed.wait()
        assert told == ["orders", "orders"] and replicas["r2"].next_offset == 20
        assert (await client.publish("orders", b"now")).offset == 20
        assert wrongly == []
        # a malformed one is the server's protocol error, told to no one
        closed: list[str] = []
        client.link.pushes.take({"cmd": "writable", "topic": 7}, closed.append)
        assert closed == [f"a bad writable from {client.link.pushes.what}: writable: "
                          f"topic must be a string, got int"]
        assert told == ["orders", "orders"]
        second.close()
        bystander.close()
        for replica in replicas.values():
            replica.close()


async def test_a_replica_server_copies_every_topic_serves_consumers_and_refuses_writes(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    from brokermgr import GroupMember

    async with sync_master(tmp_path) as (universe, server, client):
        slave_node = TrackNode(universe.add_broker("s2"), role="server",
                               group=GroupMember("a", 1, "slave", epoch=1), **TIMING)
        slave = MqServer(slave_node, tmp_path / "s2", fsync_thread=False)
        follower = slave.follow("s1:15555", retry=0.5)
        while "orders" not in follower.followed:
            await follower.changed.wait()
        await client.publish_many("orders", [b"o%d" % i for i in range(20)])
        # a topic declared later is found at the next scan (until then, under sync, it
        # takes no writes: no replica is in sync), and copied from its start
        await client.declare("audit")
        with pytest.raises(ServiceError, match="audit: 0 replicas in sync"):
            await client.publish("audit", b"too soon")
        while "audit" not in follower.followed:
            await follower.changed.wait()
        stored = await client.publish_many("audit", [b"a%d" % i for i in range(5)])
        assert stored[-1].offset == 4  # acknowledged: the replica stored it
        for name, count in (("orders", 20), ("audit", 5)):
            assert records(slave.catalogue.topics[name].topic.log) == records(
                server.catalogue.topics[name].topic.log)
            assert len(records(slave.catalogue.topics[name].topic.log)) == count
        # the replica serves consumers; it takes no writes and no declares
        reader = MqClient(universe.add_broker("reader"), "s2:15555", retry=0.5)
        subscription = await reader.subscribe("orders", window=100)
        got = await subscription.receive_many()
        while len(got) < 20:
            got += await subscription.receive_many()
        assert [m.body for m in got] == [b"o%d" % i for i in range(20)]
        for attempt in (reader.publish("orders", b"x"), reader.declare("new")):
            with pytest.raises(ServiceError) as caught:
                await attempt
            assert caught.value.status == Status.UNAVAILABLE
            # it names its master, in words and as a field, so that a client can go there
            assert caught.value.reason.startswith(
                "s2:15555 is a slave of group a: ") and "at its master, s1:15555" in (
                caught.value.reason), caught.value.reason
            assert caught.value.detail["master"] == "s1:15555"
        reader.close()
        slave.close()


@pytest.mark.parametrize("durability", ["sync", "interval:30"])
async def test_a_replica_acknowledges_its_copies_as_its_own_durability_says(
        tmp_path: pathlib.Path, autojump_clock: object, durability: str) -> None:
    """A replica server under ``--durability sync`` acknowledges a copy only once it is
    fsynced, one group commit for the copies that came before it; under ``interval:S``
    once written, before an fsync (as its master acknowledges its own produces)."""
    from brokermgr import GroupMember

    async with sync_master(tmp_path) as (universe, server, client):
        slave_node = TrackNode(universe.add_broker("s2"), role="server",
                               group=GroupMember("a", 1, "slave", epoch=1), **TIMING)
        slave = MqServer(slave_node, tmp_path / "s2", fsync_thread=False,
                         durability=durability)
        follower = slave.follow("s1:15555", retry=0.5)
        while "orders" not in follower.followed:
            await follower.changed.wait()
        copy = slave.catalogue.topics["orders"].topic.log
        acked: list[tuple[int, int]] = []  # (copied up to, durable then)
        send = follower.link.send

        def watched(message: Any, *args: Any, **kwargs: Any) -> None:
            if message.get("cmd") == "copied":
                acked.append((message["next"], copy.durable_offset))
            send(message, *args, **kwargs)

        follower.link.send = watched  # type: ignore[method-assign]
        async with trio.open_nursery() as nursery:
            for i in range(8):
                nursery.start_soon(client.publish_many, "orders", [b"m%d" % i] * 5)
        assert acked and acked[-1][0] == 40 == copy.next_offset  # every publish came back
        commits = sum(slave.commit.fsync_buckets)
        if durability == "sync":
            assert all(durable >= end for end, durable in acked)
            assert 1 <= commits <= follower.counts["frames"]
        else:
            assert any(durable < end for end, durable in acked) and commits == 0
        slave.close()


async def test_a_replica_whose_fsync_fails_acknowledges_nothing_and_says_why(
        tmp_path: pathlib.Path, autojump_clock: object,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A replica under ``--durability sync`` whose fsync fails does not acknowledge the
    copy (its log says why, and refuses writes): the ``sync`` master refuses the publish once that
    replica is out of sync, instead of acknowledging what no replica made durable."""
    import errno
    import os

    from brokermgr import GroupMember

    async with master(tmp_path, replication="sync", min_insync=1, insync_lag=5.0,
                      durability="interval:600") as (universe, server, client):
        slave_node = TrackNode(universe.add_broker("s2"), role="server",
                               group=GroupMember("a", 1, "slave", epoch=1), **TIMING)
        slave = MqServer(slave_node, tmp_path / "s2", fsync_thread=False,
                         durability="sync")
        follower = slave.follow("s1:15555", retry=0.5)
        while "orders" not in follower.followed:
            await follower.changed.wait()

        def broken(fd: int) -> None:
            raise OSError(errno.EIO, "Input/output error")

        monkeypatch.setattr(os, "fsync", broken)
        with pytest.raises(ServiceError) as caught:
            await client.publish("orders", b"never durable on the replica")
        assert caught.value.status == Status.UNAVAILABLE, caught.value
        assert "not acknowledged" in caught.value.reason
        copy = slave.catalogue.topics["orders"].topic.log
        assert copy.failed is not None and "fsync failed" in copy.failed  # it says why
        assert copy.durable_offset == 0 and follower.counts["frames"] == 0  # none acked
        monkeypatch.undo()
        slave.close()


async def test_under_sync_only_what_a_replica_stored_is_delivered_on_master_and_replica(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    """A message the master stored but no replica has yet is not delivered: a failover
    could cut it, and a consumer that saw it would have seen a history that did not
    last.  It is delivered once the replica acknowledged it (with the produce's answer).
    The replica's own consumers get what the master says is committed, not what the
    replica merely holds."""
    from brokermgr import GroupMember

    async with sync_master(tmp_path) as (universe, server, client):
        slave_node = TrackNode(universe.add_broker("s2"), role="server",
                               group=GroupMember("a", 1, "slave", epoch=1), **TIMING)
        slave = MqServer(slave_node, tmp_path / "s2", fsync_thread=False,
                         replication="sync", insync_lag=5.0)
        follower = slave.follow("s1:15555", retry=0.5)
        while "orders" not in follower.followed:
            await follower.changed.wait()
        reader = MqClient(universe.add_broker("reader"), "s1:15555", retry=0.5)
        on_master = await reader.subscribe("orders", window=100)
        replica_reader = MqClient(universe.add_broker("r2"), "s2:15555", retry=0.5)
        on_replica = await replica_reader.subscribe("orders", window=100)

        held: list[tuple[Any, dict[str, Any]]] = []
        copies = follower.copies
        follower.copies = lambda link, obj: held.append((link, obj))  # type: ignore
        answered: list[Any] = []
        async with trio.open_nursery() as nursery:
            async def publish() -> None:
                answered.append(await client.publish("orders", b"one"))

            nursery.start_soon(publish)
            while server.catalogue.topics["orders"].topic.log.next_offset < 1 or not held:
                await trio.sleep(0.1)
            with trio.move_on_after(3):  # stored on the master, shipped, not stored there
                await on_master.receive()
                raise AssertionError("delivered before a replica stored it")
            assert not answered
            follower.copies = copies  # type: ignore[method-assign]
            for link, obj in held:
                copies(link, obj)
            with trio.fail_after(5):
                message = await on_master.receive()
        assert message.body == b"one" and answered[0].offset == 0
        with trio.fail_after(0.11):  # the master's word that it is committed: within 0.1 s
            assert (await on_replica.receive()).body == b"one"

        # the replica holds a second message, but the master's word that it is committed
        # does not reach it: its consumers do not get it
        said = follower.committed
        follower.committed = lambda *args: None  # type: ignore[method-assign]
        assert (await client.publish("orders", b"two")).offset == 1
        assert slave.catalogue.topics["orders"].topic.log.next_offset == 2
        with trio.fail_after(5):
            assert (await on_master.receive()).body == b"two"
        with trio.move_on_after(3):
            await on_replica.receive()
            raise AssertionError("the replica delivered what it did not know committed")
        follower.committed = said  # type: ignore[method-assign]
        assert (await client.publish("orders", b"three")).offset == 2
        with trio.fail_after(5):
            got = [(await on_replica.receive()).body for _ in range(2)]
        assert got == [b"two", b"three"]
        reader.close()
        replica_reader.close()
        slave.close()


async def test_a_replica_the_name_service_holds_in_sync_is_waited_for_until_it_is_dropped(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    """Under ``sync`` a master acknowledges only what every replica that a failover may
    promote stored: those in sync here, and those the name service still holds in sync
    (the set it promotes from).  A replica that stops copying leaves the master's own
    in-sync set after the lag, but while the name service holds it in sync (the master
    could not tell it otherwise: cut off from it) the master does not acknowledge
    without it; once the name service dropped it, the produce is answered."""
    async with sync_master(tmp_path) as (universe, server, client):
        logs, followers = await two_replicas(universe, tmp_path)
        await client.publish("orders", b"both")
        assert server.shipper.insync_replicas() == ["r1", "r2"]
        server.shipper.confirm_insync(frozenset({"r1", "r2"}))  # as the name service says
        followers["r2"].copies = lambda link, obj: None  # type: ignore[method-assign]
        answered: list[Any] = []
        async with trio.open_nursery() as nursery:
            async def publish() -> None:
                answered.append(await client.publish("orders", b"r2 lacks it"))

            nursery.start_soon(publish)
            await trio.sleep(30)  # well past the in-sync lag (5 s): r1 alone in sync here
            assert server.shipper.insync_replicas() == ["r1"]
            assert logs["r1"].next_offset == 2 and logs["r2"].next_offset == 1
            assert not answered  # the name service may still promote r2
            assert server.catalogue.topics["orders"].committed == 1  # nor delivered
            server.shipper.confirm_insync(frozenset({"r1"}))  # it dropped r2
            with trio.fail_after(5):
                while not answered:
                    await trio.sleep(0.1)
        assert answered[0].offset == 1
        assert server.catalogue.topics["orders"].committed == 2
        for name, follower in followers.items():
            follower.close()
            logs[name].close()


async def test_a_replica_is_in_sync_only_on_every_replicated_topic(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    """What a master tells the name service (the set a failover promotes from): the
    replicas in sync on every topic it replicates; a memory topic is not replicated, and
    a topic no replica follows leaves none in sync."""
    async with sync_master(tmp_path) as (universe, server, client):
        logs, followers = await two_replicas(universe, tmp_path)
        await client.publish("orders", b"both")
        assert server.shipper.insync_replicas() == ["r1", "r2"]
        await client.declare("cache", flags=["memory"])
        assert server.shipper.insync_replicas() == ["r1", "r2"]
        await client.declare("audit")  # (these replicas follow "orders" only)
        assert server.shipper.insync_replicas() == []
        for name, follower in followers.items():
            follower.close()
            logs[name].close()


async def test_a_closed_master_says_no_replica_is_in_sync_instead_of_failing(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    """As a process stops, a last registration may ask a master whose logs are closed
    which replicas are in sync: none (it holds nothing now), not an error that ends the
    stopping process with exit 1, as a group member stopped by SIGINT once did."""
    async with sync_master(tmp_path) as (universe, server, client):
        logs, followers = await two_replicas(universe, tmp_path)
        await client.publish("orders", b"both")
        assert server.shipper.insync_replicas() == ["r1", "r2"]
        server.close()  # its logs closed, its followers' links not gone yet
        assert server.shipper.insync_replicas() == []
        assert server.role.progress().insync == ()
        for name, follower in followers.items():
            follower.close()
            logs[name].close()


async def test_consume_groups_reach_the_replica_with_their_positions_and_filters(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    """The master's consume groups are sent to its replica every 0.1 s: a group declared
    there (with its filter) is declared on the replica, and positions move forward as
    the master's do.  Promoted, the replica gives each group only what the master had
    not seen handled, through the group's filter."""
    from brokermgr import GroupMember

    async with master(tmp_path) as (universe, server, client):
        slave_node = TrackNode(universe.add_broker("s2"), role="server",
                               group=GroupMember("a", 1, "slave", epoch=1), **TIMING)
        slave = MqServer(slave_node, tmp_path / "s2", fsync_thread=False)
        follower = slave.follow("s1:15555", retry=0.5)
        await client.declare("orders", group="eu", filter="eu.*")
        for i in range(10):
            await client.publish("orders", b"m%d" % i, tag="eu.x" if i % 2 == 0 else "us.x")
        everyone = await client.subscribe("orders", window=100)
        handled: list[bytes] = []
        while len(handled) < 6:
            messages = await everyone.receive_many()
            messages = messages[:6 - len(handled)]
            handled += [m.body for m in messages]
            await everyone.ack([m.offset for m in messages])
        eu = await client.subscribe("orders", group="eu", window=2)
        first = [await eu.receive() for _ in range(2)]
        await eu.ack([m.offset for m in first])
        await trio.sleep(0.2)  # two shipments, 0.1 s apart: the positions were sent
        on_master = server.catalogue.topics["orders"].topic.groups
        state = slave.catalogue.topics["orders"]
        assert {g: (state.topic.groups[g].floor, state.filters[g]) for g in ("orders", "eu")} \
            == {"orders": (on_master["orders"].floor, None), "eu": (on_master["eu"].floor,
                                                                    "eu.*")}
        assert on_master["orders"].floor == 6 and on_master["eu"].floor >= 4
        assert follower.counts["positions"] >= 1
        await trio.sleep(1)  # a tick: what the replica holds is in its ServerInfo
        assert slave_node.server is not None and slave_node.server.held == 10  # for routes
        eu_floor = on_master["eu"].floor
        client.close()
        server.close()
        slave.promote(2)
        reader = MqClient(universe.add_broker("reader"), "s2:15555", retry=0.5)
        rest = await reader.subscribe("orders", window=100)
        got = await rest.receive_many()
        assert [m.body for m in got] == [b"m6", b"m7", b"m8", b"m9"]
        eu_rest = await reader.subscribe("orders", group="eu", window=100)
        got = await eu_rest.receive_many()
        assert [m.offset for m in got] == [o for o in range(eu_floor, 10, 2)]
        reader.close()
        slave.close()


async def test_a_replica_that_comes_back_takes_the_master_s_positions_as_it_catches_up(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    """A replica stopped while the group goes on consuming on the master, then started
    again on its directory: once it holds what the master holds, its group's position
    is the master's within 0.1 s, not the one it stopped with."""
    from brokermgr import GroupMember

    async with master(tmp_path) as (universe, server, client):
        def replica(name: str) -> MqServer:
            node = TrackNode(universe.add_broker(name), role="server",
                             group=GroupMember("a", 1, "slave", epoch=1), **TIMING)
            return MqServer(node, tmp_path / "s2", fsync_thread=False)

        slave = replica("s2")
        follower = slave.follow("s1:15555", retry=0.5)
        reader = await client.subscribe("orders", window=1000)

        async def publish_and_handle(count: int) -> None:
            for i in range(count):
                await client.publish("orders", b"m%d" % i)
            handled = 0
            while handled < count:
                messages = await reader.receive_many()
                handled += len(messages)
                await reader.ack([m.offset for m in messages])

        await client.declare("orders")
        await publish_and_handle(50)
        groups = server.catalogue.topics["orders"].topic.groups
        while slave.catalogue.topics["orders"].topic.groups.get("orders") is None or (
                slave.catalogue.topics["orders"].topic.groups["orders"].floor < 50):
            await follower.changed.wait()
        slave.close()
        slave.node.broker.close("stopped")
        await publish_and_handle(200)  # handled on the master while the replica is away
        while groups["orders"].floor < 250:  # the acks, sent: taken in turn
            await trio.sleep(0.01)
        slave = replica("s2")  # on the directory it stopped with
        assert slave.catalogue.topics["orders"].topic.groups["orders"].floor == 50
        follower = slave.follow("s1:15555", retry=0.5)
        log = slave.replica_logs()["orders"]
        while log.next_offset < 250:
            await follower.changed.wait()
        caught_up = trio.current_time()
        while slave.catalogue.topics["orders"].topic.groups["orders"].floor < 250:
            await trio.sleep(0.01)
        assert trio.current_time() - caught_up <= 0.11
        client.close()
        slave.close()


async def test_a_master_looks_only_at_the_topics_that_moved_and_at_every_topic_each_second(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    """A master of many topics, with a replica following each: every 0.1 s it looks at
    the positions of the topics that moved only (a new follower's, an ack: each reaches
    the replica within 0.1 s as before), and once a second at every topic's, so a
    position moved unannounced (here, by hand) still reaches the replica within about a
    second."""
    from brokermgr import GroupMember

    async with master(tmp_path) as (universe, server, client):
        names = [f"t{i}" for i in range(40)]
        for name in names:
            await client.declare(name)
            await client.publish(name, b"m")
            await client.empty(name)  # the group's floor: 1
        await trio.sleep(0.2)  # (shipped to no one: what moved was looked at)
        slave = MqServer(TrackNode(universe.add_broker("s2"), role="server",
                                   group=GroupMember("a", 1, "slave", epoch=1), **TIMING),
                         tmp_path / "s2", fsync_thread=False)
        follower = slave.follow("s1:15555", retry=0.5)
        on_slave = slave.catalogue.topics

        def floor(name: str) -> int:
            state = on_slave.get(name)
            group = None if state is None else state.topic.groups.get(name)
            return -1 if group is None else group.floor

        while len(follower.followed) < 41:
            await follower.changed.wait()
        followed = trio.current_time()
        while any(floor(name) != 1 for name in names):
            await follower.changed.wait()
        assert trio.current_time() - followed <= 0.101  # a new follower's, within 0.1 s
        looked: list[str] = []
        ship = server.shipper.ship_positions

        def counted(state: Any) -> None:
            looked.append(state.topic.name)
            ship(state)

        server.shipper.ship_positions = counted  # type: ignore[method-assign]
        await trio.sleep(1.95)  # nothing moves: at most two of the seconds' rounds
        assert len(looked) <= 2 * 41, len(looked)  # (every 0.1 s: 19 rounds of 41)
        await client.publish("t7", b"m")
        await client.publish("t9", b"m")
        reader = await client.subscribe("t7")
        message = await reader.receive()
        await reader.ack([message.offset])
        master_group = server.catalogue.topics["t7"].topic.groups["t7"]
        while master_group.floor < 2:
            await trio.sleep(0.001)
        acked = trio.current_time()
        while floor("t7") < 2:
            await trio.sleep(0.001)
        assert trio.current_time() - acked <= 0.101
        server.catalogue.topics["t9"].topic.groups["t9"].next_read = 2  # unannounced
        moved = trio.current_time()
        while floor("t9") < 2:
            await trio.sleep(0.01)
        assert trio.current_time() - moved <= 1.01
        slave.close()


async def test_a_replica_s_beat_has_its_master_describe_its_topics_only_when_one_is_new(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    """A replica asks its master for its topics every 0.1 s (its beat: a silent master is
    how a failover starts).  Once it has them all, the master answers that nothing
    changed instead of describing every topic again; a topic declared later is followed
    within a beat."""
    async with master(tmp_path) as (universe, server, client):
        for i in range(30):
            await client.declare(f"t{i}")
        logs = {f"t{i}": TopicLog(tmp_path / "r1" / f"t{i}") for i in range(31)}
        follower = Follower(universe.add_broker("r1"), "s1:15555", logs, retry=0.5)
        while len(follower.followed) < 30:
            await follower.changed.wait()
        described: list[str] = []
        describe = server.catalogue.describe

        def counted(name: str) -> dict[str, Any]:
            described.append(name)
            return describe(name)

        server.catalogue.describe = counted  # type: ignore[method-assign]
        start = trio.current_time()
        await trio.sleep(1)
        assert follower.last_heard >= start + 0.9  # the beat goes on
        assert described == []  # (300 topics described before, in ten answers)
        await client.declare("t30")
        declared = trio.current_time()
        while "t30" not in follower.followed:
            await follower.changed.wait()
        assert trio.current_time() - declared <= 0.101
        follower.close()
        for log in logs.values():
            log.close()


async def test_sync_waits_for_every_replica_in_sync_and_no_longer_for_one_behind(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    """Under sync a produce is acknowledged once every replica in sync stored it: a
    replica that stops acknowledging holds it until it falls out of sync (the in-sync
    lag, 5 s here), then the others' copies are enough."""
    async with sync_master(tmp_path) as (universe, server, client):
        logs, followers = await two_replicas(universe, tmp_path)
        await client.publish_many("orders", [b"both"] * 3)
        assert logs["r1"].next_offset == logs["r2"].next_offset == 3
        followers["r2"].copies = lambda link, obj: None  # type: ignore[method-assign]
        start = trio.current_time()
        stored = await client.publish("orders", b"one")
        waited = trio.current_time() - start
        assert stored.offset == 3 and logs["r1"].next_offset == 4
        assert 5.0 <= waited <= 7.0, waited  # the lag, and the tick that noticed it
        replicas = (await client.query("orders"))["orders"]["replicas"]
        assert sorted((r["next"], r["inSync"]) for r in replicas.values()) == [
            (3, False), (4, True)]
        for name, follower in followers.items():
            follower.close()
            logs[name].close()


async def test_a_tick_leaves_alone_a_topic_with_nothing_held_and_all_committed(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    """Under sync, each tick looks again at what the replicas in sync stored, for the
    topics with replies held or offsets not committed yet; a topic with neither costs
    it nothing (the in-sync set cannot move what is already committed)."""
    async with sync_master(tmp_path) as (universe, server, client):
        logs, followers = await two_replicas(universe, tmp_path)
        await client.publish_many("orders", [b"m"] * 5)
        assert server.catalogue.topics["orders"].committed == 5
        asked: list[str] = []
        stored_upto = server.shipper._stored_upto

        def counted(topic: str) -> int:
            asked.append(topic)
            return stored_upto(topic)

        server.shipper._stored_upto = counted  # type: ignore[method-assign]
        await trio.sleep(3)  # three ticks
        assert asked == []
        stored = await client.publish("orders", b"again")  # still waited for, and acked
        assert stored.offset == 5 and asked
        for name, follower in followers.items():
            follower.close()
            logs[name].close()


async def test_a_topic_declared_on_a_group_s_master_begins_its_epoch_alone(
        tmp_path: pathlib.Path, autojump_clock: object,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A new topic on a group's master is written under the master's epoch from its
    first record (a successor compares histories by it); declaring it writes that
    topic's epochs, not every topic's again (which made declaring N topics cost N²)."""
    async with group_of_two(tmp_path) as (universe, s1, s2):
        client = MqClient(universe.add_broker("app"), "s1:15555", retry=0.5, timeout=60)
        for i in range(20):
            await client.declare(f"t{i}")
        begun: list[str] = []
        begin = TopicLog.begin_epoch

        def counted(log: TopicLog, epoch: int) -> None:
            begun.append(log.directory.name)
            begin(log, epoch)

        monkeypatch.setattr(TopicLog, "begin_epoch", counted)
        await client.declare("last")
        assert begun == ["last"]
        assert s1.catalogue.topics["last"].topic.log.epochs.entries == [(1, 0)]
        client.close()


async def test_a_replica_whose_link_closed_counts_no_more_at_once(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    """Under sync, a replica gone with its link is out of the in-sync count at once (a
    produce is refused then, not held for the in-sync lag), on the topic it followed
    and not on another; the replica that stays is still waited for."""
    async with sync_master(tmp_path) as (universe, server, client):
        await client.declare("audit")
        logs, followers = await two_replicas(universe, tmp_path)
        audit = TopicLog(tmp_path / "r3" / "audit")
        other = Follower(universe.add_broker("r3"), "s1:15555", {"audit": audit},
                         retry=0.5)
        while "audit" not in other.followed:
            await other.changed.wait()
        await client.publish("orders", b"both")
        await client.publish("audit", b"one")
        followers["r1"].close()
        followers["r2"].close()
        for _ in range(100):  # until the master has seen both links close
            if not any(topic == "orders" for _, topic in server.shipper.followers):
                break
            await trio.testing.wait_all_tasks_blocked()
        assert not any(topic == "orders" for _, topic in server.shipper.followers)
        start = trio.current_time()
        with pytest.raises(ServiceError) as caught:
            await client.publish("orders", b"nobody")
        assert trio.current_time() - start < 1.0  # not the in-sync lag (5 s)
        assert "orders: 0 replicas in sync, 1 needed" in caught.value.reason
        stored = await client.publish("audit", b"still copied")
        assert stored.offset == 1 and audit.next_offset == 2
        other.close()
        for log in (*logs.values(), audit):
            log.close()


async def test_a_former_master_s_tail_is_cut_and_it_copies_its_successor(
        tmp_path: pathlib.Path, autojump_clock: object, caplog: pytest.LogCaptureFixture
        ) -> None:
    """s1, master at epoch 1 (``async``), stores a record its replica s2 never got; s2 is
    promoted at epoch 2 and takes writes at that offset; s1, stepped down, follows s2: it
    cuts its record (logged, counted), copies s2's, and its consume group, which had
    been given and had acknowledged the record cut, reads what s2 wrote there.  A copy
    that stops before epoch 2 began follows with nothing cut."""

    async with group_of_two(tmp_path) as (universe, s1, s2):
        client = MqClient(universe.add_broker("app"), "s1:15555", retry=0.5)
        await client.declare("orders")
        follower = s2.follow("s1:15555", retry=0.5)
        await client.publish_many("orders", [b"a", b"b", b"c"])
        copy = s2.replica_logs()["orders"]
        while copy.next_offset < 3:
            await follower.changed.wait()
        s2.promote(2)  # s1 is not told yet: it takes one more write
        await client.publish("orders", b"s1 alone")
        subscription = await client.subscribe("orders", window=10)
        given: list[bytes] = []
        while len(given) < 4:
            messages = await subscription.receive_many()
            given += [m.body for m in messages]
            await subscription.ack([m.offset for m in messages])
        assert given == [b"a", b"b", b"c", b"s1 alone"]
        s1.demote(2)
        client.close()
        writer = MqClient(universe.add_broker("writer"), "s2:15555", retry=0.5)
        assert (await writer.publish("orders", b"s2 at 3")).offset == 3
        assert copy.epochs.entries == [(1, 0), (2, 3)]
        back = s1.follow("s2:15555", retry=0.5)
        mine = s1.replica_logs()["orders"]
        while mine.epochs.entries != copy.epochs.entries or mine.next_offset < 4:
            await back.changed.wait()
        assert back.counts["cut records"] == 1 and "orders" not in back.refused
        assert records(mine) == records(copy)
        assert ("s1 alone" not in str(records(mine))
                and "cut 1 records, offsets 3 to 3 (the last written under epoch 1)"
                in caplog.text)
        reader = MqClient(universe.add_broker("reader"), "s1:15555", retry=0.5)
        assert (await reader.query("orders"))["orders"]["groups"]["orders"]["lag"] == 1
        after = await (await reader.subscribe("orders", window=10)).receive_many()
        assert [(m.offset, m.body) for m in after] == [(3, b"s2 at 3")]
        behind = TopicLog(tmp_path / "s3" / "orders")
        behind.append_copies(b"".join(bytes(c) for c in encode_records(
            copy.read(0, max_count=2), 1 << 20)[0]))
        behind.adopt_epochs(Epochs([(1, 0)]))
        third = Follower(universe.add_broker("s3"), "s2:15555", {"orders": behind},
                         retry=0.5)
        await until(third, behind, 4)
        assert third.counts["cut records"] == 0 and records(behind) == records(copy)
        for closing in (third, reader, writer, s1, s2, behind):
            closing.close()


async def test_a_master_that_steps_down_lets_go_of_its_replicas(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    """A master that sees a newer epoch stops taking writes, closes its replicas' links
    and refuses to be followed: a replica the name service promoted is then free to take
    over (it no longer copies anyone)."""
    from brokermgr import GroupMember

    async with group_of_two(tmp_path) as (universe, s1, s2):
        client = MqClient(universe.add_broker("app"), "s1:15555", retry=0.5)
        await client.declare("orders")
        follower = s2.follow("s1:15555", retry=0.5)
        await client.publish("orders", b"under epoch 1")
        while not follower.copying or s2.replica_logs()["orders"].next_offset < 1:
            await follower.changed.wait()
        s1.demote(2)  # s2 holds epoch 2 now, say
        while follower.copying or "orders" not in follower.refused:
            await follower.changed.wait()
        assert follower.refused["orders"] == ("s1:15555 is a slave of group a: follow at "
                                              "its master (not known here yet)")
        with pytest.raises(ServiceError, match="s1:15555 is a slave of group a"):
            await client.publish("orders", b"refused")
        s2.promote(2)
        assert s2.group == GroupMember("a", 1, "master", epoch=2) and s2.follower is None
        client.close()
        s1.close()
        s2.close()


async def test_members_with_different_configurations_refuse_each_other(
        tmp_path: pathlib.Path, autojump_clock: object, caplog: pytest.LogCaptureFixture
        ) -> None:
    """A slave whose replication settings differ from its master's is refused with both
    configurations, and each side logs it once however often the slave asks again."""
    from brokermgr import GroupMember

    with trio.fail_after(600):
        async with open_universe("replicated") as universe:
            nodes = {name: TrackNode(universe.add_broker(name), role="server",
                                     group=GroupMember("a", i, role, epoch=1), **TIMING)
                     for i, (name, role) in enumerate((("s1", "master"), ("s2", "slave")))}
            s1 = MqServer(nodes["s1"], tmp_path / "s1", fsync_thread=False,
                          replication="sync", min_insync=1)
            s2 = MqServer(nodes["s2"], tmp_path / "s2", fsync_thread=False)
            s1.confirm()
            s1.handle_local({"cmd": "declare", "topic": "orders"})
            follower = s2.follow("s1:15555", retry=0.5, rescan=1.0)
            while "orders" not in follower.refused:
                await follower.changed.wait()
            assert s1.group is not None and s2.group is not None
            mine, theirs = s1.shipper.config(s1.group), s2.shipper.config(s2.group)
            assert mine.startswith("group=a cluster=") and "replication=sync" in mine
            assert "replication=async" in theirs and "checksum=" in theirs
            assert follower.refused["orders"] == (
                f"group a: this master's configuration is '{mine}', the replica's "
                f"'{theirs}': members of a group must share one")
            await trio.sleep(5)  # five more scans, five more refusals: logged once a side
            assert caplog.text.count("members of a group must share one") == 2
            assert s2.replica_logs()["orders"].next_offset == 0
            follower.close()
            s1.close()
            s2.close()
