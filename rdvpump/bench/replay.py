"""Replay at scale: a real pump trace of millions of events, replayed by Spark and by plain Python.

The trace comes from a real run (one universe, four links, 64 B messages, tracing to
Parquet), so it has the shape of real traces.  The Spark job (replay/job.py, local
mode, ``local[1]`` and ``local[2]``) and a single-process Python loop
(:func:`replay_in_python`) compute the same figures from the same file in the same
run: every invariant, undelivered messages with causes, latency percentiles per link,
throughput per broker and second, refusals and sizes; the run fails if they disagree.
Both report events per second.  Each Spark run has a process and a JVM of its own.

Beside each Spark run, the floor of a Spark SQL job on the same file and master, in a
fresh process and JVM like the job's: only the latency of each message, from one shuffle
by (run, link, dir, seq) and the first send and delivery times (:func:`latency_floor`).
A job in Spark SQL that pairs sends with deliveries does at least this.  The job itself
no longer runs in Spark SQL (its tasks work on Arrow tables in Python workers), so it
can be faster than this floor; the ratio says by how much it is slower or faster.

Cores: ``local[N]`` gives Spark N task slots, not N cores.  Unpinned, a ``local[1]`` run
also uses the machine's other cores: its JIT compiler and GC threads, and the JVM threads
that feed the Python worker while it works.  ``pin`` runs each ``local[N]`` on N CPUs
only (its process, JVM and Python workers), so that ``local[1]`` against ``local[2]``
measures scaling with cores.  Each result says how many CPUs its JVM could run on
(``cpus``).
"""

from __future__ import annotations

import multiprocessing
import os
import re
import select
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from brokermgr import BrokerManager
from channels import MessageQueue, QueueFullError
from pump import ConfigError, Pump, TraceRecorder, open_trace
from pump.schema import Kind

from .._errors import RunError


@dataclass
class ReplayResult:
    case: str
    events: int
    seconds: float
    events_per_s: float
    violations: int | None  # None: not looked for (the floor)
    baseline: str
    baseline_seconds: float
    baseline_events_per_s: float
    baseline_violations: int
    ratio: float
    trace_mb: float
    cpus: int  # the CPUs the Spark run's JVM could run on (fewer than the machine's: pinned)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("seconds", "events_per_s", "baseline_seconds", "baseline_events_per_s",
                  "trace_mb"):
            d[k] = round(d[k], 3)
        d["ratio"] = round(d["ratio"], 3)
        return d


def generate(directory: Path, messages: int, *, size: int = 64, links: int = 4,
             recorder: TraceRecorder | None = None) -> int:
    """Trace ``messages`` messages over ``links`` links into ``directory`` (Parquet), or
    into ``recorder``; return the rows."""
    if recorder is None:
        recorder = open_trace(directory, pump="gen", run="scale", format="parquet")
    pump = Pump(trace=recorder, name="gen")
    universe = BrokerManager("scale", pump=pump, ring_capacity=1 << 18)
    sink = universe.add_broker("sink")
    per_link = messages // links
    msg = b"x" * size

    class Accept:
        def accepted(self, queue: MessageQueue) -> None:
            queue.set_listener(Drop())

    class Drop:
        def received(self, message: bytes) -> None:
            pass

        def closed(self, reason: str) -> None:
            pass

    class Flooder:
        def __init__(self) -> None:
            self.left = per_link

        def connected(self, queue: MessageQueue) -> None:
            self.queue = queue
            queue.set_listener(self)
            self.drained()

        def refused(self, reason: str) -> None:
            raise RunError(reason)

        def drained(self) -> None:
            send = self.queue.send
            while self.left:
                try:
                    send(msg)
                except QueueFullError:
                    return
                self.left -= 1

        def received(self, message: bytes) -> None:
            pass

        def closed(self, reason: str) -> None:
            pass

    sink.listen(1, Accept())
    for i in range(links):
        universe.add_broker(f"p{i}").connect("sink", 1, Flooder())
    pump.run_until_idle()
    pump.close_trace()
    return recorder.rows_written


def replay_in_python(directory: Path) -> tuple[dict[str, Any], float]:
    """The replay's figures from one Python process (:func:`replay.reference.figures`,
    the executable specification): the baseline.  Returns (figures, seconds)."""
    from replay.reference import figures

    start = time.perf_counter()
    found = figures(directory)
    return found, time.perf_counter() - start


def latency_floor(spark: Any, traces: str) -> int:
    """The least a Spark job that pairs sends with deliveries does: one shuffle by (run,
    link, dir, seq), each message's first send and first delivery time, their difference
    counted.  Returns the messages with a latency."""
    from pyspark.sql import functions as F

    from replay.spark import MESSAGE_KINDS, load

    events, _ = load(spark, traces)
    send, at = F.col("kind") == Kind.SEND, F.col("time")
    latency = F.min(F.when(~send, at)) - F.min(F.when(send, at))
    per_message = (events.where(~F.col("bad") & F.col("kind").isin(*MESSAGE_KINDS))
                   .groupBy("run", "link", "dir", "seq").agg(latency.alias("latency")))
    row = per_message.agg(F.count("latency").alias("n")).first()
    return int(row["n"])


def _timed_in_a_fresh_jvm(master: str, jvm: str, work: str, traces: str,
                          out: str | None = None, *, warm: bool = False,
                          cpus: set[int] | None = None) -> tuple[Any, float, int]:
    """``work`` ("job": :func:`replay.analyze` into ``out``; "floor":
    :func:`latency_floor`) on ``traces``, in a new process with a new JVM (started
    first, not timed): its result and its seconds.  ``warm``: the same work once
    before, not timed, so that the timed run finds Spark's classes loaded and its code
    compiled by the JIT.  ``cpus``: the process (its JVM and Python workers with it) runs
    on these CPUs only.  Also returns how many CPUs the JVM could run on.

    A process of its own, because pyspark keeps its JVM for the life of the Python
    process: a second SparkSession there runs in the first one's JVM, its classes
    loaded and its code compiled, and would be timed warm.

    The child ignores SIGINT: on Ctrl-C this process stops it (its JVM ends with it),
    so an interrupted run leaves neither processes nor Spark's tracebacks behind.  The
    JVM's own output (its start-up lines, and what Spark logs when it is stopped in the
    middle of starting) goes to a file of the child's, whose end a failed run's error
    quotes.
    """
    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_in_this_process,
                            args=(send, master, jvm, work, traces, out, warm, cpus))
    child.start()
    send.close()
    try:
        failed, outcome = receive.recv()
    except EOFError:
        failed, outcome = True, None
    finally:
        receive.close()
        if child.is_alive():  # interrupted: the child ignores SIGINT, so stop it
            jvms = _children(child.pid) if child.pid is not None else []
            child.terminate()
            child.join()
            # its JVM exits once its parent is gone: wait, so that it is not still
            # reading the traces when they are deleted
            _wait_gone(jvms, timeout=10.0)
        child.join()
    if failed:
        raise RunError(outcome or f"the Spark run ({work}, {master}) ended without a "
                                      f"result (exit code {child.exitcode})")
    result: tuple[Any, float, int] = outcome
    return result


def _children(pid: int) -> list[int]:
    """The processes ``pid`` started (Linux's /proc; none where it cannot say)."""
    found: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(p) for p in f.read().split()]
    except OSError:
        pass
    return found


def _wait_gone(pids: list[int], *, timeout: float) -> None:
    """Wait up to ``timeout`` seconds for each process to exit; kill those that do not."""
    deadline = time.monotonic() + timeout
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except OSError:  # gone already
            continue
        try:
            if not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
                os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
        finally:
            os.close(fd)


def _in_this_process(send: Any, master: str, jvm: str, work: str, traces: str,
                     out: str | None, warm: bool, cpus: set[int] | None) -> None:
    """The child of :func:`_timed_in_a_fresh_jvm`: sends back (False, (result, seconds,
    the JVM's CPUs)) or (True, why it failed)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from replay import SparkStartError, analyze, ending, start_spark
    from replay.jvm import failure, from_spark

    with tempfile.TemporaryFile() as log:  # the JVM's stdout and stderr: it inherits both
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            if cpus is not None:  # before the JVM starts: it and its Python workers inherit it
                os.sched_setaffinity(0, cpus)
            spark = start_spark(master, jvm=jvm, driver_memory="6g")
            seen = _jvm_cpus()
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # pyspark sets its own handler
            with ending(spark):
                for _ in range(2 if warm else 1):  # the last pass is the one timed
                    start = time.perf_counter()
                    result = analyze(traces, out, spark=spark) if work == "job" \
                        else latency_floor(spark, traces)
                    seconds = time.perf_counter() - start
        except Exception as exc:  # noqa: BLE001 - handed to the parent, which raises it
            log.seek(0)
            output = log.read().decode(errors="replace")
            # one line: why, as the JVM or Spark said it (a worker's Python error too)
            why = (failure(exc, output) if isinstance(exc, SparkStartError) or from_spark(exc)
                   else f"{type(exc).__name__}: {exc}")
            send.send((True, f"the Spark run ({work}, {master}) failed: {why}"))
        else:
            send.send((False, (result, seconds, seen)))
        finally:
            send.close()


def _jvm_cpus() -> int:
    """How many CPUs the JVM this process started may run on (the kernel's affinity of
    the ``java`` child; this process's own when there is none)."""
    for pid in _children(os.getpid()):
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() == "java":
                    return len(os.sched_getaffinity(pid))
        except OSError:
            continue
    return len(os.sched_getaffinity(0))


#: The masters Spark parses (``SparkContext``'s forms, the cluster managers it ships
#: with by name); Spark checks the rest (a thread count, a host, a port) once it starts.
_MASTER = re.compile(r"local(\[(\d+|\*)(\s*,\s*\d+)?\])?|local-cluster\[.*\]|spark://.*"
                     r"|yarn|k8s://.*")


def check_master(master: str) -> None:
    """A ConfigError for a master Spark would not parse, before a trace is generated for
    it (minutes at the default size) rather than after."""
    if _MASTER.fullmatch(master) is None:
        raise ConfigError(f"{master!r} is no Spark master: local, local[N], local[*], "
                          "local[N,F], local-cluster[...], spark://HOST:PORT, yarn or "
                          "k8s://...")


def pinned_cpus(master: str) -> set[int]:
    """The CPUs a pinned run on ``master`` (``local[N]``) gets: the first N this process
    may use.  A ValueError for another master, or for more CPUs than there are."""
    match = re.fullmatch(r"local\[(\d+)\]", master)
    if match is None:
        raise ConfigError(f"pinning needs local[N] masters, got {master!r}")
    n, mine = int(match.group(1)), sorted(os.sched_getaffinity(0))
    if not 1 <= n <= len(mine):
        raise ConfigError(f"cannot pin {master} to {n} CPUs: this process may use "
                         f"{len(mine)}")
    return set(mine[:n])


def run(events: int = 10_000_000, *, masters: tuple[str, ...] = ("local[1]", "local[2]"),
        jvm: str = "production", floor: bool = True, warm: bool = False, pin: bool = False,
        progress: Callable[[str], None] | None = None) -> Iterator[ReplayResult]:
    """One trace, the Python baseline once, then the Spark job on each master in turn,
    each followed by the floor on that master (``floor``), each in a fresh process and
    JVM; ``warm``: each timed on its second run in its JVM (cases named ``-warm``);
    ``pin``: each ``local[N]`` on N CPUs (:func:`pinned_cpus`; cases named ``-pinned``)."""
    tag = ("-warm" if warm else "") + ("-pinned" if pin else "")
    cpus = {master: pinned_cpus(master) if pin else None for master in masters}

    with tempfile.TemporaryDirectory(prefix="rdvpump-replay-bench-") as tmp:
        traces = Path(tmp) / "traces"
        if progress:
            progress(f"tracing a run of about {events:,} events ...")
        # a message is about 1.95 rows (send, deliver, plus batched write/read): aim above
        rows = generate(traces, max(1000, int(events / 1.9)))
        mb = sum(p.stat().st_size for p in traces.iterdir()) / 1e6
        if progress:
            progress(f"plain Python over {rows:,} events ...")
        figures, py_seconds = replay_in_python(traces)
        py_rate = figures["events"] / py_seconds
        for master in masters:
            if progress:
                progress(f"Spark {master} over {rows:,} events ...")
            summary, seconds, seen = _timed_in_a_fresh_jvm(
                master, jvm, "job", str(traces), str(Path(tmp) / "out"), warm=warm,
                cpus=cpus[master])
            same = (summary["events"] == figures["events"] == rows
                    and summary["violation_count"] == figures["violations"]
                    and summary["messages_matched"] == figures["matched"]
                    and summary["undelivered_by_cause"] == figures["undelivered_by_cause"]
                    and summary["events_by_kind"] == dict(sorted(
                        figures["events_by_kind"].items())))
            if not same:
                raise RunError(f"Spark and the Python baseline disagree on {traces}")
            spark_rate = rows / seconds
            yield ReplayResult(f"replay-spark-{master}{tag}", rows, seconds, spark_rate,
                               summary["violation_count"], "python-same-outputs",
                               py_seconds, py_rate, figures["violations"],
                               spark_rate / py_rate, mb, seen)
            if not floor:
                continue
            if progress:
                progress(f"the floor: one shuffle for each message's latency, {master} ...")
            paired, floor_seconds, seen = _timed_in_a_fresh_jvm(
                master, jvm, "floor", str(traces), warm=warm, cpus=cpus[master])
            if paired != summary["messages_matched"]:
                raise RunError(f"the floor paired {paired} messages, the job "
                                   f"{summary['messages_matched']}")
            floor_rate = rows / floor_seconds
            yield ReplayResult(f"replay-floor-{master}{tag}", rows, floor_seconds, floor_rate,
                               None, f"replay-spark-{master}{tag}", seconds, spark_rate,
                               summary["violation_count"], floor_rate / spark_rate, mb, seen)
