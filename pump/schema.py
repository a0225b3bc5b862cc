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
pump started), and the name service's ``expire`` and ``drop``.

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
