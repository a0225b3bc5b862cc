"""The service protocol that every request/reply service on rdvpump's links speaks: the
name service, tracking and the MQ server.

A request is one JSON message with a ``cmd``, and a ``seq`` when its sender waits for
the reply; the reply echoes the ``seq``.  Each service lists its commands in a
:class:`CommandTable`: per command, a parser that turns the request into a small frozen
dataclass through :class:`Fields` (every field checked before any handler runs: a bad
field is :data:`Status.BAD_REQUEST` naming it, and a refused request changes nothing),
and the handler that answers it.  Every refusal is one :class:`ServiceError`
``(status, reason)``, sent as one envelope::

    {"cmd": "error", "status": 404, "error": "no topic 'a' on s1:15555", "for": "consume"}

(``for`` is the refused command; a service may add what else the error names, as the
MQ server adds the topic and group).  On the calling side,
:meth:`~brokermgr.ReconnectingLink.call` returns the reply or raises the same
:class:`ServiceError`; no reply at all (not connected, the link lost, the timeout) is
status :data:`Status.NO_REPLY`, 0.  Sans-I/O apart from the link a reply goes back on.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from channels import MessageQueue
from pump import RdvpumpError
from rdv import Identity, Right

from ._fence import MAX_EPOCH

log = logging.getLogger("rdvpump.service")
#: One line per admin action (remove, empty, failover, ...) and per request refused for a
#: missing right: who (identity), from where (peer), what, and how it ended.
audit_log = logging.getLogger("rdvpump.audit")

#: A reply as it goes on a link: a JSON object with its ``cmd`` (and ``seq`` when the
#: request had one).
ReplyObject = dict[str, Any]
R = TypeVar("R")
T = TypeVar("T")

#: Sequence numbers (``seq``), offsets and other counters on the wire are unsigned 63-bit
#: integers (stored as u64).
MAX_INT = (1 << 63) - 1


class Status(enum.IntEnum):
    """The statuses of a service's replies (HTTP's numbers, where one fits)."""

    NO_REPLY = 0  # the caller's: no reply came (not connected, the link lost, timed out)
    OK = 200
    BAD_REQUEST = 400  # a field of the wrong type or range, or an unknown command
    FORBIDDEN = 403  # the link's identity lacks the right (named in the reply)
    NOT_FOUND = 404  # no such topic, group, receiver
    CONFLICT = 409  # the request contradicts the state (a duplicate id, an ack not held)
    GONE = 410  # whom it was for has left
    TOO_LARGE = 413  # a message over what the server takes
    INTERNAL = 500  # the server failed (a disk error); the request may or may not have
    UNAVAILABLE = 503  # not now: closed, a topic in its error state


class ServiceError(RdvpumpError):
    """A refused request: its ``status`` (a :class:`Status`) and the ``reason``, and what
    else the error names (``detail``, sent in the envelope beside them)."""

    def __init__(self, status: int, reason: str, **detail: Any) -> None:
        super().__init__(reason)
        self.status = int(status)
        self.reason = reason
        self.detail = detail

    def __str__(self) -> str:
        return f"{self.reason} (status {self.status})" if self.status else self.reason

    def envelope(self, cmd: str | None = None) -> ReplyObject:
        """This error as the reply to a ``cmd`` request."""
        reply: ReplyObject = {**self.detail, "cmd": "error", "status": self.status,
                        "error": self.reason}
        if cmd is not None:
            reply["for"] = cmd
        return reply

    @classmethod
    def of(cls, reply: ReplyObject) -> ServiceError | None:
        """The error an envelope carries, None for any other reply."""
        if reply.get("cmd") != "error":
            return None
        status = reply.get("status")
        if type(status) is not int or not 100 <= status <= 999:
            status = Status.INTERNAL
        detail = {k: v for k, v in reply.items() if k not in ("cmd", "status", "error", "seq")}
        return cls(status, str(reply.get("error")), **detail)


def show(value: object) -> str:
    """A value as an error message quotes it: its repr, cut to 40 characters."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


class Fields:
    """The fields of one request, checked one at a time: each getter returns a typed value
    or raises :class:`ServiceError` 400 naming the command and the field."""

    __slots__ = ("cmd", "obj")

    def __init__(self, obj: Mapping[str, Any], cmd: str) -> None:
        self.obj = obj
        self.cmd = cmd

    def __contains__(self, key: str) -> bool:
        return key in self.obj

    def raw(self, key: str, default: Any = None) -> Any:
        """The field as it came (for a parser that checks it itself, with :meth:`bad`)."""
        return self.obj.get(key, default)

    def bad(self, key: str, why: str) -> ServiceError:
        return ServiceError(Status.BAD_REQUEST, f"{self.cmd}: {key} {why}")

    def string(self, key: str, *, check: Callable[[str, str], str] | None = None,
               max_bytes: int | None = None) -> str:
        """A required string; ``check(value, key)`` (raising ValueError) for a rule of its
        own, ``max_bytes`` for a bound on its UTF-8 length."""
        value = self.obj.get(key)
        if type(value) is str and check is None and max_bytes is None:
            return value  # the common case, without a second call
        value = self.optional_string(key, check=check, max_bytes=max_bytes)
        if value is None:
            raise self.bad(key, "is missing")
        return value

    def optional_string(self, key: str, *, check: Callable[[str, str], str] | None = None,
                        max_bytes: int | None = None) -> str | None:
        value = self.obj.get(key)
        if value is None:
            return None
        if check is not None:
            try:
                return check(value, key)
            except ValueError as exc:
                raise ServiceError(Status.BAD_REQUEST, f"{self.cmd}: {exc}") from None
        if not isinstance(value, str):
            raise self.bad(key, f"must be a string, got {type(value).__name__}")
        if max_bytes is not None:
            try:
                size = len(value.encode())
            except UnicodeEncodeError:
                raise self.bad(key, "is not valid Unicode") from None
            if size > max_bytes:
                raise self.bad(key, f"is {size} bytes; at most {max_bytes}")
        return value

    def integer(self, key: str, default: int | None, low: int, high: int) -> int:
        """An integer within ``low..high`` (not a bool); ``default`` if absent (None:
        required)."""
        value = self.obj.get(key, default)
        if value is None:
            raise self.bad(key, "is missing")
        if type(value) is not int or not low <= value <= high:
            raise self.bad(key, f"must be an integer within {low}..{high}, got {show(value)}")
        return value

    def epoch(self, key: str, default: int | None, low: int = 0) -> int:
        """An epoch: an integer from ``low`` below :data:`~._fence.MAX_EPOCH`, the bound
        every epoch shares (one past it, or at it, is a 400 naming the field)."""
        return self.integer(key, default, low, MAX_EPOCH - 1)

    def boolean(self, key: str, default: bool) -> bool:
        value = self.obj.get(key, default)
        if type(value) is not bool:
            raise self.bad(key, f"must be true or false, got {show(value)}")
        return value

    def items(self, key: str, parse: Callable[[Any], T], *, what: str) -> list[T]:
        """A list, each item through ``parse`` (raising ValueError, TypeError or
        KeyError): 400 naming the item's index and ``what`` an item must be."""
        value = self.obj.get(key)
        if not isinstance(value, list):
            raise self.bad(key, f"must be a list of {what}")
        out = []
        for i, item in enumerate(value):
            try:
                out.append(parse(item))
            except (ValueError, TypeError, KeyError) as exc:
                raise self.bad(f"{key}[{i}]", f"must be {what}: {exc}") from None
        return out

    def parsed(self, key: str, parse: Callable[[Any], T]) -> T:
        """A field through ``parse`` (a ``from_json``, raising ValueError): 400 naming it."""
        try:
            return parse(self.obj.get(key))
        except ValueError as exc:
            raise self.bad(key, f"is not valid: {exc}") from None
        except RecursionError:
            raise self.bad(key, "is nested too deeply") from None

    def body(self) -> bytes | memoryview:
        """The binary body behind the JSON head (empty if none)."""
        body = self.obj.get("body", b"")
        if not isinstance(body, bytes | memoryview):
            raise ServiceError(Status.BAD_REQUEST,
                               f"{self.cmd}: the body must follow the JSON head behind a NUL "
                               f"byte")
        return body


@dataclass(frozen=True, slots=True)
class Call:
    """One request being answered: the link it came on (None: from this process), the
    ``seq`` its reply must echo (None: the caller does not wait for one), its command."""

    queue: MessageQueue | None
    seq: int | None
    cmd: str


#: How a service sends a reply: on the link (None: to this process, not sent), with the
#: ``seq`` it echoes (None: the caller does not wait for one).
SendReply = Callable[[MessageQueue | None, int | None, ReplyObject], None]


class Deferred:
    """A reply sent after its request's handler returned (the handler returned None):
    held for a group commit, for replicas' acknowledgements, for a cluster's root.  The
    one form of every held reply: the :class:`Call` it answers, the reply once it is
    known, what a refusal names besides its reason (the topic, the group), and the
    service's ``send``.  It is sent at most once; a later answer is dropped."""

    __slots__ = ("call", "reply", "named", "sent", "_send")

    def __init__(self, call: Call, send: SendReply, reply: ReplyObject | None = None,
                 **named: Any) -> None:
        self.call = call
        #: the reply, once known (sent by :meth:`answer` with no argument)
        self.reply = reply
        self.named = named
        self.sent = False
        self._send = send

    @property
    def queue(self) -> MessageQueue | None:
        """The link the reply goes on (None: a request of this process)."""
        return self.call.queue

    def answer(self, reply: ReplyObject | None = None) -> None:
        """Send ``reply`` (by default the one held) unless an answer went already."""
        if self.sent:
            return
        reply = self.reply if reply is None else reply
        if reply is None:
            raise ValueError(f"a deferred {self.call.cmd} reply answered with no reply")
        self.sent = True
        self._send(self.call.queue, self.call.seq, reply)

    def refuse(self, error: ServiceError) -> None:
        """Answer with ``error``'s envelope, naming what this reply names."""
        reply = error.envelope(self.call.cmd)
        for key, value in self.named.items():
            reply.setdefault(key, value)
        self.answer(reply)


@dataclass(frozen=True, slots=True)
class Command(Generic[R]):
    """A command of a service: ``parse`` makes its typed request from the fields (or
    refuses it), ``handle`` answers it: the reply, or None (no reply, or one that is sent
    later, as a produce's after its group commit).

    ``right`` says what the request needs of its link's identity: the right and the topic
    (or broker) it applies to, checked before ``handle`` (a 403 naming both, which
    changes nothing); ``audit`` marks an admin action, logged with who asked, from where
    and how it ended, and says what it acts on."""

    parse: Callable[[Fields], R]
    handle: Callable[[R, Call], ReplyObject | None]
    right: Callable[[R], tuple[Right, str]] | None = None
    audit: Callable[[R], str] | None = None


def peer_of(queue: MessageQueue | None) -> str:
    """Who is at the other end of a request's link, as the audit log names it."""
    if queue is None:
        return "this process"
    where = queue.peer_address
    return f"{queue.remote_id}@{where}" if where else queue.remote_id


_said: set[tuple[str, str, str, str]] = set()


def require(queue: MessageQueue | None, right: Right, what: str = "", *,
            cmd: str) -> None:
    """Refuse (403, counted and logged once per identity, right, target and peer) a
    request whose link's identity lacks ``right`` on ``what``; a link within this process
    (no identity) has every right."""
    identity: Identity | None = None if queue is None else queue.identity
    if identity is None or identity.may(right, what):
        return
    identity.denied(right)
    if right is Right.ADMIN:
        why = f"identity {identity.name!r} has no admin right, which {cmd} needs"
    elif right is Right.MEMBER:
        why = f"identity {identity.name!r} may not speak as member {what!r}"
    else:
        why = f"identity {identity.name!r} may not {right} {what!r}"
    key = (identity.name, str(right), what, peer_of(queue))
    if key not in _said:
        if len(_said) >= 4096:
            _said.clear()
        _said.add(key)
        audit_log.warning("denied: %s by %s from %s: %s", cmd, identity.name, key[3], why)
    raise ServiceError(Status.FORBIDDEN, why, identity=identity.name, right=str(right))


def request_seq(obj: Mapping[str, Any]) -> int | None:
    """The ``seq`` a reply echoes: a non-negative integer, or None (no reply is matched)."""
    seq = obj.get("seq")
    return seq if type(seq) is int and 0 <= seq <= MAX_INT else None


def require_member(queue: MessageQueue | None, broker_id: str, *, cmd: str,
                   always: bool) -> None:
    """Refuse (403) a request that speaks for ``broker_id`` from a link whose identity may
    not speak as it: ``always`` (a group's or a cluster's member), or when some identity is
    that broker's member (the id is reserved to it)."""
    identity: Identity | None = None if queue is None else queue.identity
    if identity is None or identity.everything:
        return
    if always or (identity.registry is not None and identity.registry.reserved(broker_id)):
        require(queue, Right.MEMBER, broker_id, cmd=cmd)


class CommandTable:
    """A service's commands by name.  :meth:`answer` parses a request, runs its handler and
    turns every refusal into the error envelope; ``names`` says what else an error reply
    names of its request (its topic and group, say)."""

    def __init__(self, service: str, commands: Mapping[str, Command[Any]], *,
                 names: Callable[[Mapping[str, Any]], ReplyObject] | None = None) -> None:
        self.service = service
        self.commands = dict(commands)
        self._names = names

    def __contains__(self, cmd: object) -> bool:
        return cmd in self.commands

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self.commands)

    def command(self, obj: Mapping[str, Any]) -> tuple[str, Command[Any]]:
        cmd = obj.get("cmd")
        command = self.commands.get(cmd) if isinstance(cmd, str) else None
        if command is None:
            raise ServiceError(Status.BAD_REQUEST, f"unknown {self.service} command "
                                                   f"{show(cmd)}")
        assert isinstance(cmd, str)
        return cmd, command

    def parse(self, obj: Mapping[str, Any]) -> Any:
        """The typed request of a decoded message; :class:`ServiceError` 400 if refused."""
        cmd, command = self.command(obj)
        return command.parse(Fields(obj, cmd))

    def answer(self, obj: Mapping[str, Any], queue: MessageQueue | None) -> ReplyObject | None:
        """The reply to the request ``obj`` from ``queue``: the handler's, or an error
        envelope; None for none.  A handler that fails with anything but a
        :class:`ServiceError` is a bug: logged with its traceback, answered 500."""
        cmd = obj.get("cmd")
        command = self.commands.get(cmd) if isinstance(cmd, str) else None
        known = None if command is None else cmd
        try:
            if command is None:
                self.command(obj)  # raises the refusal
            assert command is not None and known is not None
            request = command.parse(Fields(obj, known))
            if command.right is not None and queue is not None:
                identity = queue.identity
                if identity is not None and not identity.everything:
                    right, what = command.right(request)
                    require(queue, right, what, cmd=known)
            seq = obj.get("seq")  # request_seq, inline: this runs for every request
            call = Call(queue, seq if type(seq) is int and 0 <= seq <= MAX_INT else None, known)
            if command.audit is not None:
                return self._audited(command, request, call)
            return command.handle(request, call)
        except ServiceError as exc:
            return self.refusal(obj, exc, known)
        except Exception:
            log.exception("%s: the %s command failed", self.service, known)
            return self.refusal(obj, ServiceError(Status.INTERNAL, f"{self.service}: the "
                                                  f"{known} command failed"), known)

    def _audited(self, command: Command[Any], request: Any, call: Call) -> ReplyObject | None:
        assert command.audit is not None
        identity = None if call.queue is None else call.queue.identity
        who = "this process" if identity is None else identity.name
        what = f"{self.service} {call.cmd} {command.audit(request)}"
        try:
            reply = command.handle(request, call)
        except ServiceError as exc:
            audit_log.warning("%s by %s from %s: refused %d: %s", what, who,
                              peer_of(call.queue), exc.status, exc.reason)
            raise
        except Exception:
            audit_log.warning("%s by %s from %s: failed", what, who, peer_of(call.queue))
            raise
        audit_log.warning("%s by %s from %s: done", what, who, peer_of(call.queue))
        return reply

    def refusal(self, obj: Mapping[str, Any], error: ServiceError, cmd: str | None
                ) -> ReplyObject:
        reply = error.envelope(cmd)
        if self._names is not None:
            for key, value in self._names(obj).items():
                reply.setdefault(key, value)
        return reply


@dataclass(frozen=True, slots=True)
class Push(Generic[R]):
    """A message a service sends unasked (a delivery, a feed's update, a redirect):
    ``parse`` makes it typed from its fields, as a request's are (a bad field is a
    :class:`ServiceError` naming it, and closes the link as a protocol error), then
    ``handle`` takes it.  :meth:`raw` is a push whose handler reads the fields itself: a
    delivery frame, whose columns are unpacked in one pass on the hot path."""

    parse: Callable[[Fields], R]
    handle: Callable[[R], None]

    @staticmethod
    def raw(handle: Callable[[dict[str, Any]], None]) -> Push[dict[str, Any]]:
        return Push(_fields_object, handle)


def _fields_object(fields: Fields) -> dict[str, Any]:
    return fields.obj  # type: ignore[return-value]  # a decoded message: a dict


class PushTable:
    """What a link does with the messages that are no reply to its requests, by their
    ``cmd``, as :class:`CommandTable` does with requests.  An error envelope goes to
    ``refused`` as its :class:`ServiceError` (logged by default); a ``cmd`` the table does
    not list closes the link as a protocol error, or is ignored when ``unknown`` is
    ``"ignore"`` (a client that a newer server may tell more)."""

    def __init__(self, what: str, pushes: Mapping[str, Push[Any]], *,
                 refused: Callable[[ServiceError], None] | None = None,
                 unknown: str = "close") -> None:
        if unknown not in ("close", "ignore"):
            raise ValueError(f"unknown is 'close' or 'ignore', not {unknown!r}")
        self.what = what
        self.pushes = dict(pushes)
        self.refused = refused or self._log_refusal
        self.unknown = unknown

    def _log_refusal(self, error: ServiceError) -> None:
        log.warning("%s: %s", self.what, error)

    def take(self, obj: dict[str, Any], protocol_error: Callable[[str], None]) -> None:
        """Handle one push; ``protocol_error(reason)`` closes its link."""
        cmd = obj.get("cmd")
        push = self.pushes.get(cmd) if isinstance(cmd, str) else None
        if push is None:
            if cmd == "error":
                error = ServiceError.of(obj)
                assert error is not None
                self.refused(error)
            elif self.unknown == "close":
                protocol_error(f"{self.what} sent {show(cmd)}, which is no message it sends")
            return
        assert isinstance(cmd, str)
        try:
            value = push.parse(Fields(obj, cmd))
        except ServiceError as exc:
            protocol_error(f"a bad {cmd} from {self.what}: {exc.reason}")
            return
        push.handle(value)
