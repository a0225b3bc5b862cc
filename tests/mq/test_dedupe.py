"""A publish tried again with the same producer and sequence is not stored twice: on the
server that stored it, after that server restarts, and on the member promoted after its
master died, which had copied it; one that member holds only part of is stored whole
(nothing lost).  On trio's virtual clock."""

from __future__ import annotations

import json
import pathlib
import tracemalloc
from collections import OrderedDict
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from brokermgr import open_universe
from brokermgr.tracking import TrackNode
from mq import MqClient, MqServer
from mq.client._client import unique_producer
from mq.topics._dedupe import Recent

from .test_replication import TIMING, group_of_two, master


def bodies(server: MqServer, topic: str = "orders") -> list[bytes]:
    log = server.catalogue.topics[topic].topic.log
    return [bytes(r.body) for r in log.read(0, max_count=1000)]


def test_a_retry_is_found_whole_or_not_at_all() -> None:
    recent = Recent(limit=3)
    recent.add("p", 1, 10, 5)
    assert recent.original("p", 1, 5) == 10
    assert recent.original("p", 1, 4) is None and recent.original("q", 1, 5) is None
    for i in range(3):  # remembered one by one (built from a log)
        recent.add("p", 6 + i, 20 + i, 1)
    assert recent.original("p", 1, 5) is None  # the oldest went (limit 3)
    assert recent.original("p", 6, 3) == 20 and recent.original("p", 7, 2) == 21
    assert recent.original("p", 6, 4) is None  # a fourth message that is not there
    recent.add("p", 10, 30, 1)  # a gap in the offsets: not one publish
    assert recent.original("p", 8, 3) is None
    assert unique_producer("app") != unique_producer("app")


class _Model:
    """The list as a dict of ``(producer, sequence)`` to ``(offset, count)``, oldest
    first (what :class:`Recent` was, and must still answer as)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.publishes: OrderedDict[tuple[str, int], tuple[int, int]] = OrderedDict()

    def add(self, producer: str, sequence: int, offset: int, count: int) -> None:
        self.publishes[(producer, sequence)] = (offset, count)
        if len(self.publishes) > self.limit:
            self.publishes.popitem(last=False)

    def original(self, producer: str, sequence: int, count: int) -> int | None:
        found = self.publishes.get((producer, sequence))
        if found is None:
            return None
        offset, stored = found
        if stored == count:
            return offset
        for i in range(1, count):
            if self.publishes.get((producer, sequence + i)) != (offset + i, 1):
                return None
        return offset


@given(st.integers(1, 6), st.lists(st.tuples(
    st.sampled_from(["p", "q", "r"]), st.integers(-3, 12), st.integers(0, 40),
    st.integers(1, 4), st.booleans()), max_size=60))
def test_the_list_answers_as_a_dict_of_the_newest_publishes(
        limit: int, steps: list[tuple[str, int, int, int, bool]]) -> None:
    recent, model = Recent(limit), _Model(limit)
    for producer, sequence, offset, count, ask in steps:
        if ask:
            assert recent.original(producer, sequence, count) == model.original(
                producer, sequence, count)
        else:
            recent.add(producer, sequence, offset, count)
            model.add(producer, sequence, offset, count)
        assert len(recent) == len(model.publishes)
    for (producer, sequence), (_, count) in model.publishes.items():
        assert recent.original(producer, sequence, count) == model.original(
            producer, sequence, count)


def test_a_full_list_holds_well_under_the_tuples_it_replaced() -> None:
    """Every topic published to keeps one, full after 4,096 publishes: about 380 bytes a
    publish with an (offset, count) tuple and a producer string each (1.5 MB a topic),
    under 260 now."""
    tracemalloc.start()
    try:
        recent = Recent()
        for i in range(2 * recent.limit):
            producer = json.loads('{"producer": "app~7a387b42"}')["producer"]  # as parsed
            recent.add(producer, 10**9 + 200 * i, 10**9 + 200 * i, 200)
        # what the window's code allocated and still holds: not what a thread left running
        # by an earlier test allocates meanwhile (a whole-process count failed once so)
        snapshot = tracemalloc.take_snapshot().filter_traces(
            [tracemalloc.Filter(True, "*/mq/topics/_dedupe.py")])
        held = sum(stat.size for stat in snapshot.statistics("filename"))
    finally:
        tracemalloc.stop()
    assert len(recent) == recent.limit
    assert held < 260 * recent.limit, f"{held / recent.limit:.0f} bytes a publish"


async def test_a_retried_publish_is_answered_with_where_it_went_and_not_stored_again(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    async with master(tmp_path, durability="sync") as (universe, server, client):
        first = MqClient(universe.add_broker("p1"), "s1:15555", producer="p", retry=0.5)
        stored = await first.publish_many("orders", [b"m1", b"m2", b"m3"])
        one = await first.publish("orders", b"m4")
        await client.publish("orders", b"other")
        # the same producer and sequences again (a client whose answers were lost)
        again = MqClient(universe.add_broker("p2"), "s1:15555", producer="p", retry=0.5)
        assert await again.publish_many("orders", [b"m1", b"m2", b"m3"]) == stored
        assert await again.publish("orders", b"m4") == one
        assert server.counts["duplicates"] == 4
        new = await again.publish("orders", b"m5")  # sequence 5: new
        assert new.offset == 5
        assert bodies(server) == [b"m1", b"m2", b"m3", b"m4", b"other", b"m5"]
        first.close()
        again.close()
    # restarted on its directory: the list is built from the log
    async with open_universe("again") as universe:
        node = TrackNode(universe.add_broker("s1"), role="server", **TIMING)
        server = MqServer(node, tmp_path / "s1", fsync_thread=False)
        late = MqClient(universe.add_broker("p3"), "s1:15555", producer="p", retry=0.5)
        assert [s.offset for s in await late.publish_many("orders", [b"m1", b"m2"])] == [0, 1]
        assert server.counts["duplicates"] == 2 and len(bodies(server)) == 6
        late.close()
        server.close()


async def test_the_member_promoted_drops_retries_of_what_it_copied_and_keeps_the_rest(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    """s2 copies s1 frame by frame (a window of 64 KiB: two messages of 40 KB): it has all of a
    first publish and the first two messages of a second when s1 is lost.  Promoted, it
    answers the first publish's retry with where it is, and stores the second's whole:
    two messages twice, none lost."""
    async with group_of_two(tmp_path) as (universe, s1, s2):
        client = MqClient(universe.add_broker("app"), "s1:15555", producer="p",
                          retry=0.5)
        await client.declare("orders")
        follower = s2.follow("s1:15555", retry=0.5, window=1 << 16)
        whole = [b"a%d" % i * 20_000 for i in range(3)]
        await client.publish_many("orders", whole)
        while bodies(s2) != whole:
            await follower.changed.wait()
        frames: list[Any] = []
        copies = follower.copies

        def first_frame_only(link: Any, obj: dict[str, Any]) -> None:
            if not frames:
                frames.append(obj["count"])
                copies(link, obj)

        follower.copies = first_frame_only  # type: ignore[method-assign]
        part = [b"b%d" % i * 20_000 for i in range(4)]
        await client.publish_many("orders", part)
        while not frames:
            await follower.changed.wait()
        assert frames == [2] and bodies(s2) == whole + part[:2]
        client.close()
        s1.close()
        s2.promote(2)
        s2.confirm()
        retry = MqClient(universe.add_broker("retry"), "s2:15555", producer="p",
                         retry=0.5)
        assert [s.offset for s in await retry.publish_many("orders", whole)] == [0, 1, 2]
        assert [s.offset for s in await retry.publish_many("orders", part)] == [
            5, 6, 7, 8]
        assert bodies(s2) == whole + part[:2] + part
        assert s2.counts["duplicates"] == 3
        retry.close()
        s2.close()


async def test_a_quiet_topic_lets_go_of_its_list_and_still_answers_a_retry(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    """A topic that stored nothing for a minute keeps no list (about 1 MB once full, for
    every topic ever published to); a retry then is answered from the log's newest
    records, as after a restart."""
    import trio

    from mq.topics._dedupe import QUIET

    async with master(tmp_path) as (universe, server, client):
        first = MqClient(universe.add_broker("p1"), "s1:15555", producer="p", retry=0.5)
        stored = await first.publish_many("orders", [b"m1", b"m2", b"m3"])
        state = server.catalogue.topics["orders"]
        assert state.recent is not None and len(state.recent) == 1
        await trio.sleep(QUIET / 2)
        await client.publish("orders", b"other")  # not quiet yet: kept
        await trio.sleep(QUIET / 2 + 2)
        assert state.recent is not None
        await trio.sleep(QUIET / 2 + 2)
        assert state.recent is None  # a minute with nothing stored
        again = MqClient(universe.add_broker("p2"), "s1:15555", producer="p", retry=0.5)
        assert await again.publish_many("orders", [b"m1", b"m2", b"m3"]) == stored
        assert server.counts["duplicates"] == 3 and len(bodies(server)) == 4
        assert state.recent is not None  # built again
        first.close()
        again.close()
