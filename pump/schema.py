"""The trace schema: the one definition of a trace row, versioned; the replay job reads it here.

A trace row is::

    v, run, pump, step, time, kind, broker, peer, port, link, dir, seq, size, outcome,
    reason, monotonic

``v`` is :data:`SCHEMA_VERSION`; ``run`` names one run of a universe (all of
its pumps share it), ``pump`` the pump that wrote the row; ``step`` is the
number of the pump task during which it happened (0 before the first), and
``time`` the pump clock in seconds.  The other fields are set when they apply:

- ``broker`` the side the event happened on, ``peer`` the other side, ``port``
  the rendezvous port;
- ``link`` the link id, ``"<accepting broker>/<n>"``: unique in a universe,
  and the same string on both ends of a link, in one process or two;
- ``dir`` the direction of a message or of bytes on a link: ``"ca"`` from the
  connecting side to the accepting side, ``"ac"`` the other way;
- ``seq`` the message sequence number per link and direction (from 1);
- ``size`` a byte count; ``outcome`` and ``reason`` qualify the event;
- ``monotonic`` the machine's monotonic clock (``time.monotonic()``) at this
  pump time, on ``clock`` events: pumps of different processes align on it.

Kinds: ``bind``, ``listen``, ``unbind``, ``connect``, ``accept``, ``refuse``
(reason), ``write`` and ``read`` (bytes moved through a ring; outcome
``partial`` when not everything fit), ``send`` and ``deliver`` (one per
message), ``protocol_error``, ``disconnect`` (outcome: how the link ended,
``clean``, ``aborted``, ``lost`` or ``protocol error``), ``close`` (a listener
was told), ``timer`` (a timer fired; outcome its kind), ``task`` (a pump step
began; outcome the task's kind), ``fail`` (a task raised), ``clock`` (a served
pump started), the name service's ``expire`` and ``drop``, and ``fault`` (a fault the
simulation injected: outcome the action, reason its detail).

The kinds, the outcomes, the violations the replay finds and the causes it gives an
undelivered message are named once, here (:class:`Kind`, :class:`Outcome`,
:class:`Violation`, :class:`Cause`): the pump, the layers that record, the replay and
the benchmarks use these names.

Version 3 moved the monotonic clock of ``clock`` events from ``reason`` into
its own field and named the ``disconnect`` outcomes by cause (version 2 said
``error`` or ``clean``).  This module imports nothing but the standard library.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

#: Bumped whenever a field is added, removed or changes meaning.
SCHEMA_VERSION = 3

#: The columns of a trace row, in order, with their types: "int", "float" or "str".
COLUMNS: tuple[tuple[str, str], ...] = (
    ("v", "int32"), ("run", "str"), ("pump", "str"), ("step", "int"), ("time", "float"),
    ("kind", "str"), ("broker", "str"), ("peer", "str"), ("port", "int"), ("link", "str"),
    ("dir", "str"), ("seq", "int"), ("size", "int"), ("outcome", "str"), ("reason", "str"),
    ("monotonic", "float"),
)

#: The column names, in order.
FIELDS = tuple(name for name, _ in COLUMNS)

#: The fields interned per context (everything but step, time, seq and size).
CONTEXT_FIELDS = ("kind", "broker", "peer", "port", "link", "dir", "outcome", "reason",
                  "monotonic")

FORMATS = ("jsonl", "parquet")


class Kind:
    """The event kinds, a row's ``kind`` (see the module for what each records)."""

    BIND = "bind"
    LISTEN = "listen"
    UNBIND = "unbind"
    CONNECT = "connect"
    ACCEPT = "accept"
    REFUSE = "refuse"
    WRITE = "write"
    READ = "read"
    SEND = "send"
    DELIVER = "deliver"
    PROTOCOL_ERROR = "protocol_error"
    DISCONNECT = "disconnect"
    CLOSE = "close"
    TIMER = "timer"
    TASK = "task"
    FAIL = "fail"
    CLOCK = "clock"
    EXPIRE = "expire"
    DROP = "drop"
    FAULT = "fault"


#: Every kind a trace may hold.
KINDS = frozenset(value for name, value in vars(Kind).items() if name.isupper())
#: One row per message: its send and its delivery.
MESSAGE_KINDS = (Kind.SEND, Kind.DELIVER)
#: How a link (or the task working it) ends.
END_KINDS = (Kind.DISCONNECT, Kind.CLOSE, Kind.FAIL, Kind.PROTOCOL_ERROR)
#: A link's life: it starts, then ends.
LIFE_KINDS = (Kind.CONNECT, Kind.ACCEPT, *END_KINDS)


class Outcome:
    """A row's ``outcome``: how a link ended (``disconnect``; the values of
    ``channels.CloseCause``), or that a ``write``/``read`` moved part of a frame."""

    CLEAN = "clean"
    ABORTED = "aborted"
    LOST = "lost"
    PROTOCOL_ERROR = "protocol error"
    PARTIAL = "partial"
    #: a ``refuse`` written by the accepting side of a link over TCP (the connecting
    #: side writes its own)
    INBOUND = "inbound"


class Violation:
    """What the replay finds wrong with a message on a link and direction."""

    DUPLICATE_SEND = "duplicate send"
    DUPLICATE_DELIVERY = "duplicate delivery"
    NEVER_SENT = "delivered but never sent"
    OUT_OF_ORDER = "out of order"
    SIZE_MISMATCH = "size mismatch"


#: The violations, in the order of the replay's tables.
VIOLATIONS = (Violation.DUPLICATE_SEND, Violation.DUPLICATE_DELIVERY, Violation.NEVER_SENT,
              Violation.OUT_OF_ORDER, Violation.SIZE_MISMATCH)


class Cause:
    """Why the replay says a sent message was never delivered."""

    #: a task of the link failed, or the link ended on an error
    PEER_FAILED = "peer failed"
    #: the link was closed (cleanly) with the message still in flight
    IN_FLIGHT = "link closed with it in flight"
    #: the link was still open when the trace ends
    RUN_ENDED = "run ended"

#: A context: the values of :data:`CONTEXT_FIELDS`, in order.
Context = tuple[str, str | None, str | None, int | None, str | None, str | None, str | None,
                str | None, float | None]


@dataclass(frozen=True, slots=True)
class TraceEvent:
    """One trace row, as an object (what :class:`~pump.ListSink` gives back)."""

    step: int
    time: float
    kind: str
    broker: str | None = None
    peer: str | None = None
    port: int | None = None
    link: str | None = None
    dir: str | None = None
    seq: int | None = None
    size: int | None = None
    outcome: str | None = None
    reason: str | None = None
    monotonic: float | None = None
    run: str = ""
    pump: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"v": SCHEMA_VERSION, **asdict(self)}


def arrow_schema() -> Any:
    """The trace schema as a pyarrow schema (needs pyarrow)."""
    import pyarrow as pa

    types = {"int32": pa.int32(), "int": pa.int64(), "float": pa.float64(),
             "str": pa.string()}
    return pa.schema([(name, types[kind]) for name, kind in COLUMNS],
                     metadata={b"rdvpump.schema_version": str(SCHEMA_VERSION).encode()})
