"""The replay of pump traces: :mod:`replay.analysis` checks and measures them, in this
process (:mod:`replay.local`) or on Spark (:mod:`replay.job`)."""

from .analysis import analyze as analyze
from .job import main as main
from .jvm import JVM_PROFILES as JVM_PROFILES
from .jvm import SparkStartError as SparkStartError
from .jvm import ending as ending
from .jvm import jvm_for as jvm_for
from .jvm import start_spark as start_spark
from .jvm import stop_spark as stop_spark
from .output import print_summary as print_summary
from .sources import SCHEMA_VERSION as SCHEMA_VERSION
from .sources import TraceError as TraceError
from .sources import check_traces as check_traces
from .sources import engine_for as engine_for
from .sources import find_traces as find_traces

__all__ = ["JVM_PROFILES", "SCHEMA_VERSION", "SparkStartError", "TraceError", "analyze",
           "check_traces", "ending", "engine_for", "find_traces", "jvm_for", "main",
           "print_summary", "start_spark", "stop_spark"]
