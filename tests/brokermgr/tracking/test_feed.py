"""The tracker feed, sans-I/O: pieces, sequence numbers, gaps, and bad shapes."""

from __future__ import annotations

import json

import pytest

from brokermgr.tracking import InfoError, ServerAddress, ServerInfo, TopicInfo
from brokermgr.tracking.feed import (
    Delta,
    FeedReader,
    PieceTooLarge,
    Resync,
    Snapshot,
    delta_pieces,
    entry,
    entry_parts,
    patch,
    snapshot_pieces,
)

HEADER = {"serverAddress": {"address": "t1:15555", "sslEnabled": False},
          "serverVersion": "x", "infoVersion": 7}


def server(name: str, version: int, topics: int = 3) -> ServerInfo:
    address = ServerAddress(f"{name}:15555")
    return ServerInfo(address, version, topic_table={
        f"topic-{i}": TopicInfo(address, f"topic-{i}") for i in range(topics)})


def entries(*infos: ServerInfo) -> list[bytes]:
    return [entry(i.server_address.address, i) for i in infos]


def feed(reader: FeedReader, messages: list[bytes]) -> list[object]:
    return [e for e in (reader.receive(json.loads(m)) for m in messages) if e is not None]


def test_a_snapshot_larger_than_one_piece_is_reassembled() -> None:
    infos = [server(f"s{i:02d}", i + 1) for i in range(30)]
    pieces = snapshot_pieces(HEADER, entries(*infos), budget=2000).numbered(1)
    assert len(pieces) > 5 and all(len(p) <= 2000 + 1024 for p in pieces)
    reader = FeedReader()
    (event,) = feed(reader, pieces)
    assert isinstance(event, Snapshot)
    assert event.tracker_info["infoVersion"] == 7
    table = event.tracker_info["serverTable"]
    assert sorted(table) == sorted(i.server_address.address for i in infos)
    assert ServerInfo.from_json(table["s07:15555"]) == infos[7]
    assert reader.expected == 2


def test_deltas_in_order_then_a_gap_asks_for_a_snapshot() -> None:
    reader = FeedReader()
    feed(reader, snapshot_pieces(HEADER, [], 4096).numbered(1))
    d2 = delta_pieces(8, entries(server("a", 2)), ["b:15555"], 4096).numbered(2)
    (event,) = feed(reader, d2)
    assert event == Delta(8, {"a:15555": server("a", 2).to_json()}, ["b:15555"])
    d4 = delta_pieces(10, [], ["a:15555"], 4096).numbered(4)  # 3 never came
    (resync,) = feed(reader, d4)
    assert isinstance(resync, Resync) and "4 arrived where 3 was expected" in resync.reason
    # until a snapshot arrives, deltas are ignored
    assert feed(reader, delta_pieces(11, [], [], 4096).numbered(5)) == []
    (snap,) = feed(reader, snapshot_pieces(HEADER, [], 4096).numbered(6))
    assert isinstance(snap, Snapshot) and reader.expected == 7


def test_deltas_before_the_first_snapshot_are_ignored() -> None:
    reader = FeedReader()
    assert feed(reader, delta_pieces(3, [], ["a:1"], 4096).numbered(1)) == []


def test_a_delta_in_pieces_applies_whole_or_not_at_all() -> None:
    infos = [server(f"s{i:02d}", 5) for i in range(20)]
    pieces = delta_pieces(9, entries(*infos), [f"gone{i}:1" for i in range(50)],
                          budget=1500).numbered(2)
    assert len(pieces) > 3
    reader = FeedReader()
    feed(reader, snapshot_pieces(HEADER, [], 4096).numbered(1))
    assert feed(reader, pieces[:-1]) == []  # nothing applied before the last piece
    (delta,) = feed(reader, pieces[-1:])
    assert isinstance(delta, Delta) and len(delta.servers) == 20 and len(delta.left) == 50


def test_pieces_out_of_order_ask_for_a_snapshot() -> None:
    reader = FeedReader()
    feed(reader, snapshot_pieces(HEADER, [], 4096).numbered(1))
    pieces = delta_pieces(9, entries(*[server(f"s{i}", 5) for i in range(20)]), [],
                          budget=1500).numbered(2)
    (event,) = feed(reader, [pieces[0], pieces[2]])
    assert isinstance(event, Resync) and "out of order" in event.reason


def test_a_server_info_larger_than_a_piece_is_refused_with_its_size() -> None:
    with pytest.raises(PieceTooLarge, match="does not fit in a piece"):
        snapshot_pieces(HEADER, entries(server("big", 1, topics=50)), budget=1000)


def test_a_server_info_larger_than_a_piece_goes_in_parts_that_join_again() -> None:
    big, small = server("big", 4, topics=50), server("small", 2)
    parts = entry_parts("big:15555", big, budget=1000)
    assert len(parts) > 3 and all(len(p) + 1 <= 1000 for p in parts)
    assert entry_parts("small:15555", small, budget=1000) == entries(small)
    reader = FeedReader()
    (snap,) = feed(reader, snapshot_pieces(HEADER, [*parts, *entries(small)],
                                           budget=1000).numbered(1))
    assert isinstance(snap, Snapshot)
    table = snap.tracker_info["serverTable"]
    assert ServerInfo.from_json(table["big:15555"]) == big
    assert ServerInfo.from_json(table["small:15555"]) == small
    bigger = server("big", 5, topics=60)  # a delta of it: parts again, joined again
    (delta,) = feed(reader, delta_pieces(9, entry_parts("big:15555", bigger, 1000), [],
                                         budget=1000).numbered(2))
    assert isinstance(delta, Delta) and ServerInfo.from_json(delta.servers["big:15555"]) == bigger


def test_parts_of_one_server_that_disagree_are_a_clear_error() -> None:
    old = entry_parts("big:15555", server("big", 4, topics=50), budget=1000)[0]
    new = entry_parts("big:15555", server("big", 5, topics=50), budget=1000)[1]
    reader = FeedReader()
    feed(reader, snapshot_pieces(HEADER, [], 4096).numbered(1))
    with pytest.raises(InfoError, match="disagree on its infoVersion"):
        feed(reader, delta_pieces(9, [old, new], [], budget=1000).numbered(2))


def test_a_topic_that_does_not_fit_a_piece_with_its_server_info_is_refused() -> None:
    address = ServerAddress("big:15555")
    info = ServerInfo(address, 1, topic_table={"t" * 900: TopicInfo(address, "t" * 900)})
    with pytest.raises(PieceTooLarge, match="topic 'tttt.*does not fit in a piece"):
        entry_parts("big:15555", info, budget=1000)


def test_a_patch_carries_the_topics_that_changed_and_those_that_went() -> None:
    held, info = server("s", 4, topics=50), server("s", 5, topics=49)
    address = ServerAddress("s:15555")
    info.topic_table["new"] = TopicInfo(address, "new", mask=2)
    made = patch("s:15555", held, info)
    reader = FeedReader()
    feed(reader, snapshot_pieces(HEADER, [], 4096).numbered(1))
    (delta,) = feed(reader, delta_pieces(9, [], [], 4096, [made]).numbered(2))
    assert isinstance(delta, Delta) and delta.servers == {} and delta.left == []
    value = delta.patches["s:15555"]
    assert value["base"] == 4 and value["removed"] == ["topic-49"]
    assert list(value["serverInfo"]["topicTable"]) == ["new"]  # the 49 others as they were
    assert value["serverInfo"]["infoVersion"] == 5


@pytest.mark.parametrize("bad, error", [
    ({"base": -1, "removed": [], "serverInfo": {}}, "'base' must be a non-negative integer"),
    ({"base": 1, "removed": [3], "serverInfo": {}}, "removed must be a list of topic names"),
    ({"base": 1, "removed": []}, "serverInfo: expected a JSON object"),
])
def test_a_bad_patch_is_a_clear_error(bad: dict, error: str) -> None:  # type: ignore[type-arg]
    reader = FeedReader()
    feed(reader, snapshot_pieces(HEADER, [], 4096).numbered(1))
    message = {"cmd": "track_delta", "seq": 2, "piece": 0, "pieces": 1, "infoVersion": 3,
               "servers": {}, "left": [], "patches": {"s:15555": bad}}
    with pytest.raises(InfoError, match=error):
        reader.receive(message)


def test_a_zbus_full_snapshot_without_seq_is_a_snapshot() -> None:
    event = FeedReader().receive({"cmd": "track_pub", "trackerInfo": {"x": 1}})
    assert event == Snapshot({"x": 1})


@pytest.mark.parametrize("message, error", [
    ({"cmd": "track_delta", "seq": -1, "piece": 0, "pieces": 1}, "'seq' must be"),
    ({"cmd": "track_delta", "seq": 1, "piece": 1, "pieces": 1}, "piece 1 of 1"),
    ({"cmd": "track_delta", "seq": 1, "piece": 0, "pieces": 1 << 20}, "at most"),
    ({"cmd": "track_pub", "seq": 1, "piece": 0, "pieces": 1, "trackerInfo": []},
     "expected a JSON object"),
    ({"cmd": "hello"}, "unexpected cmd"),
])
def test_bad_shapes_are_clear_errors(message: dict, error: str) -> None:  # type: ignore[type-arg]
    reader = FeedReader()
    reader.expected = 1
    with pytest.raises(InfoError, match=error):
        reader.receive(message)


def test_a_delta_with_bad_left_is_a_clear_error() -> None:
    reader = FeedReader()
    reader.expected = 1
    with pytest.raises(InfoError, match="left must be a list"):
        reader.receive({"cmd": "track_delta", "seq": 1, "piece": 0, "pieces": 1,
                        "infoVersion": 3, "servers": {}, "left": [1]})
