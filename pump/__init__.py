"""The event pump: FIFO tasks, timers, virtual and real (trio) clocks, trace events."""

from ._pump import DEFAULT_SERVE_BATCH as DEFAULT_SERVE_BATCH
from ._pump import Owner as Owner
from ._pump import Pump as Pump
from ._pump import Timer as Timer
from ._trace import FIELDS as FIELDS
from ._trace import FORMATS as FORMATS
from ._trace import SCHEMA_VERSION as SCHEMA_VERSION
from ._trace import JsonlWriter as JsonlWriter
from ._trace import ListSink as ListSink
from ._trace import ParquetWriter as ParquetWriter
from ._trace import TraceEvent as TraceEvent
from ._trace import TraceRecorder as TraceRecorder
from ._trace import TraceSink as TraceSink
from ._trace import open_trace as open_trace

__all__ = [
    "DEFAULT_SERVE_BATCH",
    "FIELDS",
    "FORMATS",
    "SCHEMA_VERSION",
    "JsonlWriter",
    "ListSink",
    "Owner",
    "ParquetWriter",
    "Pump",
    "Timer",
    "TraceEvent",
    "TraceRecorder",
    "TraceSink",
    "open_trace",
]
