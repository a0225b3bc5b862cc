"""Servers that no client and no damaged disk can break: names are data, every request is
checked before anything changes, damage is found, reported and skipped, a failure stays
with its topic, and errors of fire-and-forget requests reach the client."""

from __future__ import annotations

import os
import pathlib
import tempfile
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from brokermgr.tracking import TrackNode
from mq import (
    MAX_NAME_BYTES,
    CursorStore,
    MqServer,
    ServiceError,
    StoreError,
    TopicLog,
    check_name,
    disk_name,
    verify,
)
from mq.storage._cursor import SLOT, SLOT_GAP
from mq.storage._record import SEGMENT_HEADER
from mq.topics._meta import encode_meta
from mq.topics._verify import Finding

from .test_server import Site, site

# -- names ---------------------------------------------------------------------------------

SPECIAL = [".", "..", "a/b", "../x", "%2e%2e", "%2E", "a\x00b", "\x00", "/", "//", "~", "+",
           "é/ü", "名字", "\U0001f600", "x" * 10_000, "x" * MAX_NAME_BYTES,
           "é" * (MAX_NAME_BYTES // 2 + 1), "\ud800", " ", "groups", "meta.json", "segments"]
NAMES = st.one_of(st.sampled_from(SPECIAL), st.text(min_size=0, max_size=300),
                  st.integers(), st.none(), st.lists(st.text(max_size=3), max_size=2),
                  st.floats(allow_nan=False), st.booleans())


def test_disk_names_are_safe_and_injective() -> None:
    seen: dict[str, str] = {}
    for name in [*SPECIAL[:-4], "x" * 250 + "a", "x" * 250 + "b", "%", "%25", ".a", "a."]:
        try:
            check_name(name)
        except ValueError:
            continue
        form = disk_name(name)
        assert form not in (".", "..") and "/" not in form and "\x00" not in form
        assert len(form.encode()) + len(".cursor") + len("..tmp") <= 255
        assert seen.setdefault(form, name) == name, (form, name)
    assert disk_name("orders") == "orders"  # the layout of plain names is unchanged


def _snapshot(root: pathlib.Path, skip: pathlib.Path | None) -> dict[str, bytes | None]:
    """Every path under ``root`` (files with their bytes), less ``skip`` and what is in it."""
    out: dict[str, bytes | None] = {}
    for path in root.rglob("*"):
        if skip is not None and (path == skip or skip in path.parents):
            continue
        out[str(path.relative_to(root))] = path.read_bytes() if path.is_file() else None
    return out


def _run(body: Callable[[], Awaitable[None]]) -> None:
    trio.run(body, clock=trio.testing.MockClock(autojump_threshold=0))


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(name=NAMES, as_group=st.booleans())
def test_a_name_touches_nothing_outside_its_own_topic(name: Any, as_group: bool) -> None:
    """A name, as a topic or a group, goes through declare, publish, restart and remove:
    nothing outside the topic's own directory is created, changed or deleted, and a
    name that breaks the rule is refused with a 400 and its reason."""
    assume(not (as_group and name is None))  # no group: the topic's own, not a name
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        (root / "other-broker" / "t").mkdir(parents=True)
        (root / "other-broker" / "t" / "meta.json").write_text("{}")
        (root / "keep.txt").write_text("keep")
        server_dir = root / "s1"
        try:
            check_name(name, "group" if as_group else "topic")
            valid = True
        except ValueError:
            valid = False
        topic = "t" if as_group else name
        own = server_dir / disk_name(topic) if isinstance(topic, str) and valid else None

        async def main() -> None:
            async with site(server_dir) as s:
                before = _snapshot(root, own)
                client = s.client("c")
                try:
                    if as_group:
                        await client.declare("t", group=name)
                    else:
                        await client.declare(name)
                except ServiceError as exc:
                    assert not valid and exc.status == 400 and str(exc), exc
                    assert _snapshot(root, None) == before  # refused: nothing changed
                    return
                assert valid
                await client.publish(topic, b"kept across a restart")
                s.crash()
                s.start()
                topics = await client.query()
                assert topic in topics
                if as_group:
                    assert name in topics[topic]["groups"]
                    assert topics[topic]["groups"][name]["lag"] == 1
                await client.remove(topic)
                after = _snapshot(root, own)
                assert own is not None and not own.exists()
                # the server's own directory was there before the topic; all else is as it was
                assert after == before

        _run(main)


# -- malformed requests --------------------------------------------------------------------

BAD_NAMES = st.one_of(st.integers(), st.floats(allow_nan=False), st.booleans(),
                      st.lists(st.integers(), max_size=2),
                      st.dictionaries(st.text(max_size=2), st.integers(), max_size=1),
                      st.sampled_from(["", "\x00", "a\x01", "x" * 300, "\ud800", "y" * 10_000]))
BAD_INTS = st.one_of(st.integers(max_value=-1), st.integers(min_value=1 << 63),
                     st.text(max_size=3), st.floats(allow_nan=False), st.booleans(),
                     st.lists(st.integers(), max_size=2))
BAD_LISTS = st.one_of(st.text(max_size=3), st.integers(), st.booleans(),
                      st.lists(st.one_of(st.text(max_size=2), st.floats(), st.booleans(),
                                         st.integers(max_value=-1)), min_size=1, max_size=3))
TEMPLATES: dict[str, dict[str, Any]] = {
    "declare": {"topic": "orders", "flags": [], "group": "g2", "filter": "a.*",
                "start": "beginning"},
    "produce": {"topic": "orders", "producer": "bad", "sequence": 1, "tag": "t", "sizes": [0]},
    "consume": {"topic": "orders", "group": "orders", "window": 5},
    "unconsume": {"topic": "orders", "group": "orders"},
    "ack": {"topic": "orders", "group": "orders", "offsets": [0]},
    "query": {"topic": "orders"},
    "remove": {"topic": "orders", "group": "orders"},
    "empty": {"topic": "orders"},
    "route": {"recver": "nobody", "id": 1, "status": 200},
    "receive": {"name": "r"},
    "push": {"to": "r"},
}
#: For each field, values that break it.
BREAKS: dict[str, st.SearchStrategy[Any]] = {
    "topic": BAD_NAMES, "group": BAD_NAMES, "name": BAD_NAMES, "to": BAD_NAMES,
    "recver": st.one_of(st.integers(), st.lists(st.text(), max_size=1), st.just("r" * 300)),
    "producer": st.one_of(st.integers(), st.just("p" * 256)),
    "tag": st.one_of(st.integers(), st.just("t" * 256), st.lists(st.text(), max_size=1)),
    "filter": st.one_of(st.integers(), st.just("x" * 200), st.just("a..b")),
    "start": st.one_of(st.integers(), st.sampled_from(["sideways", "offset:x", "copy:",
                                                       "copy:ghost"])),
    "flags": st.one_of(BAD_LISTS, st.just(["persistent"])),
    "sizes": st.one_of(BAD_LISTS, st.just([1]), st.just([])),
    "sequence": BAD_INTS, "window": st.one_of(BAD_INTS, st.just(0), st.just(10_001)),
    "offsets": BAD_LISTS, "id": BAD_INTS, "status": st.one_of(BAD_INTS, st.just(99)),
}


@st.composite
def malformed(draw: st.DrawFn) -> dict[str, Any]:
    """A request that is wrong in one field (or has no known command): refused whole."""
    cmd = draw(st.sampled_from([*TEMPLATES, "bogus"]))
    if cmd == "bogus":
        return {"cmd": draw(st.one_of(st.text(max_size=8).filter(lambda c: c not in TEMPLATES),
                                      st.integers(), st.none())), "topic": "orders"}
    request = {"cmd": cmd, **TEMPLATES[cmd]}
    field = draw(st.sampled_from(sorted(request.keys() - {"cmd"})))
    required = {"query": set(), "route": {"recver", "id"}, "receive": {"name"},
                "push": {"to"}, "ack": {"topic", "offsets"}}.get(cmd, {"topic"})
    if draw(st.booleans()) and field in required:
        del request[field]  # a required field missing
    else:
        request[field] = draw(BREAKS[field])
    return request


async def _well_behaved(s: Site, bad: list[dict[str, Any]]) -> tuple[list[bytes], dict[str, Any]]:
    """A client publishes and consumes 30 messages while another sends ``bad``: what the
    good one received, and the server's state after."""
    good, rogue = s.client("good"), s.client("rogue")
    await good.declare("orders")
    sub = await good.subscribe("orders", window=7)
    got: list[bytes] = []
    refused: list[tuple[dict[str, Any], ServiceError]] = []

    async def abuse() -> None:
        await rogue.connected()
        for request in bad:
            try:
                reply = await rogue.request(request)
            except ServiceError as exc:
                refused.append((request, exc))
                continue
            raise AssertionError(f"{request} was accepted: {reply}")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(abuse)
        for i in range(30):
            await good.publish("orders", b"m%d" % i)
        while len(got) < 30:
            batch = await sub.receive_many()
            got += [m.body for m in batch]
            await sub.ack([m.offset for m in batch])
    assert all(400 <= exc.status < 500 and str(exc) for _, exc in refused), refused
    assert len(refused) == len(bad)
    await good.query()  # a round trip: the last acks are in
    state = {name: s.server.catalogue.describe(name) for name in s.server.catalogue.topics}
    return got, state


_BASELINE: list[tuple[list[bytes], dict[str, Any]]] = []


def _scenario(bad: list[dict[str, Any]]) -> tuple[list[bytes], dict[str, Any]]:
    out: list[tuple[list[bytes], dict[str, Any]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        async def main() -> None:
            async with site(pathlib.Path(tmp)) as s:
                out.append(await _well_behaved(s, bad))
        _run(main)
    return out[0]


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(bad=st.lists(malformed(), min_size=1, max_size=12))
def test_malformed_requests_change_nothing_and_break_no_one(bad: list[dict[str, Any]]) -> None:
    """Malformed requests (wrong types, missing fields, unknown commands, huge values)
    while a well-behaved client publishes and consumes: each gets a 4xx with its reason,
    the good client never fails, and the server ends as it would with the good client
    alone."""
    if not _BASELINE:
        _BASELINE.append(_scenario([]))
    got, state = _scenario(bad)
    assert got == [b"m%d" % i for i in range(30)]
    assert state == _BASELINE[0][1]


# -- damage on disk ------------------------------------------------------------------------

def _fill(log: TopicLog, n: int, size: int = 100) -> None:
    for i in range(n):
        log.append([(None, "p", i, bytes([i % 251]) * size)])
    log.sync()


def _flip(path: pathlib.Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x5A
    path.write_bytes(bytes(data))


RECORD = 36 + 1 + 100  # a record of _fill: header, producer "p", body


def _stored_topic(topic: pathlib.Path, count: int, group: str) -> None:
    """A topic named as its directory, ``count`` records of :func:`_fill` in segments of
    ten, and its ``meta.json`` naming ``group``."""
    log = TopicLog(topic, segment_bytes=SEGMENT_HEADER.size + 10 * RECORD)
    _fill(log, count)
    log.close()
    (topic / "meta.json").write_bytes(encode_meta(topic.name, [], {group: None}))


def test_a_flipped_byte_in_a_sealed_segment_is_found_at_open_and_skipped(
        tmp_path: pathlib.Path) -> None:
    log = TopicLog(tmp_path, segment_bytes=SEGMENT_HEADER.size + 10 * RECORD)
    _fill(log, 35)  # segments of 10 records: three sealed, one active
    log.close()
    sealed = tmp_path / "segments" / f"{10:020d}.seg"
    _flip(sealed, SEGMENT_HEADER.size + 4 * RECORD + 50)  # offset 14's body
    again = TopicLog(tmp_path)
    (c,) = again.corruptions
    assert (c.file, c.position, c.first, c.last) == (
        str(sealed), SEGMENT_HEADER.size + 4 * RECORD, 14, 14)
    offsets: list[int] = []
    while records := again.read(offsets[-1] + 1 if offsets else 0, max_count=3):
        offsets += [r.offset for r in records]
    assert offsets == [o for o in range(35) if o != 14]
    again.close()
    report = verify(tmp_path)
    (finding,) = [f for f in report.damaged if f.file.endswith(".seg")]
    assert finding.file == str(sealed) and finding.position == c.position
    assert "offset 14" in finding.what


def test_damage_at_the_end_of_a_sealed_segment_hides_offsets_up_to_the_next(
        tmp_path: pathlib.Path) -> None:
    log = TopicLog(tmp_path, segment_bytes=SEGMENT_HEADER.size + 10 * RECORD)
    _fill(log, 25)
    log.close()
    sealed = tmp_path / "segments" / f"{0:020d}.seg"
    _flip(sealed, SEGMENT_HEADER.size + 9 * RECORD + 2)  # the last record's length
    again = TopicLog(tmp_path)
    (c,) = again.corruptions
    assert (c.first, c.last) == (9, 9)
    assert [r.offset for r in again.read(8, max_count=3)] == [8, 10, 11]
    again.close()


def test_damage_after_the_log_opened_is_found_when_read_and_skipped(
        tmp_path: pathlib.Path) -> None:
    log = TopicLog(tmp_path, segment_bytes=SEGMENT_HEADER.size + 10 * RECORD, tail_bytes=0)
    _fill(log, 25)
    _flip(tmp_path / "segments" / f"{10:020d}.seg", SEGMENT_HEADER.size + 3 * RECORD + 40)
    offsets = [r.offset for r in log.read(0, max_count=100)]
    assert offsets == [o for o in range(25) if o != 13]
    (c,) = log.corruptions
    assert (c.first, c.last) == (13, 13)
    assert [r.offset for r in log.read(12, max_count=3)] == [12, 14, 15]  # known now
    log.close()


def test_verify_is_clean_on_a_clean_directory_and_changes_nothing(
        tmp_path: pathlib.Path) -> None:
    _stored_topic(tmp_path / "b" / "t", 25, "t")
    report = verify(tmp_path)
    # nothing at all: each sealed segment's index holds the checksum of its bytes
    assert report.findings == [] and report.topics == 1 and report.segments == 3
    assert report.records == 25
    tail = tmp_path / "b" / "t" / "segments" / f"{20:020d}.seg"
    with open(tail, "r+b") as f:  # a torn tail: a note, not damage
        f.truncate(tail.stat().st_size - 7)
    before = _snapshot(tmp_path, None)
    report = verify(tmp_path)
    assert report.damaged == [] and len(report.findings) == 1
    assert _snapshot(tmp_path, None) == before


def test_verify_notes_a_cursor_save_cut_short_and_reports_a_cursor_damaged_in_both_slots(
        tmp_path: pathlib.Path) -> None:
    topic = tmp_path / "b" / "t"
    _stored_topic(topic, 5, "g")
    cursors = CursorStore(topic)
    cursors.save("g", 3)
    cursors.save("g", 4)
    assert verify(tmp_path).findings == []
    path = cursors.path("g")
    older, = (at for at in (0, SLOT_GAP) if SLOT.unpack_from(path.read_bytes(), at)[2] == 3)
    _flip(path, older + 13)  # a save cut short: a note, the cursor is whole
    assert verify(tmp_path).findings == [Finding(
        str(path), older, "a slot that does not check out (a save a crash cut short): the "
        "other holds the cursor, offset 4", damage=False)]
    _flip(path, SLOT_GAP - older + 13)
    assert verify(tmp_path).damaged == [Finding(
        str(path), None, f"{path}: cursor checksum mismatch in both slots: group 'g' starts "
        f"again by its start rule")]


# -- one directory, one server -------------------------------------------------------------

async def test_a_second_server_on_a_directory_in_use_is_refused_and_changes_nothing(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    """Two servers appending to one topic's segments, or one recovering the tail the
    other appends to, would lose acknowledged messages: the second is refused before it
    reads a file, and the directory is free again once the first is closed."""
    async with site(tmp_path) as s:
        client = s.client("c")
        await client.declare("orders")
        await client.publish_many("orders", [b"a", b"b"])
        node = TrackNode(s.universe.add_broker("s2"), role="server")
        with pytest.raises(StoreError, match=f"^{tmp_path}: in use by another MQ server "
                                             rf"\(pid {os.getpid()}, this process\); one "
                                             "directory serves one server at a time$"):
            MqServer(node, tmp_path, fsync_thread=False)
        node.close()
        await client.publish("orders", b"c")  # the first goes on, as it was
        # an offline check of the live directory says whose it is, and finds no damage
        report = verify(tmp_path)
        assert report.damaged == [] and report.topics == 1
        assert report.findings[0] == Finding(
            str(tmp_path), None, f"in use by a running MQ server (pid {os.getpid()}): the "
            f"records it is writing may look torn; stop it for an exact check", damage=False)
        s.crash()  # closes it: the lock goes with its descriptor
        assert not [f for f in verify(tmp_path).findings if "in use" in f.what]
        s.start()
        sub = await s.client("d").subscribe("orders", window=3)
        assert [(await sub.receive()).body for _ in range(3)] == [b"a", b"b", b"c"]


# -- a failure stays with its topic; errors reach the client ----------------------------

async def test_a_failing_topic_shows_its_error_and_the_others_go_on(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    async with site(tmp_path) as s:
        client = s.client("c")
        await client.declare("broken")
        await client.declare("fine")
        await client.publish("broken", b"x")
        sub = await client.subscribe("fine", window=3)
        state = s.server.catalogue.topics["broken"]
        assert isinstance(state.topic.log, TopicLog)
        os.close(state.topic.log.segments[-1].fd)  # its file is gone from under it
        state.topic.log.tail.clear()  # reads go to the file
        broken_sub = await client.subscribe("broken", window=3)
        await client.publish("fine", b"still served")
        assert (await sub.receive()).body == b"still served"
        topics = await client.query()
        assert "dispatch failed" in topics["broken"]["error"]
        assert topics["broken"]["groups"]["broken"]["status"].startswith("error: dispatch")
        assert topics["fine"]["error"] is None
        assert topics["fine"]["groups"]["fine"]["status"] == "ok"
        await broken_sub.close()


async def test_a_group_whose_position_cannot_be_saved_says_why_and_logs_once(
        tmp_path: pathlib.Path, autojump_clock: object,
        caplog: pytest.LogCaptureFixture) -> None:
    async with site(tmp_path) as s:
        client = s.client("c")
        await client.declare("orders")
        sub = await client.subscribe("orders", window=10)
        groups = tmp_path / "orders" / "groups"
        for child in groups.iterdir():
            child.unlink()
        groups.rmdir()
        groups.write_bytes(b"not a directory")  # every save fails from now on
        for i in range(5):
            await client.publish("orders", b"%d" % i)
            message = await sub.receive()
            await message.ack()
            await trio.sleep(2)  # two ticks: two tries to save
        status = (await client.query("orders"))["orders"]["groups"]["orders"]["status"]
        assert status.startswith("error: cannot save the group's position")
        lines = [r for r in caplog.records if "cannot save the group's position" in r.message]
        assert len(lines) == 1
        groups.unlink()
        groups.mkdir()
        await trio.sleep(2)
        status = (await client.query("orders"))["orders"]["groups"]["orders"]["status"]
        assert status == "ok"


async def test_an_ack_of_what_the_consumer_does_not_hold_is_an_error_it_sees(
        tmp_path: pathlib.Path, autojump_clock: object) -> None:
    async with site(tmp_path) as s:
        client = s.client("c")
        await client.declare("orders")
        sub = await client.subscribe("orders", window=5)
        await client.publish("orders", b"a")
        message = await sub.receive()
        await sub.ack([message.offset, 99])  # 99 was never delivered
        await client.publish("orders", b"b")
        with pytest.raises(ServiceError, match=r"not held by this consumer.*99") as info:
            await sub.receive()
        assert info.value.status == 409
        assert (await sub.receive()).body == b"b"  # raised once; the subscription goes on
        errors: list[ServiceError] = []
        sub.on_error = errors.append
        await message.ack()  # acknowledged twice
        await client.query()
        assert [e.status for e in errors] == [409]
        assert (await client.query("orders"))["orders"]["groups"]["orders"]["inFlight"] == 1


def test_mq_verify_exits_0_clean_1_damaged_and_one_line_for_a_missing_directory(
        tmp_path: pathlib.Path) -> None:
    from typer.testing import CliRunner

    from rdvpump.cli import app

    topic = tmp_path / "s1" / "orders"
    _stored_topic(topic, 25, "orders")
    runner = CliRunner()
    clean = runner.invoke(app, ["mq", "verify", str(tmp_path)])
    assert clean.exit_code == 0 and "25 records checked: clean" in clean.output
    _flip(topic / "segments" / f"{0:020d}.seg", SEGMENT_HEADER.size + 2 * RECORD + 60)
    damaged = runner.invoke(app, ["mq", "verify", str(tmp_path)])
    assert damaged.exit_code == 1
    assert f"{0:020d}.seg at byte {SEGMENT_HEADER.size + 2 * RECORD}" in damaged.output
    assert "offset 2" in damaged.output and "1 damaged" in damaged.output
    missing = runner.invoke(app, ["mq", "verify", str(tmp_path / "nope")])
    assert missing.exit_code == 1 and len(missing.output.strip().splitlines()) == 1


def test_an_index_without_the_segment_checksum_is_not_trusted_and_is_written_again(
        tmp_path: pathlib.Path) -> None:
    """A version 1 index (written before indexes kept the segment's checksum) is not
    trusted: its segment is read record by record, damage in it is found, and a clean
    segment gets a version 2 index."""
    import struct

    from mq.storage._record import crc32
    from mq.storage._scan import INDEX_FOOTER, INDEX_MAGIC

    log = TopicLog(tmp_path, segment_bytes=SEGMENT_HEADER.size + 10 * RECORD)
    _fill(log, 25)
    log.close()
    old_footer = struct.Struct("<8sIQQQQI")
    for base in (0, 10):
        index = tmp_path / "segments" / f"{base:020d}.idx"
        raw = index.read_bytes()
        fields = INDEX_FOOTER.unpack_from(raw, len(raw) - INDEX_FOOTER.size)
        body = raw[:-INDEX_FOOTER.size] + old_footer.pack(INDEX_MAGIC, 1, *fields[2:6], 0)[:-4]
        index.write_bytes(body + struct.pack("<I", crc32(body)))
    _flip(tmp_path / "segments" / f"{10:020d}.seg", SEGMENT_HEADER.size + RECORD + 60)
    again = TopicLog(tmp_path)
    assert [(c.first, c.last) for c in again.corruptions] == [(11, 11)]
    again.close()
    clean = (tmp_path / "segments" / f"{0:020d}.idx").read_bytes()
    assert INDEX_FOOTER.unpack_from(clean, len(clean) - INDEX_FOOTER.size)[1] == 2
    damaged = (tmp_path / "segments" / f"{10:020d}.idx").read_bytes()
    # the damaged one keeps its old index, and is read whole at every open
    assert old_footer.unpack_from(damaged, len(damaged) - old_footer.size)[1] == 1


def test_a_damaged_segment_header_hides_no_record(tmp_path: pathlib.Path) -> None:
    log = TopicLog(tmp_path, segment_bytes=SEGMENT_HEADER.size + 10 * RECORD)
    _fill(log, 25)
    log.close()
    _flip(tmp_path / "segments" / f"{10:020d}.seg", 20)  # the created-ms field
    again = TopicLog(tmp_path)
    (c,) = again.corruptions
    assert (c.position, c.end) == (0, SEGMENT_HEADER.size) and "header" in c.reason
    assert c.offsets == "no offset"
    assert [r.offset for r in again.read(0, max_count=100)] == list(range(25))
    again.close()
