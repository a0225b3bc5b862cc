"""Replay at scale: a real pump trace of millions of events, checked by Spark and by plain Python.

The trace comes from a real run (one MessageQueue on one pump, tracing to
Parquet), so it has the shape of real traces.  The Spark job (replay/job.py,
local mode) and a single-process Python loop check the same invariants on the
same file in the same run: every delivered message was sent, FIFO per link and
direction, no duplicates.  Both report events per second.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from brokermgr import BrokerManager
from channels import MessageQueue, QueueFullError
from pump import Pump, open_trace


@dataclass
class ReplayResult:
    case: str
    events: int
    seconds: float
    events_per_s: float
    violations: int
    baseline: str
    baseline_seconds: float
    baseline_events_per_s: float
    baseline_violations: int
    ratio: float
    trace_mb: float

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("seconds", "events_per_s", "baseline_seconds", "baseline_events_per_s",
                  "trace_mb"):
            d[k] = round(d[k], 3)
        d["ratio"] = round(d["ratio"], 3)
        return d


def generate(directory: Path, messages: int, *, size: int = 64, links: int = 4) -> int:
    """Trace ``messages`` messages over ``links`` links into ``directory``; return the rows."""
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

    class Producer:
        def __init__(self) -> None:
            self.left = per_link

        def connected(self, queue: MessageQueue) -> None:
            self.queue = queue
            queue.set_listener(self)
            self.drained()

        def refused(self, reason: str) -> None:
            raise RuntimeError(reason)

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
        universe.add_broker(f"p{i}").connect("sink", 1, Producer())
    pump.run_until_idle()
    pump.close_trace()
    return recorder.rows_written


def check_in_python(directory: Path) -> tuple[int, int, float]:
    """The invariants in one Python process; return (events, violations, seconds)."""
    import pyarrow.parquet as pq

    start = time.perf_counter()
    events = violations = 0
    for path in sorted(directory.glob("*.parquet")):
        table = pq.read_table(path, columns=["run", "kind", "link", "dir", "seq", "step"])
        events += table.num_rows
        run, kind, link, dir_, seq, step = (table.column(c).to_pylist() for c in table.column_names)
        sent: set[tuple[Any, ...]] = set()
        delivered: list[tuple[int, int]] = []  # (step, row), sorted below: pump order
        for i, k in enumerate(kind):
            if k == "send":
                sent.add((run[i], link[i], dir_[i], seq[i]))
            elif k == "deliver":
                delivered.append((step[i], i))
        delivered.sort()
        seen: set[tuple[Any, ...]] = set()
        last: dict[tuple[Any, ...], int] = {}
        for _, i in delivered:
            key = (run[i], link[i], dir_[i], seq[i])
            if key in seen:
                violations += 1
            seen.add(key)
            if key not in sent:
                violations += 1
            stream = key[:3]
            if seq[i] < last.get(stream, -1):
                violations += 1
            last[stream] = seq[i]
    return events, violations, time.perf_counter() - start


def run(events: int = 10_000_000, *, master: str = "local[2]",
        progress: Callable[[str], None] | None = None) -> Iterator[ReplayResult]:
    from replay import analyze, session

    with tempfile.TemporaryDirectory(prefix="rdvpump-replay-bench-") as tmp:
        traces = Path(tmp) / "traces"
        if progress:
            progress(f"tracing a run of about {events:,} events ...")
        # a message is about 1.95 rows (send, deliver, plus batched write/read): aim above
        rows = generate(traces, max(1000, int(events / 1.9)))
        mb = sum(p.stat().st_size for p in traces.iterdir()) / 1e6
        if progress:
            progress(f"plain Python over {rows:,} events ...")
        py_events, py_violations, py_seconds = check_in_python(traces)
        if progress:
            progress(f"Spark {master} over {rows:,} events ...")
        spark = session(master, driver_memory="6g")
        try:
            start = time.perf_counter()
            summary = analyze(spark, str(traces))
            seconds = time.perf_counter() - start
        finally:
            spark.stop()
        assert summary["events"] == py_events == rows
        spark_rate = rows / seconds
        py_rate = py_events / py_seconds
        yield ReplayResult(f"replay-spark-{master}", rows, seconds, spark_rate,
                           summary["violation_count"], "plain-python-single-process",
                           py_seconds, py_rate, py_violations, spark_rate / py_rate, mb)
