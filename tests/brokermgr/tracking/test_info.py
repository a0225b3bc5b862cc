"""Tracking data: zbus's JSON shapes both ways, clear errors, versions across restarts."""

from __future__ import annotations

import json
import pathlib

import pytest

from brokermgr.tracking import (
    ConsumeGroupInfo,
    InfoError,
    ServerAddress,
    ServerInfo,
    TopicInfo,
    TrackerInfo,
    VersionCounter,
)
from brokermgr.tracking.info import COUNTER_BITS


def sample() -> TrackerInfo:
    sa = ServerAddress("s1:15555", ssl_enabled=True)
    group = ConsumeGroupInfo("orders", "billing", mask=16, filter="eu.*", message_count=3,
                             consumer_count=1, consumer_list=("c1",), creator="me",
                             created_time=1, last_updated_time=2)
    topic = TopicInfo(sa, "orders", "v", 1, 3, 1, (group,), "me", 1, 2)
    info = ServerInfo(sa, 7, "v", (ServerAddress("t1:15555"),), {"orders": topic})
    return TrackerInfo(ServerAddress("t1:15555"), 9, "v", {"s1:15555": info})


def test_json_round_trip_uses_zbus_field_names() -> None:
    info = sample()
    text = json.dumps(info.to_json())
    assert TrackerInfo.from_json(json.loads(text)) == info
    wire = json.loads(text)
    server = wire["serverTable"]["s1:15555"]
    assert set(server) == {"serverAddress", "serverVersion", "error", "infoVersion",
                           "trackerList", "topicTable"}
    assert server["serverAddress"] == {"address": "s1:15555", "sslEnabled": True}
    topic = server["topicTable"]["orders"]
    assert {"topicName", "mask", "messageDepth", "consumerCount", "consumeGroupList",
            "creator", "createdTime", "lastUpdatedTime"} <= set(topic)
    assert topic["consumeGroupList"][0]["groupName"] == "billing"
    assert str(info.server_table["s1:15555"].server_address) == "[SSL]s1:15555"


def test_a_server_info_s_encoding_is_its_json() -> None:
    from dataclasses import replace

    from brokermgr import GroupMember

    server = sample().server_table["s1:15555"]
    for info in (server, replace(server, group=GroupMember("a", 0, "master", 3), held=5,
                                 error="disk", topic_table={})):
        encoded = info.encoded()
        assert encoded == json.dumps(info.to_json(), separators=(",", ":"),
                                     sort_keys=True).encode()
        assert ServerInfo.from_json(json.loads(encoded)) == info
    topic = server.topic_table["orders"]
    renamed = replace(topic, message_depth=9)  # a new info: encoded anew, not the old one's
    assert json.loads(b"{%s}" % renamed.entry("orders"))["orders"]["messageDepth"] == 9
    assert json.loads(b"{%s}" % topic.entry("orders"))["orders"]["messageDepth"] == 3


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda w: w.pop("infoVersion"), "missing field 'infoVersion'"),
    (lambda w: w.update(infoVersion="9"), "'infoVersion' must be int"),
    (lambda w: w.update(infoVersion=-1), "must not be negative"),
    (lambda w: w["serverTable"].update({"other:1": w["serverTable"]["s1:15555"]}),
     "holds server 's1:15555'"),
    (lambda w: w["serverTable"]["s1:15555"]["serverAddress"].update(address="nocolon"),
     "must be 'broker:port'"),
    # a rendezvous port is 0..65535 here as at connect (this once took up to 2**32 - 1)
    (lambda w: w["serverTable"]["s1:15555"]["serverAddress"].update(address="s1:70000"),
     r"must be 'broker:port' with a port within 0\.\.65535"),
    (lambda w: w["serverTable"]["s1:15555"]["topicTable"]["orders"].update(topicName="x"),
     "names topic 'x'"),
    (lambda w: w.update(serverTable=[]), "expected a JSON object"),
])
def test_bad_shapes_get_a_clear_error(mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    wire = sample().to_json()
    mutate(wire)
    with pytest.raises(InfoError, match=message):
        TrackerInfo.from_json(wire)


def test_versions_increase_on_every_change_and_across_restarts(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "state" / "s1.server.epoch"
    first = VersionCounter(path, clock=lambda: 0.0)
    seen = [first.next() for _ in range(5)]
    assert seen == sorted(set(seen))
    again = VersionCounter(path, clock=lambda: 0.0)  # a restart: the clock did not move
    assert again.next() > seen[-1]
    assert path.read_text().strip() == "2"


def test_the_counter_rolls_into_a_new_epoch(tmp_path: pathlib.Path) -> None:
    counter = VersionCounter(tmp_path / "e", clock=lambda: 0.0)
    counter.counter = (1 << COUNTER_BITS) - 1
    before = counter.current
    after = counter.next()
    assert after > before and counter.epoch == 2
    assert VersionCounter(tmp_path / "e", clock=lambda: 0.0).next() > after


def test_without_a_state_file_versions_start_from_the_wall_clock() -> None:
    # zbus's way, with a 32.32 fixed-point start: a restart a microsecond later
    # still starts above 4,000 changes of the run before
    first = VersionCounter(clock=lambda: 1_790_000_000.25)
    assert first.current == int(1_790_000_000.25 * (1 << COUNTER_BITS))
    seen = [first.next() for _ in range(4000)]
    again = VersionCounter(clock=lambda: 1_790_000_000.250001)
    assert again.next() > seen[-1]


def test_a_state_file_never_goes_below_the_clock_nor_back_with_it(
        tmp_path: pathlib.Path) -> None:
    clockless = VersionCounter(clock=lambda: 1_790_000_000.5)  # ran without a state_dir
    last = clockless.next()
    persisted = VersionCounter(tmp_path / "e", clock=lambda: 1_790_000_001.0)
    assert persisted.next() > last
    behind = VersionCounter(tmp_path / "e", clock=lambda: 5.0)  # the clock went back
    assert behind.next() > persisted.current


def test_a_corrupt_version_file_is_a_clear_error(tmp_path: pathlib.Path) -> None:
    (tmp_path / "e").write_text("twelve\n")
    with pytest.raises(InfoError, match="one integer"):
        VersionCounter(tmp_path / "e")


def test_parsing_a_snapshot_reuses_server_infos_already_held() -> None:
    info = sample()
    held = info.server_table["s1:15555"]
    wire = info.to_json()
    same = TrackerInfo.from_json(wire, known={"s1:15555": held}.get)
    assert same.server_table["s1:15555"] is held
    wire["serverTable"]["s1:15555"]["infoVersion"] = 8
    wire["serverTable"]["s1:15555"]["topicTable"] = {}
    newer = TrackerInfo.from_json(wire, known={"s1:15555": held}.get)
    assert newer.server_table["s1:15555"].info_version == 8
    assert newer.server_table["s1:15555"].topic_table == {}
    wire["serverTable"]["s1:15555"]["infoVersion"] = "7"  # bad shapes are still caught
    with pytest.raises(InfoError, match="must be int"):
        TrackerInfo.from_json(wire, known={"s1:15555": held}.get)


def test_a_server_s_report_reuses_the_topics_unchanged_since_its_last() -> None:
    """A server reports every topic on every change: those whose JSON is what the held
    report's was are taken from it, the others parsed; the result is what a full parse
    gives, and a bad shape in a changed topic is still caught."""
    held = sample().server_table["s1:15555"]
    wire = held.to_json()
    wire["infoVersion"] = 8
    wire["topicTable"]["audit"] = {**wire["topicTable"]["orders"], "topicName": "audit"}
    again = ServerInfo.from_json(wire, previous=held)
    assert again == ServerInfo.from_json(wire)
    assert again.topic_table["orders"] is held.topic_table["orders"]
    assert again.topic_table["audit"] is not held.topic_table["orders"]
    wire["topicTable"]["orders"]["mask"] = 5  # the same times, another mask: parsed
    changed = ServerInfo.from_json(wire, previous=held)
    assert changed.topic_table["orders"].mask == 5
    wire["topicTable"]["orders"]["mask"] = "5"
    with pytest.raises(InfoError, match="must be int"):
        ServerInfo.from_json(wire, previous=held)


async def test_a_tracker_keeps_the_topics_a_new_report_did_not_change(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    """A tracker parses only what a server's new report changed: its other topics are the
    objects it held."""
    import trio

    from brokermgr import open_universe
    from brokermgr.tracking import TrackNode

    async with open_universe("reuse") as universe:
        tracker = TrackNode(universe.add_broker("t1"), role="tracker", state_dir=tmp_path)
        server = TrackNode(universe.add_broker("s1"), role="server", trackers=["t1:15555"],
                           state_dir=tmp_path)
        assert tracker.tracker is not None

        def held() -> ServerInfo | None:
            entry = tracker.tracker.tracked.get("s1:15555")  # type: ignore[union-attr]
            return None if entry is None else entry.value

        server.declare_topic("orders")
        while (first := held()) is None or "orders" not in first.topic_table:
            await trio.sleep(0.01)  # the report's way: the virtual clock driven
        server.declare_topic("audit")
        while (second := held()) is None or "audit" not in second.topic_table:
            await trio.sleep(0.01)
        assert second.topic_table["orders"] is first.topic_table["orders"]


async def test_a_server_s_topics_stay_in_order_as_they_come_in_any_order(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    """The ServerInfo lists its topics by name whatever order they were declared in (the
    table is sorted again only when a name comes before the last)."""
    from brokermgr import open_universe
    from brokermgr.tracking import TrackNode

    async with open_universe("order") as universe:
        server = TrackNode(universe.add_broker("s1"), role="server", state_dir=tmp_path)
        for name in ("m", "x", "b", "z", "a", "m"):
            server.declare_topic(name)
        assert server.server is not None
        assert list(server.server.info.topic_table) == ["a", "b", "m", "x", "z"]
        server.remove_topic("b")
        server.declare_topic("c")
        assert list(server.server.info.topic_table) == ["a", "c", "m", "x", "z"]
