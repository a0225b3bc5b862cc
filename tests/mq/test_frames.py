"""The rules of ``produce`` and ``messages`` frames and acks, sans-I/O: a server cuts a
produce request's body into its messages as the sizes say; a relaying server reads the
root's frames back as they were framed and ends the frames for its local consumers where
credits or bytes say; a client acks what it holds and drops what came on a lost link."""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from brokermgr import decode
from mq.client._subscription import cut as cut_runs
from mq.cluster._relay_groups import Relayed, RelayedFrame, relayed_messages, take_frame
from mq.server._produce import cut_bodies
from mq.storage._files import VIEW_BODY
from mq.storage._record import Produced, Record
from mq.topics._delivery import (
    FRAME_BYTES,
    FRAME_MESSAGES,
    FRAME_TAIL,
    _parts,
    messages_frame,
)
from mq.topics._group import Run
from mq.topics._wire import check_sizes, pack_column, unpack_column, unpack_sizes

_MESSAGES = st.lists(st.tuples(st.sampled_from([None, "a", "b.c"]), st.sampled_from(["p", "q"]),
                               st.integers(0, 3), st.integers(1, 3), st.binary(max_size=40)),
                     min_size=1, max_size=30)


def _relayed(rows: list[tuple[str | None, str, int, int, bytes]]) -> list[Relayed]:
    return [Relayed(100 + i, tag, producer, 7 + seq, deliveries, 1_000 + i, body)
            for i, (tag, producer, seq, deliveries, body) in enumerate(rows)]


@given(sizes=st.one_of(
    st.lists(st.integers(0, 300), min_size=1, max_size=40),  # small, of many sizes
    st.tuples(st.integers(0, 300), st.integers(1, 40)).map(lambda p: [p[0]] * p[1]),  # one
    st.lists(st.sampled_from([0, 5, VIEW_BODY - 1, VIEW_BODY, VIEW_BODY + 3]), min_size=1,
             max_size=6)),
       as_view=st.booleans())
def test_a_produce_body_is_cut_as_its_sizes_say(sizes: list[int], as_view: bool) -> None:
    """Every message as sent, in order: views of the request when one is large (written
    and kept uncopied), else bytes (the log's tail keeps them without a copy), cut when
    the tail keeps a producer's run of them."""
    data = bytes(i % 251 for i in range(sum(sizes)))
    body = memoryview(data) if as_view else data
    large = max(sizes) >= VIEW_BODY
    cut = cut_bodies(body, tuple(sizes)) if large else [
        entry[3] for entry in Produced("t", "p", 7, body, tuple(sizes)).entries()]
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    assert [bytes(m) for m in cut] == [data[a:a + n] for a, n in zip(starts, sizes, strict=True)]
    assert {type(m) for m in cut} == {memoryview if large else bytes}


def client_cut_bodies(body: bytes | memoryview, sizes: list[Any]) -> Sequence[bytes]:
    """A ``messages`` frame's bodies as a client takes them: its sizes checked, then cut."""
    check_sizes(body, sizes)
    return cut_runs(body, sizes)


@given(sizes=st.one_of(
    st.lists(st.integers(0, 300), min_size=1, max_size=40),
    st.tuples(st.integers(0, 300), st.integers(1, 40)).map(lambda p: [p[0]] * p[1]),
    st.lists(st.sampled_from([0, 7, 4095, 4096, 9000]), min_size=1, max_size=6)),
       as_view=st.booleans())
def test_a_client_cuts_a_frame_s_bodies_into_bytes_as_its_sizes_say(sizes: list[int],
                                                                   as_view: bool) -> None:
    data = bytes(i % 251 for i in range(sum(sizes)))
    cut = client_cut_bodies(memoryview(data) if as_view else data, sizes)
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    assert list(cut) == [data[a:a + n] for a, n in zip(starts, sizes, strict=True)]
    assert {type(m) for m in cut} == {bytes}


@pytest.mark.parametrize(("sizes", "why"), [
    ([3, 3], "do not add up"), ([2, 5], "do not add up"), ([-1, 6], "non-negative"),
    ([2.5, 2.5], "integers"), ([True] * 5, "integers"), (["5"], "integers"),
    ([5, None], "integers"), ([1, 1.0, True, 1, 1], "integers")])
def test_a_client_refuses_sizes_that_are_not_its_body_s(sizes: list[object], why: str) -> None:
    with pytest.raises(ValueError, match=why):
        client_cut_bodies(b"hello", sizes)


@given(sizes=st.one_of(
    st.lists(st.integers(0, 300), min_size=1, max_size=40),
    st.tuples(st.integers(0, 300), st.integers(1, 40)).map(lambda p: [p[0]] * p[1])))
def test_a_frame_s_sizes_read_back_as_they_were_packed(sizes: list[int]) -> None:
    """A ``messages`` frame's sizes column, one size for all or a list or runs, reads
    back as the sizes it was made of, checked against the bodies."""
    assert unpack_sizes(pack_column(sizes), len(sizes), bytes(sum(sizes))) == sizes


@pytest.mark.parametrize(("column", "count", "why"), [
    (2, 2, "add up"), (-1, 1, "non-negative"), (True, 5, "integers"), (2.5, 2, "integers"),
    ("5", 1, "integers"), ({"runs": [2, 1, 4, 1]}, 2, "add up"), ([3, -1], 2, "non-negative"),
    ([5], 2, "column of 1"), ([1, 1.0, True, 1, 1], 5, "integers")])
def test_a_frame_s_sizes_that_are_not_its_body_s_are_refused(column: object, count: int,
                                                              why: str) -> None:
    """One size for all is held to the body as the list of them would be."""
    with pytest.raises(ValueError, match=why):
        unpack_sizes(column, count, b"hello")


@given(rows=_MESSAGES)
def test_a_relayed_frame_reads_back_as_it_was_framed(
        rows: list[tuple[str | None, str, int, int, bytes]]) -> None:
    messages = _relayed(rows)
    frame = messages_frame("t", "g", messages, [m.deliveries for m in messages])
    assert relayed_messages(decode(bytes(frame))) == messages


@given(rows=_MESSAGES)
def test_a_frame_passed_on_whole_reads_as_the_root_s_for_its_group(
        rows: list[tuple[str | None, str, int, int, bytes]]) -> None:
    """A relaying server passes a root's frame (for several groups) on to a consumer of
    one of them as it came: it reads back as the same messages, named for that group
    only; and each message can be taken out of it by its offset."""
    messages = _relayed(rows)
    frame = RelayedFrame.check(decode(bytes(messages_frame(
        "t", "g0", messages, [m.deliveries for m in messages], ["g0", "g1"]))))
    assert list(frame.offsets) == [m.offset for m in messages]
    passed = decode(bytes(frame.forward("g1")))
    assert (passed["topic"], passed["group"], "groups" in passed) == ("t", "g1", False)
    assert relayed_messages(passed) == messages
    assert [frame.message_at(m.offset) for m in reversed(messages)] == messages[::-1]


def test_a_frame_of_two_batches_sends_their_columns_as_runs_and_reads_back_whole() -> None:
    """Two producers' batches of 100, each stamped once: the frame's header names two
    runs of each column that changes between them (not 200 values), a relaying server
    passes it on as it came, and it reads back as the same messages."""
    messages = [Relayed(500 + i, None, "p" if i < 100 else "q", 1 + i % 100, 1,
                        7_000 if i < 100 else 7_003, b"%03d" % i) for i in range(200)]
    frame = bytes(messages_frame("t", "g0", messages, [1] * 200, ["g0", "g1"]))
    obj = decode(frame)
    assert (obj["offsets"], obj["producers"], obj["sequences"], obj["timestamps"]) == (
        500, {"runs": ["p", 100, "q", 100]}, {"runs": [1, 100, 1, 100]},
        {"runs": [7_000, 100, 7_003, 100]})
    assert len(frame) - 600 < 300  # the header: a few hundred bytes, not thousands
    assert relayed_messages(obj) == messages
    passed = decode(bytes(RelayedFrame.check(obj).forward("g1")))
    assert relayed_messages(passed) == messages


@pytest.mark.parametrize(("change", "why"), [
    ({"count": 0}, "count"), ({"count": "2"}, "count"), ({"sizes": [1]}, "column of 1"),
    ({"offsets": "7"}, "counting column"), ({"tags": [None]}, "column of 1"),
    ({"timestamps": {"runs": [5, 1]}}, "column of 1"),
    ({"sequences": {"runs": ["1", 2]}}, "starts at an integer"),
    ({"sizes": [1, 1]}, "add up"), ({"sizes": 2}, "add up"),
    ({"sizes": [-1, 4]}, "non-negative"), ({"sizes": "x"}, "integers"),
    ({"sizes": [1.5, 1.5]}, "integers")])
def test_a_relaying_server_refuses_a_frame_that_is_not_one(change: dict[str, object],
                                                           why: str) -> None:
    messages = _relayed([(None, "p", 0, 1, b"ab"), ("a", "q", 1, 1, b"c")])
    obj = decode(bytes(messages_frame("t", "g", messages, [1, 1])))
    obj.update(change)
    with pytest.raises(ValueError, match=why):
        RelayedFrame.check(obj)


@given(sizes=st.lists(st.integers(0, 50), min_size=1, max_size=40),
       credits=st.integers(1, 45), frame_bytes=st.integers(1, 200), tail=st.integers(0, 60))
def test_a_frame_for_a_local_consumer_ends_where_credits_or_its_bytes_do(
        sizes: list[int], credits: int, frame_bytes: int, tail: int) -> None:
    """Credits or bytes end a frame; a rest under ``tail`` bytes that the credits take
    rides along."""
    messages = [Relayed(i, None, "p", i, 1, 0, b"x" * n) for i, n in enumerate(sizes)]
    expected: list[Relayed] = []
    size = 0
    rest = deque(messages)
    while rest and len(expected) < credits and size < frame_bytes:  # one at a time
        expected.append(rest.popleft())
        size += len(expected[-1].body)
    if (size >= frame_bytes and len(expected) + len(rest) <= credits
            and sum(len(m.body) for m in rest) < tail):
        expected += rest
        rest.clear()
    pending = deque(messages)
    assert take_frame(pending, credits, frame_bytes, tail) == expected
    assert list(pending) == list(rest)


@given(held=st.sets(st.integers(0, 20)), stale=st.sets(st.integers(0, 20)),
       offsets=st.one_of(st.lists(st.integers(0, 20), min_size=1, max_size=12),
                         st.builds(range, st.integers(0, 20), st.integers(0, 26))),
       as_runs=st.booleans())
def test_a_client_acks_what_it_holds_and_drops_what_came_on_a_lost_link(
        held: set[int], stale: set[int], offsets: list[int] | range, as_runs: bool) -> None:
    """Each offset the subscription holds is taken (once), one that came on a lost link
    is dropped from the ack (delivered again), any other is kept for the server to
    refuse; a consecutive run goes as its first offset and a count.  Held offsets came
    in frames of consecutive runs (``as_runs``) or one by one; acks name lists or
    ranges."""
    from mq.client._subscription import Subscription
    from mq.topics._held import Held

    sub = Subscription(None, "t", "g", 10)  # type: ignore[arg-type]
    sub.held = Held()
    ordered = sorted(held)
    if as_runs:  # each stretch of consecutive offsets one frame
        for _, run in itertools.groupby(enumerate(ordered), lambda p: p[1] - p[0]):
            stretch = [o for _, o in run]
            sub.held.add(range(stretch[0], stretch[-1] + 1), None)
    else:
        for offset in ordered:
            sub.held.add([offset], None)
    assert len(sub.held) == len(held)
    sub.stale = dict.fromkeys(sorted(stale - held))
    left_held, left_stale = dict.fromkeys(held), dict.fromkeys(stale - held)
    kept = _by_the_rule(left_held, left_stale, offsets)
    assert _sent(sub.ack_request(offsets)) == (kept or None)
    assert (set(sub.held), set(sub.stale)) == (set(left_held), set(left_stale))
    assert len(sub.held) == len(left_held)


def _by_the_rule(held: dict[int, None], stale: dict[int, None], offsets: Sequence[int]
                 ) -> list[int]:
    """What an ack of ``offsets`` sends, by the rule, one offset at a time (``held`` and
    ``stale`` updated): a held one is taken, one that came on a lost link dropped, any
    other kept for the server to refuse."""
    kept = []
    for offset in offsets:
        if offset in held:
            del held[offset]
            kept.append(offset)
        elif offset in stale:
            del stale[offset]
        else:
            kept.append(offset)
    return kept


def _sent(request: dict[str, Any] | None) -> list[int] | None:
    """The offsets an ack request names (a first and a count, or a list)."""
    if request is None:
        return None
    first = request["offsets"]
    return list(range(first, first + request["count"])) if "count" in request else first


@pytest.mark.parametrize(("rest", "frames"), [(0, 1), (1, 1), (FRAME_TAIL - 1, 1),
                                              (FRAME_TAIL, 2), (FRAME_BYTES, 2)])
def test_a_run_s_small_rest_goes_in_the_frame_before_it(rest: int, frames: int) -> None:
    """A run cut where its bodies reach FRAME_BYTES, but a rest under FRAME_TAIL rides
    along rather than going as a frame of a few messages; every message once, in order."""
    sizes = [1000] * (FRAME_BYTES // 1000) + [FRAME_BYTES % 1000 + 1]  # just past a frame
    sizes += [1000] * (rest // 1000) + ([rest % 1000] if rest % 1000 else [])
    records = [Record(10 + i, 5, i + 1, None, "p", bytes([i % 251]) * size)
               for i, size in enumerate(sizes)]
    made = _parts("t", [Run("t", "g", records, None, 0.0)], {},  # type: ignore[arg-type]
                  FRAME_BYTES)
    assert len(made) == frames
    offsets = [o for columns, _ in made
               for o in unpack_column(columns["offsets"], columns["count"], counting=True)]
    assert offsets == [r.offset for r in records]
    got_sizes = [[n for n in unpack_column(columns["sizes"], columns["count"])]
                 for columns, _ in made]
    assert sum(got_sizes, []) == sizes
    assert [sum(len(piece) for piece in body) for _, body in made] == list(map(sum, got_sizes))
    assert sum(got_sizes[0]) >= FRAME_BYTES


@pytest.mark.parametrize(("size", "most", "per_frame"), [
    (64 << 10, 768 << 10, 12),  # over a socket: as many as the far ring takes whole
    (64 << 10, FRAME_BYTES, 3),  # within a process: the shared ring's worth
    (20 << 10, 768 << 10, FRAME_MESSAGES),  # FRAME_BYTES passed, FRAME_MESSAGES reached
    (1000, 768 << 10, 197),  # small messages: FRAME_BYTES ends the frame as before
    (1 << 20, 768 << 10, 1),  # longer than ``most``: a frame of its own
])
def test_a_frame_of_large_messages_holds_more_of_them_as_far_as_the_link_takes_it(
        size: int, most: int, per_frame: int) -> None:
    """Past FRAME_BYTES, a frame of large messages goes on to FRAME_MESSAGES of them
    within ``most`` bytes of bodies (what the link's other end takes out of its ring
    whole), so that a frame's own cost is not paid for every three 64 KiB messages."""
    count = 4 * per_frame
    records = [Record(i, 5, i + 1, None, "p", bytes([i % 251]) * size)
               for i in range(count)]
    made = _parts("t", [Run("t", "g", records, None, 0.0)], {},  # type: ignore[arg-type]
                  most)
    counts = [columns["count"] for columns, _ in made]
    assert counts == [per_frame] * 4
    for columns, bodies in made:
        held = sum(len(piece) for piece in bodies)
        assert held >= FRAME_BYTES or columns["count"] == 1
        assert held <= max(most, size)
    offsets = [o for columns, _ in made
               for o in unpack_column(columns["offsets"], columns["count"], counting=True)]
    assert offsets == list(range(count))


_HELD_OPS = st.lists(st.one_of(
    st.tuples(st.just("add"), st.builds(range, st.integers(0, 30), st.integers(0, 40))),
    st.tuples(st.just("add"), st.lists(st.integers(0, 40), max_size=6)),
    st.tuples(st.just("ack"), st.builds(range, st.integers(0, 30), st.integers(0, 40))),
    st.tuples(st.just("ack"), st.lists(st.integers(0, 40), min_size=1, max_size=6)),
    st.tuples(st.just("lost"), st.none()),
    st.tuples(st.just("ack added"), st.integers(0, 5))), max_size=25)


@given(ops=_HELD_OPS)
def test_what_a_client_holds_follows_its_frames_acks_and_lost_links(
        ops: list[tuple[str, object]]) -> None:
    """Frames of runs or scattered offsets (overlapping what is held, too), acks of any
    offsets, lost links, in any order: what is held, what is stale and every ack sent
    are as if each offset were held on its own."""
    from mq.client._subscription import Subscription

    sub = Subscription(None, "t", "g", 10_000)  # type: ignore[arg-type]
    held: dict[int, None] = {}
    stale: dict[int, None] = {}
    added: list[range] = []  # the runs added: acks of exactly those are drawn too
    for op, arg in ops:
        if op == "ack added":
            if not added:
                continue
            assert isinstance(arg, int)
            op, arg = "ack", added[arg % len(added)]
        if op == "add":
            assert isinstance(arg, (list, range))
            sub.held.add(arg, None)
            held.update(dict.fromkeys(arg))
            if isinstance(arg, range):
                added.append(arg)
        elif op == "lost":
            sub.link_lost()
            stale.update(held)
            held = {}
        else:
            assert isinstance(arg, (list, range))
            kept = _by_the_rule(held, stale, arg)
            assert _sent(sub.ack_request(arg)) == (kept or None)
        assert set(sub.held) == set(held) and len(sub.held) == len(held)
        assert set(sub.stale) == set(stale)
        assert all(offset in sub.held for offset in held)


def test_a_client_forgets_the_oldest_it_holds_past_its_bound() -> None:
    """Runs first, oldest first, then single offsets: what is held stays within the
    bound, and the newest are what is left."""
    from mq.topics._held import Held

    held: Held[None] = Held()
    held.add(range(0, 10), None)
    held.add([20, 21, 25], None)
    held.add(range(30, 35), None)
    held.trim(9)
    assert sorted(held) == [20, 21, 25, 30, 31, 32, 33, 34] and len(held) == 8
    held.trim(2)
    assert list(held) == [21, 25]
    assert len(held) == 2


_VALUED_OPS = st.lists(st.one_of(
    st.tuples(st.just("add"), st.builds(range, st.integers(0, 30), st.integers(0, 40)),
              st.integers(0, 3)),
    st.tuples(st.just("add"), st.lists(st.integers(0, 40), max_size=6), st.integers(0, 3)),
    st.tuples(st.just("pop"), st.integers(0, 40), st.none()),
    st.tuples(st.just("take"), st.builds(range, st.integers(0, 30), st.integers(0, 40)),
              st.none()),
    st.tuples(st.just("take"), st.lists(st.integers(0, 40), max_size=6), st.none()),
    st.tuples(st.just("take added"), st.integers(0, 5), st.none()),
    st.tuples(st.just("drain"), st.none(), st.none())), max_size=25)


@given(ops=_VALUED_OPS)
def test_held_offsets_keep_what_was_delivered_under_each(
        ops: list[tuple[str, object, object]]) -> None:
    """A relaying server's held offsets (each with the message or frame it went in):
    frames added as runs or one by one, overlapping or not, offsets popped, acks of
    ranges and lists taken whole or not at all, all drained: the same offsets and values
    as one entry per offset."""
    from mq.topics._held import Held

    held: Held[int] = Held()
    model: dict[int, int] = {}
    added: list[range] = []
    for op, arg, value in ops:
        if op == "take added":
            if not added:
                continue
            assert isinstance(arg, int)
            op, arg = "take", added[arg % len(added)]
        if op == "add":
            assert isinstance(arg, (list, range)) and isinstance(value, int)
            held.add(arg, value)
            model.update(dict.fromkeys(arg, value))
            if isinstance(arg, range):
                added.append(arg)
        elif op == "pop":
            assert isinstance(arg, int)
            assert held.pop(arg) == model.pop(arg, None)
        elif op == "take":
            assert isinstance(arg, (list, range))
            named = list(arg)
            whole = isinstance(arg, range) and held.take_run(arg) or held.take_each(arg)
            if whole:  # taken only if every one was held, each named once
                assert len(set(named)) == len(named) and all(o in model for o in named)
                for offset in named:
                    del model[offset]
        else:
            assert held.drain() == model
            model = {}
        assert dict(held.items()) == model and len(held) == len(model)
        assert sorted(held) == sorted(model) and list(held.values()) == [
            value for _, value in held.items()]


#: Runs handed to the groups of one relaying server, as a root hands them: each
#: ``(topic, groups, first, count, gap)``, of one of three topics, to the first of three
#: groups or several at once, from any offset (a group behind, ahead, again), with or
#: without a hole (a filter's).
_RUNS = st.lists(st.tuples(st.sampled_from(["t", "u", "v"]),
                           st.sampled_from([("a",), ("b",), ("c",), ("a", "b"),
                                            ("a", "b", "c")]),
                           st.integers(0, 60), st.integers(1, 25), st.booleans()),
                 min_size=1, max_size=30)


@given(runs=_RUNS, budget=st.integers(0, 3_000), link_budget=st.integers(0, 6_000),
       sizes=st.integers(0, 3), named=st.booleans())
def test_a_server_takes_each_run_the_root_names_as_the_root_sent_it(
        runs: list[tuple[str, tuple[str, ...], int, int, bool]], budget: int,
        link_budget: int, sizes: int, named: bool) -> None:
    """Whatever runs a root hands a relaying server's groups, of several topics, in
    frames with their bodies or naming what the server kept (``cached``), the server
    makes of each frame the messages the root handed, bodies and all, as first
    deliveries; with any budget of bytes kept a topic, at least one whole frame, and
    with any budget for them all, past it only the topic of the last frame.  A link
    that did not ask for names (a server of an older release) is never sent one."""
    with pytest.MonkeyPatch.context() as patch:
        from mq.topics import _stretch

        patch.setattr(_stretch, "STRETCH_BYTES", budget)
        patch.setattr(_stretch, "LINK_STRETCH_BYTES", link_budget)
        _named_runs_agree(runs, min(budget, link_budget), link_budget, sizes, named)


def _named_runs_agree(runs: list[tuple[str, tuple[str, ...], int, int, bool]], budget: int,
                      link_budget: int, sizes: int, named: bool) -> None:
    from mq.topics._delivery import ClientLink
    from mq.topics._stretch import Stretches

    body = {0: lambda o: b"", 1: lambda o: b"%d" % o, 2: lambda o: bytes([o % 251]) * 97,
            3: lambda o: bytes([o % 251]) * (o % 300)}[sizes]
    root = ClientLink(None, shared_frames=True, named_runs=named)  # type: ignore[arg-type]
    wire: list[Any] = []
    root.send = wire.append  # type: ignore[method-assign]
    kept: Stretches[RelayedFrame] = Stretches()
    for topic, groups, first, count, gap in runs:
        offsets = [first + i + (5 if gap and i >= count // 2 else 0) for i in range(count)]
        records = [Record(o, 1_000 + o, o, None, "p", body(o)) for o in offsets]
        root.batch += [Run(topic, group, records, None, 0.0)  # type: ignore[arg-type]
                       for group in groups]
        root.flush()
        got: dict[str, list[Relayed]] = {group: [] for group in groups}
        for message in wire:
            obj = decode(bytes(message))
            if obj.get("cached") is True:
                assert named, obj
                frames = [frame.part(start, n) for frame, start, n in
                          kept.pieces(obj["topic"], obj["offsets"], obj["count"])]
            else:
                frame = RelayedFrame.check(obj)
                if frame.extends():
                    kept.add(obj["topic"], frame.offsets[0], frame.count, frame.size, frame)
                frames = [frame]
            for group in obj.get("groups", [obj["group"]]):
                got[group] += [m for frame in frames for m in relayed_messages(frame.obj)]
        wire.clear()
        for group in groups:
            assert [(m.offset, m.body, m.deliveries, m.sequence, m.timestamp)
                    for m in got[group]] == [(r.offset, r.body, 1, r.sequence, r.timestamp)
                                             for r in records]
        if named:
            assert kept.describe() == root.sent.describe()
        # nothing kept past a topic's budget but its last frame, and past the link's
        # budget nothing but the stretch the last frame went to
        stretches = [s for t in kept.describe() if (s := kept.get(t)) is not None]
        for stretch in stretches:
            assert not stretch.frames or stretch.size - stretch.frames[-1][2] <= budget
        assert len(stretches) <= 1 or kept.size <= link_budget
        assert kept.size == sum(stretch.size for stretch in stretches)
