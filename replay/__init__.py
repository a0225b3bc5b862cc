"""The Spark job that replays pump traces: see :mod:`replay.job`."""

from .job import SCHEMA_VERSION as SCHEMA_VERSION
from .job import TraceError as TraceError
from .job import analyze as analyze
from .job import find_traces as find_traces
from .job import main as main
from .job import print_summary as print_summary
from .job import session as session

__all__ = ["SCHEMA_VERSION", "TraceError", "analyze", "find_traces", "main", "print_summary",
           "session"]
