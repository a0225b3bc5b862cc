"""What the replay writes: ``summary.json``, the Parquet tables and the plots of an
analysis, and its summary on the terminal.

Tables: ``links``, ``violations``, ``undelivered`` (unless the engine wrote these two
itself), ``latency``, ``throughput``, ``refusals``, ``sizes``, ``latency_histogram``, a
directory each with one Parquet file, as Spark writes them.  Plots: ``throughput.png``,
``latency.png`` and ``links.png`` (:mod:`replay.plots`).
"""

from __future__ import annotations

import math
import shutil
import sys
from pathlib import Path
from typing import Any

from replay import fold as _fold
from replay import plots as _plots
from replay.census import Census
from replay.measure import BUCKETS_PER_DECADE, SUMMARY_LIMIT
from replay.sources import SCHEMA_VERSION, find_traces


def _counted(census: Census, found: dict[str, Any]
             ) -> tuple[dict[str, int], dict[str, Any], dict[str, int], int]:
    """Messages sent, delivered and matched on the user's links and on the name
    service's; undelivered ones by cause; those whose link crossed pumps."""
    by_cause: dict[str, int] = {}
    across = 0
    mine = {"sent": 0, "delivered": 0, "matched": 0}
    service = {"links": len(census.service_links), "messages_sent": 0,
               "messages_delivered": 0, "undelivered": 0,
               "refusals": dict(sorted(census.service_refusals.items()))}
    for (run, link, _), stream in census.streams.items():
        if (run, link) in census.service_links:
            service["messages_sent"] += stream["sent"]
            service["messages_delivered"] += stream["delivered"]
        else:
            mine["sent"] += stream["sent"]
            mine["delivered"] += stream["delivered"]
    for r in found["streams"]:
        key = (r["run"], r["link"], r["dir"])
        if (r["run"], r["link"]) in census.service_links:
            service["undelivered"] += r["undelivered"]
            continue
        mine["matched"] += r["messages"]
        if r["undelivered"]:
            cause = census.cause(r["run"], r["link"])[0]
            by_cause[cause] = by_cause.get(cause, 0) + r["undelivered"]
        if census.crosses_pumps(key):
            across += r["messages"]
    return mine, service, by_cause, across


def summarize(traces: str, census: Census, corrupt: list[dict[str, Any]],
             found: dict[str, Any]) -> dict[str, Any]:
    """The summary (``summary.json``): what the traces held, and every figure over the
    user's links, the name service's apart."""
    overall = found["overall"]
    by_type = {name: sum(r[name] for r in found["streams"]) for name in _fold.VIOLATIONS}
    mine, service, by_cause, across = _counted(census, found)
    return {
        "schema_version": SCHEMA_VERSION,
        "traces": traces,
        "files": sum(map(len, find_traces(traces))),
        "pumps": census.pumps,
        "runs": census.runs,
        "events": sum(census.kinds.values()),
        "events_by_kind": dict(sorted(census.kinds.items())),
        "corrupt_lines": corrupt[:SUMMARY_LIMIT],
        "corrupt_line_count": census.corrupt,
        "links": len(census.links) - len(census.service_links),
        "messages_sent": mine["sent"],
        "messages_delivered": mine["delivered"],
        "messages_matched": mine["matched"],
        "messages_across_pumps": across,
        "violation_count": found["violation_count"],
        "violations_by_type": {k: v for k, v in by_type.items() if v},
        "violations": found["violations"][:SUMMARY_LIMIT],
        "undelivered_count": sum(by_cause.values()),
        "undelivered_by_cause": dict(sorted(by_cause.items())),
        "undelivered": [u for u in found["undelivered"] if not u["service"]][:SUMMARY_LIMIT],
        "latency_s": _latency(overall),
        # over several runs, each on its own time axis, a rate of them all means nothing
        "delivered_per_s": _rate(overall) if len(census.run_durations) < 2 else None,
        "by_run": {str(run): {"clock": census.run_clocks[run],
                              "duration_s": census.run_durations[run],
                              "messages_matched": found["runs"][run]["n"],
                              "latency_s": _latency(found["runs"][run]),
                              "delivered_per_s": _rate(found["runs"][run])}
                   for run in sorted(census.run_durations, key=str)},
        "refusals": dict(sorted(census.refusals.items())),
        "name_service": service,
        "message_size": census.sent_sizes,
        "duration_s": census.duration,
        "bin_width_s": found["bin_width"],
    }


def _latency(found: dict[str, Any]) -> dict[str, Any] | None:
    """The percentiles and max of an overall row of :func:`replay.measure.measure`."""
    if not found["n"]:
        return None
    return {"p50": found["q"][0], "p90": found["q"][1], "p99": found["q"][2],
            "max": found["max"]}


def _rate(found: dict[str, Any]) -> float | None:
    """Messages delivered per second between the first and the last delivery."""
    n = found["n"]
    return n / (found["last"] - found["first"]) if n and found["last"] > found["first"] \
        else None


def tables_of(census: Census, found: dict[str, Any]) -> dict[str, Any]:
    """The output tables the driver writes, as pyarrow tables."""
    import pyarrow as pa

    def table(rows: list[dict[str, Any]], schema: str) -> Any:
        fields = [f.split(":") for f in schema.split()]
        types = {"s": pa.string(), "i": pa.int64(), "f": pa.float64(), "b": pa.bool_(),
                 "ls": pa.list_(pa.string())}
        arrow = pa.schema([(name, types[t]) for name, t in fields])
        return pa.Table.from_pylist(rows, schema=arrow)

    links = [{"run": run, "link": link, "service": (run, link) in census.service_links,
              **{k: sorted(v) if isinstance(v, set) else v for k, v in life.items()}}
             for (run, link), life in sorted(census.links.items())]
    latency = []
    for r in sorted(found["streams"], key=lambda r: (r["run"], r["link"], r["dir"])):
        s = census.streams.get((r["run"], r["link"], r["dir"]), {})
        q = r["q"] or [None, None, None]
        latency.append({"run": r["run"], "link": r["link"], "dir": r["dir"],
                        "sender": s.get("sender"), "receiver": s.get("receiver"),
                        "messages": r["messages"], "p50": q[0], "p90": q[1], "p99": q[2],
                        "max": r["max"]})
    tables = {
        "links": table(links, "run:s link:s service:b connected_at:f accepted_at:f acceptor:s "
                              "connector:s port:i "
                              "sent_ca:i sent_ac:i delivered:i bytes_delivered:i "
                              "disconnected_at:f disconnect_reason:s close_reasons:ls "
                              "ended_at:f end_reason:s failed:b pumps:ls"),
        "latency": table(latency, "run:s link:s dir:s sender:s receiver:s messages:i p50:f "
                                  "p90:f p99:f max:f"),
        "throughput": table(_per_second(census, found),
                            "run:s broker:s second:i messages:i bytes:i"),
        "refusals": table([{"reason": k, "count": v} for k, v in census.refusals.items()],
                          "reason:s count:i"),
        "sizes": table(_sizes(found), "bucket:i messages:i bytes:i"),
        "latency_histogram": table(_latency_histogram(found), "low_s:f high_s:f messages:i"),
    }
    if not found["violations_frame"]:
        tables["violations"] = table(found["violations"],
                                     "run:s link:s dir:s seq:i violation:s detail:s")
    if not found["undelivered_frame"]:
        tables["undelivered"] = table(found["undelivered"],
                                      "run:s link:s dir:s seq:i sender:s sent_at:f size:i "
                                      "cause:s end_reason:s service:b")
    return tables


def _per_second(census: Census, found: dict[str, Any]) -> list[dict[str, Any]]:
    """Messages and bytes delivered per receiving broker and second of the run."""
    width = found["bin_width"]
    rows, per = (found["bins"], round(1 / width)) if found["per_second"] is None \
        else (found["per_second"], 1)
    sums: dict[tuple[str, str, int], list[int]] = {}
    for r in rows:
        receiver = census.streams.get((r["run"], r["link"], r["dir"]), {}).get("receiver")
        cell = sums.setdefault((r["run"], receiver or "?", r["bin"] // per), [0, 0])
        cell[0] += r["messages"]
        cell[1] += r["bytes"] or 0
    return [{"run": run, "broker": broker, "second": second, "messages": m, "bytes": b}
            for (run, broker, second), (m, b) in sorted(sums.items())]


def _sizes(found: dict[str, Any]) -> list[dict[str, Any]]:
    sums: dict[int, list[int]] = {}
    for r in found["histogram"]:
        if r["messages"]:
            cell = sums.setdefault(r["size_bucket"], [0, 0])
            cell[0] += r["messages"]
            cell[1] += r["bytes"] or 0
    return [{"bucket": k, "messages": m, "bytes": b} for k, (m, b) in sorted(sums.items())]


def _latency_histogram(found: dict[str, Any]) -> list[dict[str, Any]]:
    counts: dict[int, int] = {}
    for r in found["histogram"]:
        if r["journeys"]:
            counts[r["latency_bucket"]] = counts.get(r["latency_bucket"], 0) + r["journeys"]
    return [{"low_s": 10 ** (b / BUCKETS_PER_DECADE), "high_s": 10 ** ((b + 1)
                                                                    / BUCKETS_PER_DECADE),
             "messages": n} for b, n in sorted(counts.items())]


def write(target: Path, census: Census, found: dict[str, Any],
           summary: dict[str, Any]) -> None:
    """The tables (Parquet, a directory each, as Spark writes them) and the plots."""
    import pyarrow.parquet as pq

    target.mkdir(parents=True, exist_ok=True)
    tables = tables_of(census, found)
    for name, table in tables.items():
        folder = target / name
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir()
        pq.write_table(table, folder / "part-00000.parquet")
    several = len(census.runs) > 1
    title = ("runs " + ", ".join(census.runs) + ", each from its start") if several \
        else "run " + ", ".join(census.runs)
    width = found["bin_width"]
    per_broker: dict[str, dict[int, int]] = {}
    per_link: dict[tuple[str, str], dict[int, int]] = {}
    for r in found["bins"]:
        receiver = census.streams.get((r["run"], r["link"], r["dir"]), {}).get("receiver")
        cells = per_link.setdefault((r["run"], r["link"]), {})
        cells[r["bin"]] = cells.get(r["bin"], 0) + r["messages"]
        if (r["run"], r["link"]) in census.service_links:
            continue  # the name service's own messages: not the brokers' throughput
        name = f"{r['run']}:{receiver or '?'}" if several else receiver or "?"
        series = per_broker.setdefault(name, {})
        series[r["bin"]] = series.get(r["bin"], 0) + r["messages"]
    _plots.throughput(target / "throughput.png", per_broker, width=width,
                      bins=math.ceil(census.duration / width) + 1,
                      duration=census.duration, title=title)
    _plots.latency(target / "latency.png", _latency_histogram(found),
                   summary["latency_s"], least=_fold.LEAST_LATENCY_S, title=title)
    lives = [{"link": f"{run}:{link}" if several else f"{link}",
              "start": None if life["accepted_at"] is None
              else life["accepted_at"] - census.start,
              "end": None if life["ended_at"] is None else life["ended_at"] - census.start,
              "connect": None if life["connected_at"] is None
              else life["connected_at"] - census.start,
              "bins": per_link.get((run, link), {})}
             for (run, link), life in census.links.items()
             if (run, link) not in census.service_links]  # the name service's: not shown
    _plots.timeline(target / "links.png", lives, width=width, duration=census.duration,
                    title=title)


def _percentiles(latency: dict[str, Any], keys: tuple[str, ...]) -> str:
    return " / ".join("-" if latency.get(k) is None else f"{latency[k] * 1e6:,.1f} us"
                      for k in keys)


def print_summary(summary: dict[str, Any]) -> None:
    """The summary on the terminal: a rich table when rich is there, else plain lines."""
    lat = summary["latency_s"] or {}
    runs = summary["by_run"]
    # a virtual clock's latencies (simulated time: 0 between the steps of one instant) and
    # a real clock's do not make one distribution: each run's are shown on its own line
    mixed = len({run["clock"] for run in runs.values()}) > 1
    rows = [
        ("trace files / pumps", f"{summary['files']} / {len(summary['pumps'])}"),
        ("events", f"{summary['events']:,}"),
        ("links", f"{summary['links']:,}"),
        ("messages sent / delivered", f"{summary['messages_sent']:,} / "
                                      f"{summary['messages_delivered']:,}"),
        ("delivered in another pump", f"{summary['messages_across_pumps']:,}"),
        ("violations", f"{summary['violation_count']:,}"),
        ("undelivered", ", ".join(f"{k}: {v:,}" for k, v in
                                  summary["undelivered_by_cause"].items()) or "0"),
        ("latency p50 / p90 / p99 / max" + (
            " (runs on virtual and real clocks: see each run)" if mixed
            else " (all runs)" if len(runs) > 1 else ""),
         "-" if mixed else _percentiles(lat, ("p50", "p90", "p99", "max"))),
        ("refusals", ", ".join(f"{k}: {v}" for k, v in summary["refusals"].items()) or "0"),
        *([("name service (apart from the above)",
            f"{ns['links']} links, {ns['messages_sent']:,} messages sent, "
            f"{ns['undelivered']} undelivered")] if (ns := summary["name_service"])["links"]
          else []),
        ("corrupt lines", str(summary["corrupt_line_count"])),
    ]
    if len(runs) > 1:  # each on its own time axis: say which, and each one's figures
        rows[1:1] = [(f"run {name} ({run['clock']} clock, {run['duration_s']:,.3f} s)",
                      f"{run['messages_matched']:,} delivered, p50 / p99 "
                      + _percentiles(run["latency_s"] or {}, ("p50", "p99")))
                     for name, run in runs.items()]
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        for k, v in rows:
            print(f"{k}: {v}")
    else:
        table = Table(title=f"replay of {summary['traces']}")
        table.add_column("what")
        table.add_column("value", justify="right")
        for k, v in rows:
            style = "red" if k == "violations" and summary["violation_count"] else None
            table.add_row(k, v, style=style)
        Console().print(table)
    for v in summary["violations"][:10]:
        print(f"violation: {v['violation']} link {v['link']} dir {v['dir']} seq {v['seq']}: "
              f"{v['detail']}")
    for c in summary["corrupt_lines"][:10]:
        print(f"corrupt line {c['file']}:{c['line']}: {c['text'][:80]}", file=sys.stderr)
