"""JSON messages over message queues: one encoding, one way to send, and the inbound session.

Requests and replies of the name service and of tracking are JSON objects (UTF-8),
one per message.  A message may carry a binary body after its JSON object,
behind one NUL byte (JSON text never holds a raw NUL): :func:`decode` puts it
in the object under ``"body"``, as a read-only memoryview of the message (a body
is not copied to be read: an MQ server stores and forwards it as it came).  A
message that is not a JSON object is a protocol error and closes its link; a
request of the wrong shape gets an error reply (:mod:`._service`).
"""

from __future__ import annotations

import enum
import json
import logging
import re
import secrets
from collections.abc import Callable
from typing import Any, overload

import trio

from channels import (
    Gather,
    MessageQueue,
    MessageTooLargeError,
    ProtocolError,
    QueueListener,
    gather,
)

from ._service import CommandTable, request_seq

log = logging.getLogger("rdvpump.rpc")


#: Between a message's JSON object and its binary body.
BODY_SEPARATOR = b"\x00"
#: A binary body: bytes, or a list of pieces that go back to back.
Body = bytes | memoryview | list[bytes | memoryview]


#: ``json.dumps`` with these options would build an encoder for every message.
_JSON = json.JSONEncoder(separators=(",", ":"), sort_keys=True)


def _one_shot_encoder() -> Callable[[dict[str, Any]], str]:
    """:data:`_JSON`'s ``encode`` of an object, its C encoder made once here (``encode``
    makes one for every call: a third of its cost on a message of a few fields).  The
    objects are the services' own, never circular, so it does not look for cycles."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # no C accelerator (another Python): the plain encoder
        return _JSON.encode
    iterencode = make(None, _JSON.default, json.encoder.encode_basestring_ascii, None,
                      _JSON.key_separator, _JSON.item_separator, True, False, True)
    join = "".join
    return lambda obj: join(iterencode(obj, 0))


_encode_object = _one_shot_encoder()
_DECODER = json.JSONDecoder()
_SPACE = re.compile(r"[ \t\n\r]*")  # what JSON takes as whitespace


def _loads(head: bytes | memoryview) -> Any:
    """``json.loads`` of a message's UTF-8 head, without its detection of other
    encodings and its wrappers (half its cost on a reply of a few fields)."""
    text = str(head, "utf-8", "surrogatepass")
    start = 0 if text[:1] == "{" else _SPACE.match(text).end()  # type: ignore[union-attr]
    obj, end = _DECODER.raw_decode(text, start)
    if end != len(text) and _SPACE.match(text, end).end() != len(text):  # type: ignore[union-attr]
        raise json.JSONDecodeError("Extra data", text, end)
    return obj


@overload
def encode(obj: dict[str, Any]) -> bytes: ...


@overload
def encode(obj: dict[str, Any], body: Body | None) -> bytes | Gather: ...


def encode(obj: dict[str, Any], body: Body | None = None) -> bytes | Gather:
    """One JSON object as a message: compact, keys sorted (the same object, the same bytes),
    followed by ``body`` behind a NUL byte if one is given.  ``body`` may be a list of
    pieces, which go back to back.  A large message is a :class:`~channels.Gather`: its
    pieces are copied only into the link, never joined first (they must not change
    until it is sent); a small one is joined into bytes."""
    return _with_body(_encode_object(obj).encode(), body)


def _with_body(head: bytes, body: Body | None) -> bytes | Gather:
    if body is None:
        return head
    if isinstance(body, list):
        return gather([head, BODY_SEPARATOR, *body])
    return gather((head, BODY_SEPARATOR, body))


class Template:
    """Messages alike but for one string field (a frame passed on to several groups):
    :meth:`encode` gives :func:`encode` of ``{**obj, field: value}`` byte for byte, the
    rest of the object encoded once, here."""

    __slots__ = ("_before", "_after")

    def __init__(self, obj: dict[str, Any], field: str) -> None:
        name = _quote(field)
        token = _TOKEN  # where the field goes, among the sorted keys
        while True:
            parts = _encode_object({**obj, field: token}).split(f"{name}:{_quote(token)}")
            if len(parts) == 2:
                break
            token = secrets.token_hex(16)  # a nested object of that field holds it
        self._before = f"{parts[0]}{name}:"
        self._after = parts[1]

    def encode(self, value: str, body: Body | None = None) -> bytes | Gather:
        return _with_body(f"{self._before}{_quote(value)}{self._after}".encode(), body)


#: A string as JSON (what :func:`encode` makes of it).
_quote = json.encoder.encode_basestring_ascii
#: What a template first tries as its field's place (one made at random for each
#: template cost a system call a frame).
_TOKEN = secrets.token_hex(16)


def decode(message: bytes) -> dict[str, Any]:
    """A message as a JSON object (its body, if any, under ``"body"``, a memoryview of
    ``message``); :class:`ProtocolError` saying what is wrong otherwise."""
    cut = message.find(BODY_SEPARATOR)
    head = message if cut < 0 else message[:cut]
    try:
        obj = _loads(head)
    except RecursionError:
        raise ProtocolError("JSON nested too deeply") from None
    except ValueError as exc:
        raise ProtocolError(f"not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ProtocolError("not a JSON object")
    if cut >= 0:
        if "body" in obj:
            raise ProtocolError("a message with a binary body has a 'body' field too")
        obj["body"] = memoryview(message)[cut + 1:]
    return obj


class Sent(enum.Enum):
    """How :func:`send` went."""

    SENT = "sent"
    FULL = "full"  # past the high-water mark: nothing queued; the queue says drained() later
    GONE = "gone"  # the link is closed, or was closed here because the message can never fit


def send(queue: MessageQueue, obj: dict[str, Any] | bytes | Gather, *, what: str) -> Sent:
    """Queue one JSON message (or one already encoded) on ``queue``, never raising."""
    data = obj if isinstance(obj, (bytes, Gather)) else encode(obj)
    try:
        queue.send(data)
        return Sent.SENT
    except MessageTooLargeError:
        # Too big for one message: this link cannot carry it; close it, loudly.
        log.warning("%s: a message of %d bytes exceeds the link's maximum message size",
                    what, len(data))
        queue.abort(f"a message of {len(data)} bytes exceeds the maximum message size")
    except trio.WouldBlock:
        return Sent.FULL
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass  # closing already; its closed() follows
    return Sent.GONE


class ServiceSession(QueueListener):
    """One inbound link to a service (:mod:`._service`): each request is answered through
    the service's :class:`~._service.CommandTable`.  A reply echoes the request's ``seq``
    (when it has one), so that the dialling side can match it; a client that does not
    read its replies is dropped.  Subclasses add what the service does when the link
    drains or closes."""

    #: What the requests are, for error messages ("name-service request", ...).
    what = "request"

    def __init__(self, queue: MessageQueue, table: CommandTable) -> None:
        self.queue = queue
        self.table = table

    def received(self, message: bytes) -> None:
        try:
            request = decode(message)
        except ProtocolError as exc:
            self.queue.protocol_error(f"bad {self.what}: {exc}")
            return
        self.handle(request)

    def handle(self, request: dict[str, Any]) -> None:
        reply = self.table.answer(request, self.queue)
        if reply is not None:
            self.reply(request, reply)

    def reply(self, request: dict[str, Any], obj: dict[str, Any]) -> bool:
        """Send ``obj`` as the reply to ``request``; False if the link is gone (or was
        closed here because the client does not read its replies)."""
        seq = request_seq(request)
        if seq is not None:
            obj["seq"] = seq
        outcome = send(self.queue, obj, what=f"client {self.queue.remote_id}")
        if outcome is Sent.FULL:
            self.queue.abort("client does not read its replies")
        return outcome is Sent.SENT
