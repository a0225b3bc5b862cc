"""The Spark job that replays pump traces: see :mod:`replay.job`."""

from .job import JVM_PROFILES as JVM_PROFILES
from .job import SCHEMA_VERSION as SCHEMA_VERSION
from .job import TraceError as TraceError
from .job import analyze as analyze
from .job import check_traces as check_traces
from .job import find_traces as find_traces
from .job import jvm_for as jvm_for
from .job import main as main
from .job import print_summary as print_summary
from .job import session as session

__all__ = ["JVM_PROFILES", "SCHEMA_VERSION", "TraceError", "analyze", "check_traces",
           "find_traces", "jvm_for", "main", "print_summary", "session"]
