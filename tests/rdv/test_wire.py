"""The handshake codec, sans-I/O: round trips, any split of the bytes, and garbage."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rdv import MAX_HANDSHAKE_SIZE, Address, BrokerPort, HandshakeError, Hello, Reply, parse_located
from rdv._wire import FrameReader, parse_hello, parse_reply

HELLO = Hello("universe", "token", "client", "server", 80)


def feed_all(data: bytes, cuts: list[int]) -> tuple[dict[str, object] | None, bytes]:
    reader = FrameReader()
    pos = 0
    for cut in cuts:
        obj = reader.feed(data[pos:pos + cut])
        pos += cut
        if obj is not None:
            return obj, reader.rest + data[pos:]
    obj = reader.feed(data[pos:])
    return obj, reader.rest


@given(cuts=st.lists(st.integers(1, 20), max_size=30), tail=st.binary(max_size=50))
def test_hello_survives_any_split_and_keeps_what_follows(cuts: list[int], tail: bytes) -> None:
    obj, rest = feed_all(HELLO.encode() + tail, cuts)
    assert obj is not None
    assert parse_hello(obj) == HELLO
    assert rest == tail  # the link's first bytes may ride in the same segment


def test_replies_round_trip() -> None:
    for reply in (Reply(True, link=7), Reply(False, reason="busy")):
        obj, _ = feed_all(reply.encode(), [])
        assert obj is not None and parse_reply(obj) == reply


def test_credentials_are_checked_on_universe_and_token() -> None:
    assert HELLO.authorized("universe", "token")
    assert not HELLO.authorized("universe", "tokeN")
    assert not HELLO.authorized("other", "token")
    assert not Hello("universe", "", "a", "b", 1).authorized("universe", "token")


@pytest.mark.parametrize(("data", "message"), [
    ((MAX_HANDSHAKE_SIZE + 1).to_bytes(4, "big"), "exceeds"),
    (b"\x00\x00\x00\x03abc", "not JSON"),
    (b"\x00\x00\x00\x02[]", "not a JSON object"),
    (b"\x00\x00\x00\x02\xff\xfe", "not JSON"),
])
def test_garbage_frames_are_handshake_errors(data: bytes, message: str) -> None:
    with pytest.raises(HandshakeError, match=message):
        FrameReader().feed(data)


@pytest.mark.parametrize(("obj", "message"), [
    ({"rdvpump": 1, "universe": "u", "token": "t", "src": "a", "dst": "b", "port": 1},
     "unsupported protocol version 1"),
    # version 2's name service spoke another request protocol: refused, not misread
    ({"rdvpump": 2, "universe": "u", "token": "t", "src": "a", "dst": "b", "port": 1},
     r"unsupported protocol version 2 \(this side speaks 3\)"),
    ({"rdvpump": 3, "universe": 5, "token": "t", "src": "a", "dst": "b", "port": 1},
     "'universe' must be a string"),
    ({"rdvpump": 3, "universe": "u", "token": "t", "src": "a", "dst": "b", "port": 70000},
     "port must be an int"),
    ({"rdvpump": 3, "universe": "u", "token": "t", "src": "a", "dst": "b", "port": True},
     "port must be an int"),
])
def test_malformed_hellos_are_refused_with_the_field(obj: dict[str, object],
                                                     message: str) -> None:
    with pytest.raises(HandshakeError, match=message):
        parse_hello(obj)


def test_malformed_replies() -> None:
    objs: tuple[dict[str, object], ...] = (
        {"accepted": True}, {"accepted": False}, {"accepted": "yes"})
    for obj in objs:
        with pytest.raises(HandshakeError):
            parse_reply(obj)


def test_oversized_hello_is_refused_before_sending() -> None:
    with pytest.raises(ValueError, match="exceeds"):
        Hello("u", "t" * MAX_HANDSHAKE_SIZE, "a", "b", 1).encode()


@pytest.mark.parametrize(("text", "parsed"), [
    ("s1:15555", ("s1", 15555)), ("a:b:0", ("a:b", 0)), ("x:65535", ("x", 65535)),
])
def test_a_broker_port_parses_one_way(text: str, parsed: tuple[str, int]) -> None:
    assert BrokerPort.parse(text) == parsed and str(BrokerPort.parse(text)) == text


@pytest.mark.parametrize("text", ["s1", ":1", "s1:", "s1:65536", "s1:-1", "s1:4294967295", 7])
def test_a_broker_port_outside_the_rule_is_refused(text: object) -> None:
    with pytest.raises(ValueError, match="'broker:port'"):
        BrokerPort.parse(text)


def test_located_addresses_name_a_broker_or_not() -> None:
    assert parse_located("t1@127.0.0.1:9878") == ("t1", Address("127.0.0.1", 9878))
    assert parse_located("127.0.0.1:9878") == (None, Address("127.0.0.1", 9878))
    with pytest.raises(ValueError, match="empty broker id before '@'"):
        parse_located("@127.0.0.1:1")
    with pytest.raises(ValueError, match="port within 0..65535"):
        parse_located("t1@127.0.0.1:70000")
