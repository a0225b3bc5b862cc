"""The replay of pump traces: :mod:`replay.analysis` checks and measures them, in this
process (:mod:`replay.local`) or on Spark (:mod:`replay.job`)."""

from .analysis import SCHEMA_VERSION as SCHEMA_VERSION
from .analysis import TraceError as TraceError
from .analysis import analyze as analyze
from .analysis import check_traces as check_traces
from .analysis import engine_for as engine_for
from .analysis import find_traces as find_traces
from .analysis import print_summary as print_summary
from .job import JVM_PROFILES as JVM_PROFILES
from .job import jvm_for as jvm_for
from .job import main as main
from .job import session as session

__all__ = ["JVM_PROFILES", "SCHEMA_VERSION", "TraceError", "analyze", "check_traces",
           "engine_for", "find_traces", "jvm_for", "main", "print_summary", "session"]
