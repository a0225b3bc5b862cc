"""One service protocol under the name service, tracking and the MQ server: the same
envelope for every refusal, fields checked before any handler runs, one waiter on the
calling side, and a handler's bug answered 500 without closing the link."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from brokermgr import (
    BrokerLink,
    BrokerManager,
    Call,
    Command,
    CommandTable,
    Deferred,
    Fields,
    NameService,
    Push,
    PushTable,
    ServiceError,
    Status,
    Template,
    decode,
    encode,
    open_universe,
)
from brokermgr.tracking import TrackNode
from channels import AsyncMessageQueue, CloseCause
from mq import MqServer
from pump import ConfigError, Future

#: Each service, where a client reaches it: (broker id, port).
SERVICES = {"name-service": ("@manager", 0), "tracking": ("t1", 15555), "mq": ("s1", 15555)}


@asynccontextmanager
async def services() -> AsyncIterator[BrokerManager]:
    with trio.fail_after(60):
        async with open_universe("svc") as universe:
            names = NameService(universe)
            tracker = TrackNode(universe.add_broker("t1"), role="tracker")
            node = TrackNode(universe.add_broker("s1"), role="server", trackers=["t1:15555"])
            server = MqServer(node, None)
            try:
                yield universe
            finally:
                server.close()
                node.close()
                tracker.close()
                names.close()


async def ask(queue: AsyncMessageQueue, obj: dict[str, Any]) -> dict[str, Any]:
    await queue.send(encode(obj))
    return decode(await queue.receive())


@pytest.mark.parametrize(("service", "request_", "field"), [
    ("name-service", {"cmd": "register", "brokers": [{"id": "", "address": ["h", 1]}]},
     "brokers[0]"),
    ("name-service", {"cmd": "register", "brokers": [
        {"id": "a", "address": ["h", 1], "cluster": {"name": "c", "type": "primary",
                                                     "root": 5, "epoch": 1, "version": 0}}]},
     "brokers[0]"),
    ("name-service", {"cmd": "lookup", "id": 7}, "id"),
    ("tracking", {"cmd": "track_sub", "deltas": "yes"}, "deltas"),
    ("mq", {"cmd": "consume", "topic": "orders", "window": "many"}, "window"),
])
async def test_a_bad_field_is_400_naming_it_in_one_envelope(
        service: str, request_: dict[str, Any], field: str, autojump_clock: object) -> None:
    async with services() as universe:
        queue = await universe.add_broker("c").connect_queue(*SERVICES[service])
        reply = await ask(queue, {**request_, "seq": 5})
        assert reply["cmd"] == "error" and reply["status"] == Status.BAD_REQUEST
        assert reply["for"] == request_["cmd"] and reply["seq"] == 5
        assert reply["error"].startswith(f"{request_['cmd']}: {field} "), reply
        # the link stays: the next request is answered
        if service == "name-service":
            assert (await ask(queue, {"cmd": "list", "seq": 6}))["cmd"] == "brokers"


@pytest.mark.parametrize(("service", "table"), [
    ("name-service", "name-service"), ("tracking", "tracking"),
    ("mq", "tracking"),  # the MQ server's commands are served on its tracking port
])
async def test_every_service_refuses_an_unknown_command_the_same_way(
        service: str, table: str, autojump_clock: object) -> None:
    async with services() as universe:
        queue = await universe.add_broker("c").connect_queue(*SERVICES[service])
        reply = await ask(queue, {"cmd": "frobnicate", "seq": 1})
        assert reply == {"cmd": "error", "status": 400, "seq": 1,
                         "error": f"unknown {table} command 'frobnicate'"}


async def test_a_refused_register_changes_nothing(autojump_clock: object) -> None:
    async with services() as universe:
        queue = await universe.add_broker("c").connect_queue("@manager", 0)
        reply = await ask(queue, {"cmd": "register", "seq": 1, "brokers": [
            {"id": "good", "address": ["10.0.0.1", 7000]}, {"id": "bad", "address": "x"}]})
        assert reply["status"] == 400 and "brokers[1]" in reply["error"]
        listed = await ask(queue, {"cmd": "list", "seq": 2})
        assert listed["brokers"] == []  # the good one was not registered either


async def test_a_registration_states_its_heartbeat_and_the_list_shows_it(
        autojump_clock: object) -> None:
    """The interval a broker beats at travels with its registration (a reader tells a
    late broker by it); one that is not seconds in (0, a day] is a 400 naming it."""
    async with services() as universe:
        queue = await universe.add_broker("c").connect_queue("@manager", 0)
        for seq, bad in enumerate((0, -1, "30", 86401, True), start=1):
            reply = await ask(queue, {"cmd": "register", "seq": seq, "brokers": [
                {"id": "b", "address": ["10.0.0.1", 7000], "heartbeat": bad}]})
            assert reply["status"] == 400 and "heartbeat" in reply["error"], (bad, reply)
        assert (await ask(queue, {"cmd": "register", "seq": 9, "brokers": [
            {"id": "b", "address": ["10.0.0.1", 7000], "heartbeat": 30}]}))["cmd"] != "error"
        (listed,) = (await ask(queue, {"cmd": "list", "seq": 10}))["brokers"]
        assert listed["heartbeat"] == 30.0


async def test_call_returns_the_reply_or_raises_the_servers_error(
        autojump_clock: object) -> None:
    async with services() as universe:
        broker = universe.add_broker("c")
        link = BrokerLink(broker, "s1", 15555, name="mq s1")
        link.connect()
        reply = await link.call({"cmd": "declare", "topic": "orders"}, timeout=5)
        assert reply["cmd"] == "declared" and reply["created"] is True
        with pytest.raises(ServiceError) as info:
            await link.call({"cmd": "consume", "topic": "nope"}, timeout=5)
        assert info.value.status == Status.NOT_FOUND
        assert info.value.reason == "no topic 'nope' on s1:15555"
        assert info.value.detail == {"for": "consume", "topic": "nope"}
        # no reply at all is status 0: a service that is not there
        silent = BrokerLink(broker, "nobody", 1, name="nobody", retry=0.5)
        silent.connect()
        with pytest.raises(ServiceError, match="no reply to lookup within 2 s") as info:
            await silent.call({"cmd": "lookup", "id": "x"}, timeout=2)
        assert info.value.status == Status.NO_REPLY
        silent.close()
        for bad in (-1.0, float("nan")):  # a clear error, not a wait for ever
            with pytest.raises(ConfigError, match="timeout must be a non-negative"):
                await link.call({"cmd": "lookup", "id": "x"}, timeout=bad)
        link.close()


@asynccontextmanager
async def hung_link() -> AsyncIterator[
        tuple[trio.Nursery, BrokerLink, Future[AsyncMessageQueue]]]:
    """A link dialled to broker ``hung``, whose end of it (a future) answers only what a
    test sends on it; and a nursery for the test's calls."""
    async with open_universe("svc") as universe:
        hung = universe.add_broker("hung")
        accepted: Future[AsyncMessageQueue] = Future()

        async def accept() -> None:
            accepted.set(await hung.accept_queue(1))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(accept)
            link = BrokerLink(universe.add_broker("c"), "hung", 1, name="hung", retry=10)
            link.connect()
            yield nursery, link, accepted


async def test_a_link_that_closes_before_the_reply_is_status_0(
        autojump_clock: object) -> None:
    async with hung_link() as (nursery, link, accepted):
        outcome: Future[ServiceError] = Future()

        async def call() -> None:
            try:
                await link.call({"cmd": "anything"}, timeout=30)
            except ServiceError as exc:
                outcome.set(exc)
        nursery.start_soon(call)
        peer = await accepted.wait()
        await peer.receive()  # the request came; no reply will
        await peer.aclose()
        error = await outcome.wait()
        link.close()
    assert error.status == Status.NO_REPLY and "the link closed" in error.reason


async def test_calls_on_a_link_end_each_at_its_own_timeout_and_the_others_go_on(
        autojump_clock: object) -> None:
    """A peer that never answers: each call of one link ends with status 0 when its own
    timeout ends (the shorter first, whatever the order they were made in), and a
    call answered meanwhile returns its reply."""
    async with hung_link() as (_, link, accepted):
        await link.up.wait()
        start = trio.current_time()
        ended: dict[str, tuple[float, str]] = {}

        async def call(name: str, timeout: float) -> None:
            try:
                reply = await link.call({"cmd": name}, timeout=timeout)
                ended[name] = (trio.current_time() - start, reply["cmd"])
            except ServiceError as exc:
                assert exc.status == Status.NO_REPLY
                ended[name] = (trio.current_time() - start, exc.reason)
        async with trio.open_nursery() as calls:
            for name, timeout in (("long", 9.0), ("short", 2.0), ("middle", 5.0),
                                  ("answered", 30.0)):
                calls.start_soon(call, name, timeout)
                await trio.testing.wait_all_tasks_blocked()
            peer = await accepted.wait()
            asked = [decode(await peer.receive()) for _ in range(4)]
            await trio.sleep(3.0)  # "short" has ended by now
            answered = next(a for a in asked if a["cmd"] == "answered")
            await peer.send(encode({"cmd": "done", "seq": answered["seq"]}))
        link.close()
        await peer.aclose()
    assert ended["answered"][1] == "done" and 3.0 <= ended["answered"][0] < 3.1
    for name, timeout in (("short", 2.0), ("middle", 5.0), ("long", 9.0)):
        at, reason = ended[name]
        assert timeout <= at < timeout + 0.1, (name, at)
        assert reason == (f"hung: no reply to {name} within {timeout} s (no reply); it may "
                          f"or may not have been carried out")


async def test_a_link_in_its_back_off_dials_at_once_when_hurried(
        autojump_clock: object) -> None:
    """A link refused several times waits longer each time to dial again (up to its
    ``retry``); told its peer is back (a route table lists it), it dials now."""
    async with open_universe("svc") as universe:
        link = BrokerLink(universe.add_broker("c"), "late", 1, name="late", retry=10)
        link.connect()
        for _ in range(8):  # 0.02 s doubling: the next dial is seconds away
            await link.attempted()
        peer = universe.add_broker("late")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(peer.accept_queue, 1)
            hurried_at = trio.current_time()
            link.hurry()
            await link.up.wait()
        assert trio.current_time() - hurried_at < 0.01  # not the back-off's seconds
        link.hurry()  # up: nothing to do
        assert link.connects == 1
        link.close()


async def test_a_handler_that_fails_is_answered_500_and_logged(
        caplog: pytest.LogCaptureFixture, autojump_clock: object) -> None:
    def broken(request: object, call: object) -> dict[str, Any]:
        raise KeyError("a bug")

    table = CommandTable("demo", {"boom": Command(lambda f: f.string("x"), broken)})
    with caplog.at_level(logging.ERROR, logger="rdvpump.service"):
        reply = table.answer({"cmd": "boom", "x": "y"}, None)
    assert reply == {"cmd": "error", "status": 500, "for": "boom",
                     "error": "demo: the boom command failed"}
    assert "KeyError: 'a bug'" in caplog.text  # the traceback, for whoever fixes it
    # a refused field never reaches the handler
    assert table.answer({"cmd": "boom"}, None) == {
        "cmd": "error", "status": 400, "for": "boom", "error": "boom: x is missing"}


def test_fields_name_the_bad_field() -> None:
    f = Fields({"n": 7, "b": 1, "s": "x" * 10, "l": [1, "a"]}, "demo")
    with pytest.raises(ServiceError, match=r"^demo: n must be an integer within 0\.\.5, got 7"):
        f.integer("n", None, 0, 5)
    with pytest.raises(ServiceError, match="demo: b must be true or false, got 1"):
        f.boolean("b", False)
    with pytest.raises(ServiceError, match="demo: s is 10 bytes; at most 4"):
        f.string("s", max_bytes=4)
    with pytest.raises(ServiceError, match=r"demo: l\[1\] must be a number: "):
        f.items("l", int, what="a number")
    assert f.integer("absent", 3, 0, 5) == 3


async def test_a_future_keeps_its_first_value() -> None:
    future: Future[int] = Future()
    assert not future.done()
    with pytest.raises(RuntimeError):
        future.result()
    assert future.set(1) and not future.set(2)
    assert await future.wait() == 1 and future.result() == 1


def test_an_envelope_is_the_error_again_on_the_calling_side() -> None:
    error = ServiceError(Status.CONFLICT, "duplicate id: a", brokers=[{"id": "a"}])
    envelope = error.envelope("register")
    assert envelope == {"cmd": "error", "status": 409, "error": "duplicate id: a",
                        "for": "register", "brokers": [{"id": "a"}]}
    again = ServiceError.of({**envelope, "seq": 3})
    assert again is not None and (again.status, again.reason) == (409, "duplicate id: a")
    assert again.detail == {"for": "register", "brokers": [{"id": "a"}]}
    assert str(again) == "duplicate id: a (status 409)"
    assert ServiceError.of({"cmd": "declared"}) is None


def test_a_deferred_reply_goes_once_with_its_seq_and_a_refusal_names_what_it_held() -> None:
    sent: list[tuple[object, int | None, dict[str, Any]]] = []
    call = Call(None, 7, "produce")
    stored = {"cmd": "stored", "topic": "t", "offset": 0, "count": 1}
    reply = Deferred(call, lambda queue, seq, obj: sent.append((queue, seq, obj)), stored,
                     topic="t")
    reply.answer()
    reply.refuse(ServiceError(Status.INTERNAL, "too late"))  # an answer went: dropped
    assert sent == [(None, 7, stored)]
    refused = Deferred(call, lambda queue, seq, obj: sent.append((queue, seq, obj)),
                       topic="t", group="g")
    refused.refuse(ServiceError(Status.UNAVAILABLE, "no root", topic="other"))
    assert sent[1] == (None, 7, {"cmd": "error", "status": 503, "error": "no root",
                                 "for": "produce", "topic": "other", "group": "g"})
    with pytest.raises(ValueError, match="no reply"):
        Deferred(call, lambda *_: None).answer()


def test_a_push_table_types_each_push_and_closes_the_link_on_a_bad_or_unknown_one() -> None:
    taken: list[object] = []
    closed: list[str] = []
    table = PushTable("server s1:1", {
        "redirect": Push(lambda fields: fields.string("server"), taken.append),
        "messages": Push.raw(taken.append),
    }, refused=taken.append)
    table.take({"cmd": "redirect", "server": "s2:1"}, closed.append)
    table.take({"cmd": "messages", "count": 1}, closed.append)
    table.take({"cmd": "error", "status": 404, "error": "no topic 'a'", "topic": "a"},
               closed.append)
    assert taken[:2] == ["s2:1", {"cmd": "messages", "count": 1}] and not closed
    refusal = taken[2]
    assert isinstance(refusal, ServiceError)
    assert (refusal.status, refusal.reason, refusal.detail) == (404, "no topic 'a'",
                                                                {"topic": "a"})
    table.take({"cmd": "redirect", "server": 3}, closed.append)  # a bad field
    table.take({"cmd": "surprise"}, closed.append)  # not a push of this service
    assert closed == ["a bad redirect from server s1:1: redirect: server must be a "
                      "string, got int",
                      "server s1:1 sent 'surprise', which is no message it sends"]
    lenient = PushTable("server s1:1", {}, unknown="ignore")
    lenient.take({"cmd": "surprise"}, closed.append)
    assert len(closed) == 2 and len(taken) == 3


@pytest.mark.parametrize("service", sorted(SERVICES))
async def test_a_message_that_is_not_json_closes_its_link_as_a_protocol_error(
        service: str, autojump_clock: object) -> None:
    async with services() as universe:
        queue = await universe.add_broker("c").connect_queue(*SERVICES[service])
        await queue.send(b"\xff not json")
        with pytest.raises(trio.BrokenResourceError, match="protocol error: bad "):
            await queue.receive()
        # the cause, not only the text, on this end too: the close frame carries it
        assert queue.close_cause is CloseCause.PROTOCOL_ERROR, queue.close_reason
        assert "protocol error: bad " in (queue.close_reason or "")
        other = await universe.add_broker("d").connect_queue(*SERVICES[service])
        assert (await ask(other, {"cmd": "nope", "seq": 1}))["status"] == 400  # others go on


_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                       lambda inner: st.lists(inner, max_size=3)
                       | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=8)


_KEYS = st.text(max_size=8).filter(lambda key: key != "body")  # a binary body's place


@given(obj=st.dictionaries(_KEYS, _VALUES, max_size=6), field=_KEYS,
       values=st.lists(st.text(max_size=12), min_size=1, max_size=3),
       body=st.one_of(st.none(), st.binary(max_size=20)))
def test_a_template_encodes_as_encode_does(obj: dict[str, Any], field: str,
                                           values: list[str], body: bytes | None) -> None:
    """A message alike but for one string field, made from its template, is the same
    bytes as the message encoded whole, whatever the other fields hold (the field's own
    name, quotes, nested objects with that key)."""
    template = Template(obj, field)
    for value in values:
        made, whole = template.encode(value, body), encode({**obj, field: value}, body)
        assert bytes(made) == bytes(whole)
        assert decode(bytes(made))[field] == value



def test_a_template_of_an_object_that_holds_its_mark_still_encodes_as_encode_does() -> None:
    """A field's place in a template is marked by a text that a nested object of the
    same field may hold itself: then another mark is drawn, and the messages are the
    same."""
    from brokermgr._rpc import _TOKEN

    for obj in ({"n": {"group": _TOKEN}}, {"a": [{"group": _TOKEN}], "b": _TOKEN}):
        template = Template(obj, "group")
        for value in ("g1", _TOKEN, ""):
            assert bytes(template.encode(value)) == bytes(encode({**obj, "group": value}))

_NUMBERS = st.floats(allow_nan=True, allow_infinity=True)


@given(obj=st.dictionaries(_KEYS, _VALUES | _NUMBERS, max_size=6),
       space=st.sampled_from(["", " ", "\n\t", "\r "]),
       noise=st.binary(max_size=12).filter(lambda b: b"\x00" not in b))  # (a body's mark)
def test_messages_encode_and_decode_as_the_json_module_does(
        obj: dict[str, Any], space: str, noise: bytes) -> None:
    """The services' encoding is ``json``'s, compact with sorted keys, byte for byte;
    decoding takes what ``json.loads`` takes of UTF-8 (whitespace around the object
    too) and refuses what it refuses, and so does a head with anything after it."""
    import json

    from channels import ProtocolError

    assert encode(obj) == json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()
    text = f"{space}{json.dumps(obj)}{space}".encode()
    assert json.dumps(decode(text), sort_keys=True) == json.dumps(obj, sort_keys=True)
    for message in (text + noise, noise, noise + text):
        try:
            expected: Any = json.loads(message.decode("utf-8", "surrogatepass"))
        except ValueError:
            expected = None
        if not isinstance(expected, dict):
            with pytest.raises(ProtocolError):
                decode(message)
        else:
            assert json.dumps(decode(message), sort_keys=True) == json.dumps(
                expected, sort_keys=True)
