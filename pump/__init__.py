"""The event pump: FIFO tasks, timers, virtual and real (trio) clocks, trace events."""

from ._pump import DEFAULT_SERVE_BATCH as DEFAULT_SERVE_BATCH
from ._pump import Owner as Owner
from ._pump import Pump as Pump
from ._pump import Timer as Timer
from ._trace import SCHEMA_VERSION as SCHEMA_VERSION
from ._trace import ListSink as ListSink
from ._trace import TraceEvent as TraceEvent
from ._trace import TraceSink as TraceSink

__all__ = [
    "DEFAULT_SERVE_BATCH",
    "SCHEMA_VERSION",
    "ListSink",
    "Owner",
    "Pump",
    "Timer",
    "TraceEvent",
    "TraceSink",
]
