"""Consume-group semantics, sans-I/O on a manual clock: groups, filters, start positions,
credits, acks, redelivery on consumer loss and on ack timeout, dead letters, restarts; a
lone consumer's run of deliveries against the one-by-one hand-out."""

from __future__ import annotations

import pathlib

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from mq import CursorStore, TopicLog
from mq.storage._memory import MemoryLog
from mq.storage._record import Record
from mq.topics._group import Delivery, Member, Start, UnknownGroupError
from mq.topics._topic import Topic


class World:
    def __init__(self, log: object | None = None, **options: object) -> None:
        self.now = 0.0
        self.dead: list[tuple[str, int, int]] = []
        self.topic = Topic("orders", log or MemoryLog(clock=lambda: 1000.0),  # type: ignore[arg-type]
                           clock=lambda: self.now,
                           dead=lambda t, g, r, n: self.dead.append((g, r.offset, n)),
                           **options)  # type: ignore[arg-type]

    def publish(self, *tags: str | None) -> None:
        self.topic.publish([(tag, "p", i, f"m{i}".encode()) for i, tag in enumerate(tags)])
        self.topic.dispatch()

    def consumer(self, name: str, group: str = "orders", window: int = 10) -> Inbox:
        inbox = Inbox(name, group, window)
        self.topic.attach(inbox.consumer)
        self.topic.dispatch()
        return inbox


class Inbox:
    def __init__(self, name: str, group: str, window: int) -> None:
        self.got: list[Delivery] = []
        self.consumer = Member(name, group, self.got.append, window=window)

    @property
    def offsets(self) -> list[int]:
        return [d.record.offset for d in self.got]


def test_every_group_gets_every_message_and_a_group_shares_its_messages() -> None:
    w = World()
    w.topic.declare_group("orders")  # the default group: the topic's name
    w.topic.declare_group("audit")
    a, b = w.consumer("a"), w.consumer("b")
    audit = w.consumer("x", "audit")
    w.publish(*[None] * 6)
    assert sorted(a.offsets + b.offsets) == list(range(6)) and a.offsets and b.offsets
    assert audit.offsets == list(range(6))


def test_credits_bound_what_a_consumer_holds_and_acks_free_them() -> None:
    w = World()
    w.topic.declare_group("orders")
    c = w.consumer("c", window=3)
    w.publish(*[None] * 10)
    assert c.offsets == [0, 1, 2]  # pushed while credits last, no request per message
    assert w.topic.ack("orders", [0, 2]) == (2, [])  # acks by offset, batched, any order
    w.topic.dispatch()
    assert c.offsets == [0, 1, 2, 3, 4]
    assert w.topic.ack("orders", [0, 99]) == (0, [0, 99])  # repeated or unknown: named
    assert w.topic.group("orders").floor == 1  # 1 is still out
    assert w.topic.lag("orders") == 9


def test_a_group_waits_for_credits_only_while_it_has_messages_not_handed_out() -> None:
    """What an ack's dispatch is for: a group whose consumers hold all it has waits for
    nothing; one with stored messages past its window, or messages to deliver again,
    does (a group with no consumer waits for none)."""
    w = World(ack_timeout=5.0)
    w.topic.declare_group("orders")
    assert not w.topic.waiting("orders")
    w.publish(None, None)
    assert not w.topic.waiting("orders")  # no consumer
    c = w.consumer("c", window=3)
    assert c.offsets == [0, 1] and not w.topic.waiting("orders")
    w.publish(None, None)
    assert c.offsets == [0, 1, 2] and w.topic.waiting("orders")  # 3 waits for credits
    w.topic.ack("orders", [0, 1, 2], c.consumer)
    w.topic.dispatch()
    assert c.offsets == [0, 1, 2, 3] and not w.topic.waiting("orders")
    w.now += 6.0
    w.topic.expire()
    assert w.topic.waiting("orders")  # 3 is to be delivered again


def test_a_lone_consumer_behind_is_handed_runs_of_its_min_room() -> None:
    """A consumer with ``min_room`` (a relaying server at the root) that holds its whole
    window gets nothing for an ack that frees less than that, then a run of what the
    freed credits allow; one whose backlog is smaller than that gets all of it."""
    w = World()
    w.topic.declare_group("orders")
    c = w.consumer("c", window=8)
    c.consumer.min_room = 4
    w.publish(*[None] * 20)
    assert c.offsets == list(range(8))
    w.topic.ack("orders", [0, 1, 2], c.consumer)
    w.topic.dispatch()
    assert c.offsets == list(range(8))  # 3 free, 12 waiting: not yet
    w.topic.ack("orders", [3], c.consumer)
    w.topic.dispatch()
    assert c.offsets == list(range(12))  # 4 free: a run of 4
    w.topic.ack("orders", list(range(4, 12)), c.consumer)
    w.topic.dispatch()
    assert c.offsets == list(range(20))  # the 8 left, all at once
    w.topic.ack("orders", list(range(12, 19)), c.consumer)
    w.publish(None, None)
    assert c.offsets == list(range(22))  # 2 waiting, 7 free: both, less than min_room


def test_consumers_of_a_group_are_handed_runs_in_turn() -> None:
    """Consumers that outnumber a batch's messages: one is handed the batch whole (a run
    up to an eighth of its window), the next batch goes to the next in turn; a batch
    larger than the even shares is split into them; below a window of 16 the runs are
    of one message, as even as before."""
    w = World()
    w.topic.declare_group("orders")
    a, b, c = (w.consumer(name, window=100) for name in "abc")  # runs of 12
    for _ in range(4):
        w.publish(*[None] * 10)
    assert (a.offsets, b.offsets, c.offsets) == (
        [*range(0, 10), *range(30, 40)], list(range(10, 20)), list(range(20, 30)))
    w.publish(*[None] * 90)  # 30 each (more than a run), from b: a had the last
    assert (b.offsets[10:], c.offsets[10:], a.offsets[20:]) == (
        list(range(40, 70)), list(range(70, 100)), list(range(100, 130)))

    w = World()
    w.topic.declare_group("orders")
    small = [w.consumer(name, window=8) for name in "xyz"]  # runs of one
    w.publish(*[None] * 6)
    assert [x.offsets for x in small] == [[0, 1], [2, 3], [4, 5]]  # even shares


def test_a_run_ends_where_a_consumer_s_credits_do_and_counts_what_its_filter_passes(
        ) -> None:
    w = World()
    w.topic.declare_group("orders")
    a, b = w.consumer("a", window=3), w.consumer("b", window=100)
    w.publish(*[None] * 20)  # shares of 10: a takes 3, b 10, then b the rest
    assert (a.offsets, b.offsets) == ([0, 1, 2], list(range(3, 20)))

    w = World()
    w.topic.declare_group("orders", filter="eu.*")
    x, y = w.consumer("x", window=100), w.consumer("y", window=100)
    w.publish(*["eu.fr", "us", "eu.de", None, "eu.it"] * 2)
    assert (x.offsets, y.offsets) == ([0, 2, 4, 5, 7, 9], [])  # one run of 12
    w.publish(*["eu.fr"] * 3)
    assert (x.offsets[6:], y.offsets) == ([], [10, 11, 12])  # the next in turn


def test_filters_select_and_untagged_messages_go_only_to_groups_without_one() -> None:
    w = World()
    w.topic.declare_group("orders")
    w.topic.declare_group("eu", filter="eu.#")
    w.topic.declare_group("paid", filter="*.paid;us.refund")
    everything, eu, paid = w.consumer("a"), w.consumer("b", "eu"), w.consumer("c", "paid")
    w.publish("eu.paid", None, "us.refund", "eu", "us.paid.late")
    assert everything.offsets == [0, 1, 2, 3, 4]
    assert eu.offsets == [0, 3]
    assert paid.offsets == [0, 2]
    # what a filter skips counts as handled for that group
    w.topic.ack("eu", [0, 3])
    assert w.topic.group("eu").floor == 5


@pytest.mark.parametrize("start, first", [
    ("end", 4), (None, 4), ("beginning", 0), ("offset:2", 2), ("copy:slow", 1)])
def test_where_a_new_group_starts(start: str | None, first: int) -> None:
    w = World()
    w.topic.declare_group("orders")
    w.topic.declare_group("slow")
    slow = w.consumer("s", "slow", window=1)
    c = w.consumer("c")
    w.publish(*[None] * 4)
    assert c.offsets == [0, 1, 2, 3] and slow.offsets == [0]
    w.topic.ack("slow", [0])
    w.topic.dispatch()  # slow now holds 1
    w.topic.declare_group("new", start=start)
    new = w.consumer("n", "new")
    w.publish(None)
    assert new.offsets[0] == first
    assert new.offsets == list(range(first, 5))


def test_a_group_can_start_at_a_time(tmp_path: pathlib.Path) -> None:
    clock = [1_790_000_000.0]
    log = TopicLog(tmp_path, clock=lambda: clock[0])
    w = World(log)
    for i in range(10):
        clock[0] += 60
        log.append([(None, "p", i, b"x")])
    at = int((1_790_000_000.0 + 60 * 7) * 1000)
    w.topic.declare_group("since", start=Start.parse(f"time:{at}"))
    assert w.consumer("c", "since").offsets == [6, 7, 8, 9]
    log.close()


def test_bad_start_and_unknown_group_are_clear_errors() -> None:
    w = World()
    with pytest.raises(ValueError, match="expected end, beginning, offset:N"):
        Start.parse("yesterday")
    with pytest.raises(UnknownGroupError, match="no consume group 'nope'"):
        w.topic.ack("nope", [1])
    with pytest.raises(UnknownGroupError, match="no consume group 'missing'"):
        w.topic.declare_group("x", start="copy:missing")


def test_a_consumer_lost_gives_its_messages_to_another_with_their_count() -> None:
    w = World()
    w.topic.declare_group("orders")
    a = w.consumer("a", window=2)
    w.publish(*[None] * 3)
    assert a.offsets == [0, 1]
    b = w.consumer("b", window=5)
    assert b.offsets == [2]
    assert w.topic.detach(a.consumer) == 2
    w.topic.dispatch()
    assert [(d.record.offset, d.deliveries) for d in b.got] == [(2, 1), (0, 2), (1, 2)]


def test_messages_given_back_here_and_handled_by_another_copy_are_not_delivered_again(
) -> None:
    """A copy's consumer leaves with messages it took (they wait to be delivered again
    here); another copy (a master, or the root a former root sent them to) handled them:
    told so, this copy's floor moves past them, though it read further already, and a
    consumer that comes here later gets only what is left."""
    w = World()
    w.topic.declare_group("orders")
    a = w.consumer("a", window=10)
    w.publish(*[None] * 6)
    assert a.offsets == list(range(6))
    assert w.topic.detach(a.consumer) == 6  # given back: their floor is 0
    assert w.topic.group("orders").floor == 0
    w.topic.moved.clear()
    w.topic.advance("orders", 4)  # handled elsewhere up to 4
    assert w.topic.group("orders").floor == 4 and w.topic.lag("orders") == 2
    assert w.topic.moved == {"orders": None}  # saved and shipped at the next tick
    b = w.consumer("b", window=10)
    assert b.offsets == [4, 5]


def test_an_ack_timeout_redelivers_and_dead_letters_after_max_deliveries() -> None:
    w = World(ack_timeout=10.0, max_deliveries=3)
    w.topic.declare_group("orders")
    c = w.consumer("c")
    w.publish(None, None)
    w.topic.ack("orders", [1])
    for _ in range(3):
        w.now += 10
        assert w.topic.expire() == 1
        w.topic.dispatch()
    assert [(d.record.offset, d.deliveries) for d in c.got] == [
        (0, 1), (1, 1), (0, 2), (0, 3)]
    assert w.dead == [("orders", 0, 3)]  # after 3 deliveries: dead letter, handled
    assert w.topic.group("orders").floor == 2 and not c.consumer.in_flight


def test_a_late_ack_from_a_consumer_that_no_longer_holds_it_is_ignored() -> None:
    w = World(ack_timeout=5.0)
    w.topic.declare_group("orders")
    a, b = w.consumer("a", window=1), w.consumer("b", window=1)
    w.publish(None)
    assert a.offsets == [0]
    w.now += 5
    w.topic.expire()
    w.topic.dispatch()
    assert b.offsets == [0]
    assert w.topic.ack("orders", [0], a.consumer) == (0, [0])  # a's ack comes too late
    assert w.topic.ack("orders", [0], b.consumer) == (1, [])


def test_a_restart_starts_every_group_at_its_saved_floor(tmp_path: pathlib.Path) -> None:
    log = TopicLog(tmp_path)
    cursors = CursorStore(tmp_path)
    w = World(log)
    w.topic.declare_group("orders")
    c = w.consumer("c")
    w.publish(*[None] * 5)
    w.topic.ack("orders", [0, 1, 3])
    for group, floor in w.topic.floors_to_save().items():
        cursors.save(group, floor)
    assert cursors.load(["orders"]) == {"orders": 2}
    log.close()
    # the server restarts: 2 and 4 were delivered, not acknowledged: delivered again
    log = TopicLog(tmp_path)
    again = World(log, saved=cursors.load(["orders"]))
    again.topic.declare_group("orders", start="end")
    c = again.consumer("c")
    assert c.offsets == [2, 3, 4]  # at least once: 3 again too, it sat above the floor
    log.close()


def test_empty_skips_every_group_to_the_end_and_depth_follows() -> None:
    w = World()
    w.topic.declare_group("orders")
    w.topic.declare_group("audit")
    w.consumer("c", window=1)
    w.publish(*[None] * 5)
    assert w.topic.depth == 5 and w.topic.lag("orders") == 5
    w.topic.empty()
    assert w.topic.depth == 0


def test_a_memory_topic_keeps_a_bounded_ring() -> None:
    log = MemoryLog(max_count=3, clock=lambda: 1.0)
    log.append([(None, "p", i, b"x") for i in range(5)])
    assert log.start_offset == 2 and log.dropped == 2
    assert [r.offset for r in log.read(0)] == [2, 3, 4]
    assert isinstance(log.read(4)[0], Record)


_STEPS = st.lists(st.one_of(
    st.tuples(st.just("publish"), st.integers(1, 40)),
    st.tuples(st.just("dispatch"), st.integers(0, 10)),  # this many stored stay unseen
    st.tuples(st.just("ack"), st.integers(0, 2**16)),  # a bit mask over what is out
    # the oldest this many out, by the consumer, as a range where they follow each other
    st.tuples(st.just("ack first"), st.integers(1, 14)),
    # as many from a place among those out (the middle of a run, say): lo + 16 * count
    st.tuples(st.just("ack span"), st.integers(0, 16 * 9)),
    st.tuples(st.just("expire"), st.just(0))), max_size=25)


@given(window=st.integers(1, 12), steps=_STEPS)
def test_a_lone_consumer_gets_what_the_one_by_one_hand_out_gives(
        window: int, steps: list[tuple[str, int]]) -> None:
    """A group of one consumer and no filter is handed its messages in one run (the
    relaying servers of a cluster, a lone consumer), kept in flight whole until part of
    it is acknowledged or it expires; a filter that passes every message takes the
    one-by-one path.  Both give the same deliveries, in flight, positions, credits and
    redeliveries, step by step, whatever the acks (parts of runs, whole runs, several
    runs in one range), and the run reaches the consumer's ``deliver_many``."""
    worlds, inboxes, runs = [], [], []
    for filter_ in (None, "#"):
        w = World(ack_timeout=5.0)
        w.topic.declare_group("orders", filter=filter_)
        got: list[Delivery] = []
        calls: list[int] = []

        def many(run: list[Delivery], got: list[Delivery] = got, calls: list[int] = calls
                 ) -> None:
            calls.append(len(run))
            got.extend(run)

        w.topic.attach(Member("c", "orders", got.append, window=window, deliver_many=many))
        worlds.append(w)
        inboxes.append(got)
        runs.append(calls)
    for op, arg in steps:
        for w in worlds:
            topic = w.topic
            if op == "publish":
                topic.publish([("t", "p", i, b"m") for i in range(arg)])
            elif op == "dispatch":
                topic.dispatch(max(0, topic.log.next_offset - arg))
            elif op == "ack":
                out = sorted(topic.group("orders").in_flight)
                topic.ack("orders", [o for i, o in enumerate(out) if arg >> (i % 17) & 1])
            elif op in ("ack first", "ack span"):
                out = sorted(topic.group("orders").in_flight)
                taken = out[:arg] if op == "ack first" else out[arg % 16:][:arg // 16 + 1]
                consumer = topic.group("orders").consumers[0]
                ranged = bool(taken) and taken[-1] - taken[0] + 1 == len(taken)
                assert topic.ack("orders", range(taken[0], taken[-1] + 1) if ranged
                                 else taken, consumer) == (len(taken), [])
            else:
                w.now += 6.0
                topic.expire()
                topic.dispatch()
        fast, slow = (w.topic.group("orders") for w in worlds)
        assert [(d.record.offset, d.deliveries) for d in inboxes[0]] == [
            (d.record.offset, d.deliveries) for d in inboxes[1]]
        assert sorted(fast.in_flight) == sorted(slow.in_flight)
        assert fast.in_flight_count == slow.in_flight_count == len(slow.in_flight)
        assert [c.credits for c in fast.consumers] == [c.credits for c in slow.consumers]
        assert (fast.next_read, fast.floor) == (slow.next_read, slow.floor)
        assert [(r.offset, n) for r, n in fast.redeliver] == [
            (r.offset, n) for r, n in slow.redeliver]
    assert runs[1] == []  # the filtered group went one by one
    first = [d for d in inboxes[0] if d.deliveries == 1]
    assert sum(runs[0]) == len(first)  # every first delivery came in a run


def test_a_run_in_flight_costs_its_group_one_entry_however_long() -> None:
    """A lone consumer's run is held whole in flight: a hundred groups with a thousand
    messages out each hold under a megabyte for it (one entry a delivery held 125 bytes
    an offset a group, 12.5 MB here), and an ack of whole runs takes them in one step."""
    import tracemalloc

    topic = Topic("orders", MemoryLog(clock=lambda: 1000.0), clock=lambda: 0.0)
    members = []
    for g in range(100):
        topic.declare_group(f"g{g}")
        members.append(Member("c", f"g{g}", lambda d: None, window=1000,
                              deliver_run=lambda run: None))
        topic.attach(members[-1])
    topic.publish([(None, "p", i, b"x") for i in range(1000)])
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        assert topic.dispatch() == 100 * 1000
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held < 1_000_000, held
    assert [m.credits for m in members] == [0] * 100
    assert topic.ack("g0", range(0, 1000), members[0]) == (1000, [])
    assert members[0].credits == 1000 and topic.group("g0").floor == 1000
    # part of a run: the rest stays in flight, one by one
    assert topic.ack("g1", [5, 7], members[1]) == (2, [])
    assert topic.group("g1").in_flight_count == 998 and topic.group("g1").floor == 0
    assert sorted(members[1].in_flight) == [o for o in range(1000) if o not in (5, 7)]


@given(acks=st.lists(st.tuples(st.booleans(), st.one_of(
    st.lists(st.integers(0, 30), max_size=12),
    st.builds(range, st.integers(0, 30), st.integers(0, 40)))),  # an ack of first and count
                     max_size=8), alone=st.booleans())
def test_acks_take_exactly_what_the_acking_consumer_holds(
        acks: list[tuple[bool, list[int] | range]], alone: bool) -> None:
    """Acks naming offsets held by the acking consumer, by the other one, by no one,
    twice in one ack or again later, listed or as a range: exactly the acker's own are
    taken, each once; the rest are named as missed, in the order given.  ``alone``: one
    consumer, which holds runs of offsets (a range of them is often all its own)."""
    w = World()
    w.topic.declare_group("orders")
    a = w.consumer("a", window=24 if alone else 12)
    b = a if alone else w.consumer("b", window=12)
    w.publish(*[None] * 24)
    for by_a, offsets in acks:
        acker = (a if by_a else b).consumer
        held = dict(w.topic.group("orders").in_flight)
        taken: set[int] = set()
        missed = []
        for offset in offsets:
            pending = held.get(offset)
            if pending is None or pending.consumer is not acker or offset in taken:
                missed.append(offset)
            else:
                taken.add(offset)
        assert w.topic.ack("orders", offsets, acker) == (len(taken), missed)
        assert set(w.topic.group("orders").in_flight) == set(held) - taken
        assert acker.in_flight == {o for o, d in held.items() if d.consumer is acker} - taken


def test_memory_keeps_what_a_group_with_consumers_has_not_read_yet(
        tmp_path: pathlib.Path) -> None:
    """A topic's newest messages stay in memory only until every group with consumers
    has read them: a topic whose consumers keep up holds none (many such topics held
    their whole budget each), one whose consumer is behind holds what it has not read;
    a redelivery is of the records its delivery holds."""
    log = TopicLog(tmp_path)
    w = World(log, ack_timeout=5.0)
    w.topic.declare_group("orders", start="beginning")
    w.topic.declare_group("audit", start="beginning")
    fast = w.consumer("fast", window=100)
    slow = w.consumer("slow", group="audit", window=2)
    w.publish(*[None] * 6)
    assert fast.offsets == [0, 1, 2, 3, 4, 5] and slow.offsets == [0, 1]
    assert [r.offset for r in log.tail.held()] == [2, 3, 4, 5]  # what audit has not read
    w.topic.ack("audit", [0, 1])
    w.topic.dispatch()
    assert slow.offsets == [0, 1, 2, 3]
    assert [r.offset for r in log.tail.held()] == [4, 5]
    w.topic.ack("audit", [2, 3])
    w.topic.dispatch()
    assert slow.offsets == [0, 1, 2, 3, 4, 5] and log.tail.held() == []
    w.now = 10.0  # fast's six expire: delivered again
    w.topic.expire()
    w.topic.dispatch()
    assert fast.offsets == [0, 1, 2, 3, 4, 5] * 2
    assert [d.record.body for d in fast.got[6:]] == [f"m{i}".encode() for i in range(6)]
    log.close()


def test_what_no_consumer_reads_now_is_not_kept_in_memory_and_is_read_from_the_file(
        tmp_path: pathlib.Path) -> None:
    """A topic keeps its newest messages in memory only while a consumer is attached (a
    group's position alone is not one); the one that comes later reads the file, and
    gets everything."""
    log = TopicLog(tmp_path)
    w = World(log)
    w.topic.declare_group("orders", start="beginning")
    w.publish(None, None, None)
    assert log.tail.held() == []
    inbox = w.consumer("c")
    assert inbox.offsets == [0, 1, 2]
    w.publish(None, None)
    assert inbox.offsets == [0, 1, 2, 3, 4]
    assert log.tail.held() == []  # kept for the consumer until it read them: see below
    w.topic.detach(inbox.consumer)
    w.publish(None)
    assert log.tail.held() == [] and w.topic.attached == 0
    assert w.consumer("d").offsets == [0, 1, 2, 3, 4, 5]  # c's again, and 5 from the file
    log.close()


_MOVES = st.lists(st.one_of(
    st.tuples(st.just("publish"), st.integers(1, 6)),
    st.tuples(st.just("ack"), st.integers(0, 2**8)),  # a bit mask over what is out
    st.tuples(st.just("expire"), st.just(0)),  # redelivered, or dead letters at 2
    st.tuples(st.just("detach"), st.integers(0, 2)),
    st.tuples(st.just("filter"), st.sampled_from(["eu.*", "us.*", "#"])),
    st.tuples(st.just("advance"), st.integers(0, 40)),
    st.tuples(st.just("group"), st.just(0)),
    st.tuples(st.just("empty"), st.just(0))), max_size=30)


@given(moves=_MOVES, ring=st.sampled_from([None, 8]))
# a group away while the ring drops what it had not read: back, it skips them
@example(moves=[("detach", 0), ("detach", 1), ("publish", 6), ("publish", 6),
                ("detach", 0)], ring=8)
def test_every_change_of_a_group_s_floor_or_filter_names_its_topic_as_moved(
        moves: list[tuple[str, int | str]], ring: int | None) -> None:
    """What a master ships to its replicas every 0.1 s is the positions of the topics
    named in ``moved``: whatever changes a group's floor or filter (acks, dead letters,
    messages a filter skips, a new filter or group, empty, advance, a bounded ring that
    drops what a group had not read) names the topic there, step by step."""
    w = World(MemoryLog(max_count=ring, clock=lambda: 1.0) if ring else None,
              ack_timeout=5.0, max_deliveries=2)
    w.topic.declare_group("orders")
    w.topic.declare_group("eu", filter="eu.*")
    inboxes = [w.consumer("a", window=3), w.consumer("b", window=2),
               w.consumer("e", group="eu", window=2)]
    away: list[Inbox] = []

    def positions() -> dict[str, tuple[int, object]]:
        return {g.name: (g.floor, g.filter) for g in w.topic.groups.values()}

    seen = positions()
    w.topic.moved.clear()
    for op, arg in moves:
        topic = w.topic
        if op == "publish":
            assert isinstance(arg, int)
            w.publish(*[("eu.x", "us.x", None)[i % 3] for i in range(arg)])
        elif op == "ack":  # by each consumer (its own), or unnamed (the group's)
            assert isinstance(arg, int)
            for inbox in inboxes:
                out = sorted(inbox.consumer.in_flight)
                topic.ack(inbox.consumer.group, [o for i, o in enumerate(out) if arg >> i & 1],
                          inbox.consumer if arg & 1 else None)
        elif op == "expire":
            w.now += 6.0
            topic.expire()
        elif op == "detach":  # or attach again, if it is away
            assert isinstance(arg, int)
            inbox = inboxes[arg]
            if inbox in away:
                away.remove(inbox)
                topic.attach(inbox.consumer)
            else:
                away.append(inbox)
                topic.detach(inbox.consumer)
        elif op == "filter":
            topic.declare_group("eu", filter=str(arg))
        elif op == "advance":
            assert isinstance(arg, int)
            topic.advance(list(topic.groups)[arg % len(topic.groups)], arg)
        elif op == "group":
            topic.declare_group(f"g{len(topic.groups)}", start="beginning")
        else:
            topic.empty()
        topic.dispatch()
        now = positions()
        if now != seen:
            assert topic.moved == {"orders": None}, (op, seen, now)
        seen = now
        topic.moved.clear()
