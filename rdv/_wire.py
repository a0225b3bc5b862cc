"""The rendezvous handshake on the wire, sans-I/O: encode, and parse bytes as they come.

Both directions are one frame each, a 4-byte big-endian length then a JSON
object.  After an accepting reply the connection carries the link's byte
stream (message-queue frames) both ways.
"""

from __future__ import annotations

import enum
import hmac
import json
from dataclasses import dataclass

from channels import ProtocolError
from pump import ConfigError

from ._core import MAX_PORT

#: 2: a side that ends a link sends a close frame before its end of stream (version 1
#: peers did not, and would take one for an oversized frame).  3: the services on links
#: (name service, tracking, MQ) speak one request protocol: ``cmd``, ``seq`` and one error
#: envelope (the name service spoke ``op`` and ``ok`` before).
PROTOCOL_VERSION = 3
#: Largest handshake frame accepted; anything longer is garbage.
MAX_HANDSHAKE_SIZE = 4096


class HandshakeFault(enum.StrEnum):
    """What kind of bad handshake a peer sent: the cause, whatever numbers its message
    carries (what collapses a flood of them in the log)."""

    OVERSIZED = "oversized handshake frame"
    NOT_JSON = "handshake not JSON"
    TOO_DEEP = "handshake nested too deeply"
    MALFORMED = "malformed handshake"
    VERSION = "unsupported protocol version"
    CLOSED = "closed during the handshake"


class HandshakeError(ProtocolError):
    """The peer sent something that is not a valid handshake (the remote's fault);
    ``fault`` says which kind."""

    def __init__(self, message: str, fault: HandshakeFault = HandshakeFault.MALFORMED) -> None:
        super().__init__(message)
        self.fault = fault


@dataclass(frozen=True, slots=True)
class Hello:
    """Connect request: ``src`` in ``universe`` wants ``(dst, port)``."""

    universe: str
    token: str
    src: str
    dst: str
    port: int
    version: int = PROTOCOL_VERSION
    #: The identity the dialler speaks as, and its secret (None: the token's identity).
    identity: str | None = None
    secret: str | None = None

    def encode(self) -> bytes:
        obj: dict[str, object] = {"rdvpump": self.version, "universe": self.universe,
                                  "token": self.token, "src": self.src, "dst": self.dst,
                                  "port": self.port}
        if self.identity is not None:
            obj["identity"], obj["secret"] = self.identity, self.secret or ""
        return _frame(obj)

    def __repr__(self) -> str:  # never the token or the secret
        return (f"Hello(universe={self.universe!r}, src={self.src!r}, dst={self.dst!r}, "
                f"port={self.port}, identity={self.identity!r})")

    def authorized(self, universe: str, token: str) -> bool:
        """Universe and token match, compared in constant time."""
        same_universe = hmac.compare_digest(self.universe.encode(), universe.encode())
        same_token = hmac.compare_digest(self.token.encode(), token.encode())
        return same_universe & same_token


@dataclass(frozen=True, slots=True)
class Reply:
    """Accept (with the link id) or refuse (with the reason)."""

    accepted: bool
    reason: str | None = None
    link: int | None = None

    def encode(self) -> bytes:
        if self.accepted:
            return _frame({"accepted": True, "link": self.link})
        return _frame({"accepted": False, "reason": self.reason})


def _frame(obj: dict[str, object]) -> bytes:
    body = json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()
    if len(body) > MAX_HANDSHAKE_SIZE:
        raise ConfigError(f"handshake of {len(body)} bytes exceeds {MAX_HANDSHAKE_SIZE}; "
                         "shorten the ids or the token")
    return len(body).to_bytes(4, "big") + body


class FrameReader:
    """Collects bytes until one whole handshake frame is there.

    ``feed(data)`` returns the decoded JSON object, or None while more bytes
    are needed; bytes after the frame are kept in :attr:`rest` (the link's
    stream, which may arrive in the same segment).
    """

    def __init__(self) -> None:
        self._buf = bytearray()
        self.rest = b""

    def feed(self, data: bytes | bytearray) -> dict[str, object] | None:
        self._buf += data
        if len(self._buf) < 4:
            return None
        n = int.from_bytes(self._buf[:4], "big")
        if n > MAX_HANDSHAKE_SIZE:
            raise HandshakeError(f"handshake frame of {n} bytes exceeds {MAX_HANDSHAKE_SIZE}",
                                 HandshakeFault.OVERSIZED)
        if len(self._buf) < 4 + n:
            return None
        body = bytes(self._buf[4:4 + n])
        self.rest = bytes(self._buf[4 + n:])
        self._buf.clear()
        try:
            obj = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise HandshakeError(f"handshake is not JSON: {exc}",
                                 HandshakeFault.NOT_JSON) from None
        except RecursionError:
            raise HandshakeError("handshake JSON nested too deeply",
                                 HandshakeFault.TOO_DEEP) from None
        if not isinstance(obj, dict):
            raise HandshakeError("handshake is not a JSON object")
        return obj


def parse_hello(obj: dict[str, object]) -> Hello:
    """Validate a decoded connect request."""
    version = obj.get("rdvpump")
    if version != PROTOCOL_VERSION:
        raise HandshakeError(f"unsupported protocol version {version!r} "
                             f"(this side speaks {PROTOCOL_VERSION})", HandshakeFault.VERSION)
    fields = {k: obj.get(k) for k in ("universe", "token", "src", "dst")}
    for key, value in fields.items():
        if not isinstance(value, str):
            raise HandshakeError(f"handshake field {key!r} must be a string")
    port = obj.get("port")
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= MAX_PORT:
        raise HandshakeError(f"handshake port must be an int within 0..{MAX_PORT}")
    identity, secret = obj.get("identity"), obj.get("secret")
    if identity is not None and (not isinstance(identity, str) or not isinstance(secret, str)):
        raise HandshakeError("handshake identity and secret must be strings")
    return Hello(str(fields["universe"]), str(fields["token"]), str(fields["src"]),
                 str(fields["dst"]), port, identity=identity,
                 secret=str(secret) if identity is not None else None)


def parse_reply(obj: dict[str, object]) -> Reply:
    accepted = obj.get("accepted")
    if accepted is True:
        link = obj.get("link")
        if not isinstance(link, int) or isinstance(link, bool):
            raise HandshakeError("accepting reply without an int link id")
        return Reply(True, link=link)
    if accepted is False:
        reason = obj.get("reason")
        if not isinstance(reason, str):
            raise HandshakeError("refusing reply without a reason")
        return Reply(False, reason=reason)
    raise HandshakeError("reply must say accepted true or false")
