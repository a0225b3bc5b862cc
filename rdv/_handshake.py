"""The rendezvous handshake as a sans-I/O state machine, in the manner of h11.

Each side owns a :class:`Handshake` and does no I/O through it: bytes that
arrive go in with :meth:`~Handshake.receive_data`, events come out of
:meth:`~Handshake.next_event` (:data:`NEED_DATA` until a whole frame is
there), and :meth:`~Handshake.send` turns an event into the bytes to write.

The dialler sends a :class:`Hello` and waits for a :class:`Reply`; the
acceptor waits for the Hello and sends the Reply.  Bytes after the last
frame (the link's first bytes, in the same segment) are kept in
:attr:`~Handshake.trailing_data`.  What the peer sent wrong raises
:class:`HandshakeError` (a protocol error); using the object out of order
raises :class:`RdvUsageError`.
"""

from __future__ import annotations

import enum
from typing import Final

from ._core import RdvUsageError
from ._wire import (
    FrameReader,
    HandshakeError,
    HandshakeFault,
    Hello,
    Reply,
    parse_hello,
    parse_reply,
)


class Role(enum.Enum):
    DIALLER = "dialler"
    ACCEPTOR = "acceptor"


class HandshakeState(enum.Enum):
    SEND_HELLO = "send hello"        # dialler, at the start
    AWAIT_REPLY = "await reply"      # dialler, hello sent
    AWAIT_HELLO = "await hello"      # acceptor, at the start
    SEND_REPLY = "send reply"        # acceptor, hello received
    LINKED = "linked"                # accepted: the connection carries the link now
    REFUSED = "refused"              # refused: the connection ends
    FAILED = "failed"                # the peer broke the protocol


class _NeedData:
    def __repr__(self) -> str:
        return "NEED_DATA"


#: What :meth:`Handshake.next_event` returns while a frame is incomplete.
NEED_DATA: Final = _NeedData()

S = HandshakeState
#: (state, what happens) -> next state; anything else is a usage error.
TRANSITIONS: dict[tuple[HandshakeState, str], HandshakeState] = {
    (S.SEND_HELLO, "send Hello"): S.AWAIT_REPLY,
    (S.AWAIT_REPLY, "receive accepting Reply"): S.LINKED,
    (S.AWAIT_REPLY, "receive refusing Reply"): S.REFUSED,
    (S.AWAIT_HELLO, "receive Hello"): S.SEND_REPLY,
    (S.SEND_REPLY, "send accepting Reply"): S.LINKED,
    (S.SEND_REPLY, "send refusing Reply"): S.REFUSED,
}


class Handshake:
    """One side of one connection's handshake."""

    def __init__(self, role: Role) -> None:
        self.role = role
        self.state = S.SEND_HELLO if role is Role.DIALLER else S.AWAIT_HELLO
        self._reader = FrameReader()
        self._event: dict[str, object] | None = None

    def _move(self, what: str) -> None:
        nxt = TRANSITIONS.get((self.state, what))
        if nxt is None:
            raise RdvUsageError(f"handshake ({self.role.value}): cannot {what} in state "
                                f"{self.state.value}")
        self.state = nxt

    @property
    def trailing_data(self) -> bytes:
        """Bytes received after the handshake's last frame: the link's first bytes."""
        return self._reader.rest

    def receive_data(self, data: bytes | bytearray) -> None:
        """Bytes from the peer; an empty ``data`` is the end of the stream."""
        if self.state not in (S.AWAIT_HELLO, S.AWAIT_REPLY):
            raise RdvUsageError(f"handshake ({self.role.value}): no data expected in state "
                                f"{self.state.value}")
        if not data:
            self.state = S.FAILED
            raise HandshakeError("connection closed during the handshake", HandshakeFault.CLOSED)
        try:
            self._event = self._reader.feed(data)
        except HandshakeError:
            self.state = S.FAILED
            raise

    def next_event(self) -> Hello | Reply | _NeedData:
        """The Hello (acceptor) or the Reply (dialler), once whole; NEED_DATA before."""
        obj = self._event
        if obj is None:
            if self.state not in (S.AWAIT_HELLO, S.AWAIT_REPLY):
                raise RdvUsageError(f"handshake ({self.role.value}): no event to wait for in "
                                    f"state {self.state.value}")
            return NEED_DATA
        self._event = None
        try:
            if self.state is S.AWAIT_HELLO:
                hello = parse_hello(obj)
                self._move("receive Hello")
                return hello
            reply = parse_reply(obj)
        except HandshakeError:
            self.state = S.FAILED
            raise
        self._move("receive accepting Reply" if reply.accepted else "receive refusing Reply")
        return reply

    def send(self, event: Hello | Reply) -> bytes:
        """The bytes of our Hello (dialler) or Reply (acceptor)."""
        if isinstance(event, Hello):
            self._move("send Hello")
        else:
            self._move("send accepting Reply" if event.accepted else "send refusing Reply")
        return event.encode()


def state_diagram() -> str:
    """The handshake's table as a Mermaid state diagram."""
    lines = ["stateDiagram-v2", f"    [*] --> {S.SEND_HELLO.name}: dialler",
             f"    [*] --> {S.AWAIT_HELLO.name}: acceptor"]
    for (state, what), nxt in TRANSITIONS.items():
        lines.append(f"    {state.name} --> {nxt.name}: {what}")
    lines.append(f"    AWAIT_HELLO --> {S.FAILED.name}: bad bytes")
    lines.append(f"    AWAIT_REPLY --> {S.FAILED.name}: bad bytes")
    lines.append("    %% generated from rdv._handshake.TRANSITIONS")
    return "\n".join(lines) + "\n"
