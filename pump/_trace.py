"""Trace events: the one record every pump step and every semantic event is written as.

Recording to files is a separate layer; here is only the schema and in-memory sinks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

#: Bumped whenever a field is added, removed or changes meaning.
SCHEMA_VERSION = 1


@dataclass(frozen=True, slots=True)
class TraceEvent:
    """One thing that happened on a pump.

    ``step`` is the number of the pump task during which it happened (0 when
    outside any task), ``time`` the pump clock.  The remaining fields are set
    when they apply: ``broker`` is the side the event happened on, ``peer`` the
    other side, ``link`` the link id, ``seq`` the per-link per-direction message
    sequence number, ``size`` a byte count, ``reason`` a refusal or close reason.
    """

    step: int
    time: float
    kind: str
    broker: str | None = None
    peer: str | None = None
    port: int | None = None
    link: int | None = None
    seq: int | None = None
    size: int | None = None
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


TraceSink = Callable[[TraceEvent], None]


class ListSink:
    """A trace sink that keeps every event in a list (tests, small runs)."""

    def __init__(self) -> None:
        self.events: list[TraceEvent] = []

    def __call__(self, event: TraceEvent) -> None:
        self.events.append(event)

    def kinds(self) -> list[str]:
        return [e.kind for e in self.events]
