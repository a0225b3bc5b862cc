"""The event pump: FIFO tasks, timers, a virtual clock (the core) and trio's (the driver),
and the trace: its schema, its recorder and its writers."""

from ._core import DEFAULT_SERVE_BATCH as DEFAULT_SERVE_BATCH
from ._core import Owner as Owner
from ._core import PumpCore as PumpCore
from ._core import Repeating as Repeating
from ._core import Timer as Timer
from ._errors import ConfigError as ConfigError
from ._errors import NeverIdleError as NeverIdleError
from ._errors import RdvpumpError as RdvpumpError
from ._errors import TraceWriteError as TraceWriteError
from ._future import Future as Future
from ._log import LOG_WINDOW as LOG_WINDOW
from ._log import CollapsingLog as CollapsingLog
from ._recorder import LinkTrace as LinkTrace
from ._recorder import ListSink as ListSink
from ._recorder import MessageLog as MessageLog
from ._recorder import TraceRecorder as TraceRecorder
from ._recorder import TraceWriter as TraceWriter
from ._trio import Pump as Pump
from ._writers import JsonlWriter as JsonlWriter
from ._writers import ParquetWriter as ParquetWriter
from ._writers import open_trace as open_trace
from .schema import FIELDS as FIELDS
from .schema import FORMATS as FORMATS
from .schema import SCHEMA_VERSION as SCHEMA_VERSION
from .schema import TraceEvent as TraceEvent

#: What ``Pump(trace=...)`` accepts.
TraceSink = TraceRecorder

__all__ = [
    "LOG_WINDOW",
    "CollapsingLog",
    "NeverIdleError",
    "DEFAULT_SERVE_BATCH",
    "FIELDS",
    "FORMATS",
    "Future",
    "SCHEMA_VERSION",
    "JsonlWriter",
    "LinkTrace",
    "ListSink",
    "MessageLog",
    "Owner",
    "ParquetWriter",
    "Pump",
    "PumpCore",
    "RdvpumpError",
    "ConfigError",
    "TraceWriteError",
    "Repeating",
    "Timer",
    "TraceEvent",
    "TraceRecorder",
    "TraceSink",
    "TraceWriter",
    "open_trace",
]
