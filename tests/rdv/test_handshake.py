"""The handshake as a sans-I/O state machine: bytes in, events out, misuse and bad bytes apart."""

from __future__ import annotations

import pytest

from channels import ProtocolError
from rdv import (
    NEED_DATA,
    Handshake,
    HandshakeError,
    HandshakeState,
    Hello,
    RdvUsageError,
    Refusal,
    RefusalReason,
    Reply,
    Role,
)

HELLO = Hello("u", "token", "client", "server", 80)


def pipe(data: bytes, into: Handshake, piece: int) -> Hello | Reply:
    """Feed ``data`` in pieces of ``piece`` bytes; return the event once it is whole."""
    for i in range(0, len(data), piece):
        event = into.next_event()
        assert event is NEED_DATA
        into.receive_data(data[i:i + piece])
    event = into.next_event()
    assert isinstance(event, (Hello, Reply))
    return event


@pytest.mark.parametrize("piece", [1, 3, 4096])
@pytest.mark.parametrize("accept", [True, False])
def test_a_handshake_in_any_split_ends_linked_or_refused(piece: int, accept: bool) -> None:
    dialler, acceptor = Handshake(Role.DIALLER), Handshake(Role.ACCEPTOR)
    assert pipe(dialler.send(HELLO), acceptor, piece) == HELLO
    assert acceptor.state is HandshakeState.SEND_REPLY
    reply = Reply(True, link=7) if accept else Reply(False, reason=Refusal.BUSY)
    link_bytes = b"\x00\x00\x00\x02hi"  # the link's first frame, in the same segment
    got = pipe(acceptor.send(reply) + link_bytes, dialler, piece if piece > 4 else 4096)
    assert got == reply
    expected = HandshakeState.LINKED if accept else HandshakeState.REFUSED
    assert dialler.state is acceptor.state is expected
    assert dialler.trailing_data == link_bytes


@pytest.mark.parametrize(("data", "error"), [
    (b"\x00\x00\x00\x05nope!", "not JSON"),
    (b"\xff" * 8, "exceeds"),
    (b"\x00\x00\x00\x02[]", "not a JSON object"),
    (Hello("u", "t", "a", "b", 1, version=9).encode(), "unsupported protocol version 9"),
    (b"", "connection closed during the handshake"),
])
def test_bad_bytes_are_the_peers_protocol_error(data: bytes, error: str) -> None:
    acceptor = Handshake(Role.ACCEPTOR)
    with pytest.raises(HandshakeError, match=error) as info:
        acceptor.receive_data(data)
        acceptor.next_event()
    assert isinstance(info.value, ProtocolError)
    assert acceptor.state is HandshakeState.FAILED


def test_misuse_is_a_local_usage_error() -> None:
    acceptor = Handshake(Role.ACCEPTOR)
    with pytest.raises(RdvUsageError, match="cannot send accepting Reply in state await hello"):
        acceptor.send(Reply(True, link=1))
    dialler = Handshake(Role.DIALLER)
    with pytest.raises(RdvUsageError, match="no data expected in state send hello"):
        dialler.receive_data(b"x")
    dialler.send(HELLO)
    with pytest.raises(RdvUsageError, match="cannot send Hello in state await reply"):
        dialler.send(HELLO)


def test_refusal_reasons_are_typed_and_read_the_same() -> None:
    reason = RefusalReason(Refusal.UNREACHABLE, "timed out")
    assert reason == "unreachable: timed out" and reason.refusal is Refusal.UNREACHABLE
    assert RefusalReason.parse("busy").refusal is Refusal.BUSY == "busy"  # type: ignore[comparison-overlap]  # a str enum equals its string
    assert RefusalReason.parse("unreachable: tls handshake failed").refusal is Refusal.UNREACHABLE
    newer = RefusalReason.parse("duplicate id: held by 10.0.0.1:7000")
    assert newer.refusal is Refusal.OTHER and newer == "duplicate id: held by 10.0.0.1:7000"
