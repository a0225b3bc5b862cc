"""rdvpump bench: benchmarks beside the libraries users would pick instead."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.table import Table

from ._bench_common import BATCH_MIN, parse_sizes, show, show_times, smoke_fraction
from ._common import check_format, err, fail, guard, interruptible, out, show_table

app = typer.Typer(rich_markup_mode=None,
                  help="Benchmarks against the libraries users would pick instead. "
                       "RDVPUMP_BENCH_SCALE=F (0 < F <= 1) runs each at that fraction "
                       "of its work, once: a smoke run, whose figures are not comparable.",
                  no_args_is_help=True)
@app.command("inproc")
def bench_inproc(
    json_out: Annotated[bool, typer.Option("--json", help="JSON lines on stdout.")] = False,
    sizes: Annotated[str, typer.Option(help="Message sizes, comma-separated.")] = "64,1024,65536",
    scale: Annotated[float, typer.Option(help="Multiply the message counts.")] = 1.0,
    repeat: Annotated[int, typer.Option(help="Runs per figure; the best is kept.")] = 5,
    trace: Annotated[str | None, typer.Option(
        help="Record a trace (jsonl or parquet, written to a temporary file, or memory); "
             "compare against the untraced run.")] = None,
) -> None:
    """MessageQueue throughput on one pump beside trio memory channels and pyzmq inproc."""
    from ..bench import inproc

    if (smoke := smoke_fraction()) < 1:
        scale, repeat = scale * smoke, 1
    size_list = guard(lambda: parse_sizes(sizes, scale, repeat))
    if trace is not None:
        guard(lambda: check_format(trace, "--trace", ("memory",)))
    results = []
    with err.status("benchmarking ...") as status:
        for r in interruptible(lambda: list(inproc.run(size_list, scale=scale, repeat=repeat,
                                                trace=trace, progress=status.update))):
            results.append(r)
    show(results, json_out, f"rdvpump bench inproc (best of {repeat})",
          ("case", "size", "msgs/s", "MB/s", "baseline", "baseline msgs/s", "ratio"),
          lambda r: [r.case, str(r.size), f"{r.msgs_per_s:,.0f}", f"{r.mb_per_s:,.1f}",
                     r.baseline, f"{r.baseline_msgs_per_s:,.0f}", f"{r.ratio:.2f}x"])


@app.command("replay")
def bench_replay(
    json_out: Annotated[bool, typer.Option("--json", help="JSON lines on stdout.")] = False,
    events: Annotated[int, typer.Option(
        min=1, help="Events in the generated trace (about as many: whole runs of a "
                    "workload of at least 1,000 messages).")] = 10_000_000,
    master: Annotated[list[str] | None, typer.Option(
        help="Spark master, once per run (default: local[1], then local[2]).")] = None,
    jvm: Annotated[str, typer.Option(help="JVM profile: production or quick.")] =
        "production",
    floor: Annotated[bool, typer.Option(
        help="After each Spark run, time the least job that pairs sends with deliveries "
             "(each message's latency, one shuffle) on the same master.")] = True,
    warm: Annotated[bool, typer.Option(
        help="Time each Spark run on its second pass in its JVM (JIT warm), not its "
             "first.")] = False,
    pin: Annotated[bool, typer.Option(
        help="Run each local[N] master on N CPUs only, so that local[1] measures one core "
             "(unpinned, its JIT, GC and Arrow threads use the others).")] = False,
) -> None:
    """The replay job on a real trace of EVENTS events, beside plain Python computing the
    same figures from the same file."""
    from ..bench import replay

    masters = tuple(master or ("local[1]", "local[2]"))
    if (smoke := smoke_fraction()) < 1:  # the first master only, no floor, the quickest JVM
        events, floor, jvm = max(10_000, int(events * smoke)), False, "quick"
        masters = masters[:1]
    for m in masters:
        guard(lambda m=m: replay.check_master(m))  # type: ignore[misc]
    if pin:
        guard(lambda: [replay.pinned_cpus(m) for m in masters])
    with err.status("benchmarking the replay ...") as status:
        results = interruptible(lambda: list(replay.run(events, masters=masters, jvm=jvm,
                                                 floor=floor, warm=warm, pin=pin,
                                                 progress=status.update)))
    show(results, json_out, "rdvpump bench replay",
          ("case", "events", "CPUs", "seconds", "events/s", "baseline", "baseline events/s",
           "ratio"),
          lambda r: [r.case, f"{r.events:,}", str(r.cpus), f"{r.seconds:.1f}",
                     f"{r.events_per_s:,.0f}",
                     r.baseline, f"{r.baseline_events_per_s:,.0f}", f"{r.ratio:.2f}x"])


@app.command("routes")
def bench_routes(
    json_out: Annotated[bool, typer.Option("--json", help="JSON lines on stdout.")] = False,
    servers: Annotated[int, typer.Option(min=1, help="Servers in the route table.")] = 1000,
    topics: Annotated[int, typer.Option(min=1, help="Topics per server.")] = 100,
    ops: Annotated[int, typer.Option(min=1, help="Incremental updates timed.")] = 2000,
    subscribers: Annotated[int, typer.Option(
        min=1, help="Route clients a server's change must reach (the last cases).")] = 10,
) -> None:
    """Route-table update cost (incremental vs full rebuild) and crash propagation time."""
    from ..bench import routes as bench_routes_mod

    churn_seconds = 1000.0
    if (smoke := smoke_fraction()) < 1:
        servers, ops = max(10, int(servers * smoke)), max(10, int(ops * smoke))
        churn_seconds = max(10.0, churn_seconds * smoke)

    with err.status("benchmarking route tables ...") as status:
        results = interruptible(lambda: list(bench_routes_mod.run(
            servers, topics, ops=ops, churn_seconds=churn_seconds, subscribers=subscribers,
            progress=status.update)))
    show(results, json_out, "rdvpump bench routes",
          ("case", "servers x topics", "value", "baseline", "baseline value", "ratio"),
          lambda r: [r.case, f"{r.servers} x {r.topics}", f"{r.value:.6g} {r.unit}",
                     r.baseline, f"{r.baseline_value:.6g} {r.unit}",
                     "n/a" if r.ratio is None else f"{r.ratio:.2f}x"])


@app.command("fanout")
def bench_fanout(
    json_out: Annotated[bool, typer.Option("--json", help="JSON lines on stdout.")] = False,
    sinks: Annotated[str, typer.Option(help="Sink counts (Q), comma-separated.")] = "1,4,16",
    messages: Annotated[int, typer.Option(min=1, help="Messages from the faucet.")] = 100_000,
    size: Annotated[int, typer.Option(min=0, help="Message size in bytes.")] = 1000,
    repeat: Annotated[int, typer.Option(min=1, help="Runs per figure; the best is kept.")] = 3,
) -> None:
    """One faucet switching every message into Q sinks: the universe workload and the
    listener API, beside OpenAMQ's published 25,000 msg/s per broker."""
    from ..bench import fanout

    if (smoke := smoke_fraction()) < 1:
        messages, repeat = max(100, int(messages * smoke)), 1

    try:
        counts = [int(q) for q in sinks.split(",") if q.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise fail(f"--sinks must be positive integers separated by commas, got {sinks!r}")
    with err.status("benchmarking fanout ...") as status:
        results = interruptible(lambda: list(fanout.run(
            tuple(counts), messages=messages, size=size, repeat=repeat,
            progress=status.update)))
    show(results, json_out, f"rdvpump bench fanout ({messages:,} messages of {size} B, "
          f"best of {repeat})",
          ("case", "Q", "seconds", "deliveries/s", "baseline", "baseline deliveries/s",
           "ratio"),
          lambda r: [r.case, str(r.sinks), f"{r.seconds:.3f}", f"{r.deliveries_per_s:,.0f}",
                     r.baseline, f"{r.baseline_deliveries_per_s:,.0f}", f"{r.ratio:.2f}x"])


@app.command("sim")
def bench_sim(
    json_out: Annotated[bool, typer.Option("--json", help="JSON lines on stdout.")] = False,
    brokers: Annotated[int, typer.Option(min=2, help="Brokers (a fifth are servers).")] = 100,
    links: Annotated[int, typer.Option(min=1, help="Links, spread over the brokers.")] = 1000,
    interval: Annotated[float, typer.Option(
        min=0.0001, help="Seconds between two messages of a link.")] = 0.1,
    duration: Annotated[float, typer.Option(
        min=0.01, help="Seconds of pump time the links send for.")] = 5.0,
) -> None:
    """Simulated pump steps and messages per second of wall time on the virtual clock,
    beside the same universe served on trio's real clock."""
    from ..bench import sim

    if (smoke := smoke_fraction()) < 1:
        links, duration = max(10, int(links * smoke)), max(0.01, duration * smoke)
        brokers = min(brokers, max(2, links))

    with err.status("benchmarking the simulation ...") as status:
        results = interruptible(lambda: list(sim.run(
            brokers=brokers, links=links, interval=interval, duration=duration,
            progress=status.update)))
    show(results, json_out, f"rdvpump bench sim ({brokers} brokers, {links} links)",
          ("case", "pump seconds", "wall s", "steps/s", "msgs/s", "baseline",
           "baseline msgs/s", "ratio"),
          lambda r: [r.case, f"{r.simulated_seconds:g}", f"{r.wall_seconds:.2f}",
                     f"{r.steps_per_s:,.0f}", f"{r.msgs_per_s:,.0f}", r.baseline,
                     f"{r.baseline_msgs_per_s:,.0f}", f"{r.ratio:.2f}x"])


@app.command("scale")
def bench_scale(
    json_out: Annotated[bool, typer.Option("--json", help="JSON lines on stdout.")] = False,
    dimension: Annotated[list[str], typer.Option(
        help="brokers, topics, groups, consumers, replicated or servers (repeatable; "
             "default: all).")
    ] = [],  # noqa: B006
    plot: Annotated[str | None, typer.Option(
        help="Draw throughput, p99 latency and memory per step to this PNG (needs the "
             "replay extra: matplotlib).")] = None,
    deadline: Annotated[float, typer.Option(
        min=1.0, help="Seconds a step may take before it counts as stopped.")] = 300.0,
) -> None:
    """Throughput, p99 latency and memory as brokers, topics, consume groups, consumers,
    replicated topics and servers per tracker grow, each step against the dimension's
    smallest."""
    from ..bench import scale

    unknown = [d for d in dimension if d not in scale.STEPS]
    if unknown:
        raise fail(f"--dimension must be one of {', '.join(scale.STEPS)}, got {unknown[0]!r}")
    if plot is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise fail("--plot needs matplotlib: pip install 'rdvpump[replay]'") from None
    fraction = smoke_fraction()
    with err.status("benchmarking how the cost grows ...") as status:
        results = interruptible(lambda: list(scale.run(
            dimension or list(scale.STEPS), scale=fraction, deadline=deadline,
            progress=status.update)))
    show(results, json_out, "rdvpump bench scale",
          ("case", "step", "ops/s", "p99 ms", "KiB/unit", "ratio", "memory ratio"),
          lambda r: [r.case, f"{r.n:,}", r.error or f"{r.per_s:,.0f}",
                     "" if r.error else f"{r.quantile(0.99) * 1e3:.2f}",
                     "" if r.error else f"{r.memory_per_unit / 1024:,.1f}",
                     "" if r.error or not r.baseline_per_s
                     else f"{r.per_s / r.baseline_per_s:.2f}x",
                     "" if r.error or not r.baseline_memory_per_unit
                     else f"{r.memory_per_unit / r.baseline_memory_per_unit:.2f}x"])
    if plot is not None:
        guard(lambda: scale.plot(results, plot), arg="--plot")
        err.print(f"plot: {plot}", highlight=False)
    if stopped := [r for r in results if r.error is not None]:
        raise fail("; ".join(f"{r.dimension} at {r.n:,}: {r.error}" for r in stopped))


@app.command("tcp")
def bench_tcp(
    json_out: Annotated[bool, typer.Option("--json", help="JSON lines on stdout.")] = False,
    sizes: Annotated[str, typer.Option(help="Message sizes, comma-separated.")] = "64,1024,65536",
    scale: Annotated[float, typer.Option(help="Multiply the message counts.")] = 1.0,
    repeat: Annotated[int, typer.Option(help="Runs per figure; the best is kept.")] = 3,
    placement: Annotated[str, typer.Option(
        help="split: the two processes on two cores; same: both on core 0.")] = "split",
    busy_poll_us: Annotated[float, typer.Option(
        help="Also time the round trip with links busy-polling this long (split placement; "
             "0: not).")] = 100.0,
) -> None:
    """Two processes on loopback beside pyzmq PUSH/PULL and a batched trio framing loop."""
    from ..bench import tcp

    if (smoke := smoke_fraction()) < 1:
        scale, repeat = scale * smoke, 1
    size_list = guard(lambda: parse_sizes(sizes, scale, repeat))
    with err.status("benchmarking ...") as status:
        results = interruptible(lambda: list(tcp.run(size_list, scale=scale, repeat=repeat,
                                              placement=placement,
                                              busy_poll=busy_poll_us * 1e-6,
                                              progress=status.update)))
    def row(r: Any) -> list[str]:
        lat = (f"{r.median_us:,.0f} / {r.baseline_median_us:,.0f}" if r.median_us else "",
               f"{r.p99_us:,.0f} / {r.baseline_p99_us:,.0f}" if r.p99_us else "")
        return [r.case, str(r.size), f"{r.msgs_per_s:,.0f}", f"{r.mb_per_s:,.1f}",
                r.baseline, f"{r.baseline_msgs_per_s:,.0f}", f"{r.ratio:.2f}x", *lat]

    show(results, json_out, f"rdvpump bench tcp (best of {repeat}, placement {placement})",
          ("case", "size", "msgs/s", "MB/s", "baseline", "baseline msgs/s", "ratio",
           "median us", "p99 us"), row)


@app.command("mq")
def bench_mq(
    json_out: Annotated[bool, typer.Option("--json", help="JSON lines on stdout.")] = False,
    sizes: Annotated[str, typer.Option(help="Message sizes, comma-separated.")] = "64,1024,65536",
    durability: Annotated[str, typer.Option(
        help="Durability policies, comma-separated.")] = "interval:1,sync",
    scale: Annotated[float, typer.Option(help="Multiply the message counts.")] = 1.0,
    repeat: Annotated[int, typer.Option(help="Runs per figure; the best is kept.")] = 1,
    recovery_gib: Annotated[float, typer.Option(
        min=0.0, help="Also time opening a queue of this many GiB after a restart (0: "
                      "not).")] = 1.0,
) -> None:
    """An MQ server process end to end beside Redis Streams and a plain file append."""
    from mq import Durability

    from ..bench import mq

    if (smoke := smoke_fraction()) < 1:
        scale, repeat, recovery_gib = scale * smoke, 1, recovery_gib * smoke
    size_list = guard(lambda: parse_sizes(sizes, scale, repeat))
    policies = [d.strip() for d in durability.split(",") if d.strip()]
    for policy in policies:
        guard(lambda policy=policy: Durability.parse(policy))  # type: ignore[misc]
    with err.status("benchmarking the MQ ...") as status:
        results = interruptible(lambda: list(mq.run(size_list, durabilities=policies, scale=scale,
                                            repeat=repeat, progress=status.update)))
    if recovery_gib > 0:
        with err.status(f"writing and reopening {recovery_gib:g} GiB ..."):
            recovered = interruptible(lambda: mq.recovery(recovery_gib))
        if json_out:
            print(json.dumps(recovered.to_dict()))
        else:
            out.print(f"recovery of {recovered.gib:g} GiB ({recovered.records:,} records, "
                      f"{recovered.segments} segments): {recovered.seconds:.3f} s; with every "
                      f"index lost {recovered.baseline_seconds:.3f} s")
    show(results, json_out, f"rdvpump bench mq (best of {repeat})",
          ("case", "size", "durability", "msgs/s", "MB/s", "baseline", "baseline msgs/s",
           "ratio"),
          lambda r: [r.case, str(r.size), r.durability, f"{r.msgs_per_s:,.0f}",
                     f"{r.mb_per_s:,.1f}", r.baseline, f"{r.baseline_msgs_per_s:,.0f}",
                     f"{r.ratio:.2f}x"])


@app.command("failover")
def bench_failover(
    json_out: Annotated[bool, typer.Option("--json", help="JSON lines on stdout.")] = False,
    trials: Annotated[int, typer.Option(help="SIGKILLs of the master (and of NATS's stream "
                                             "leader).")] = 20,
    messages: Annotated[int, typer.Option(help="1 KiB publishes per awaited throughput "
                                               "figure (five times as many batched).")
                  ] = 20_000,
    publishers: Annotated[int, typer.Option(help="Concurrent publishers of the throughput "
                                                 "figures.")] = 32,
) -> None:
    """A replicated group's master SIGKILLed: the time to the first publish its successor
    acknowledges, beside a three-node NATS JetStream cluster; and replication's
    throughput against a single server."""
    from ..bench import failover

    if (smoke := smoke_fraction()) < 1:
        trials, messages = max(1, round(trials * smoke)), max(8, round(messages * smoke))
    if trials < 1 or messages < 8 or publishers < 1:
        raise fail("--trials and --publishers must be at least 1, --messages at least 8")
    with err.status("benchmarking failover ...") as status:
        results = guard(lambda: interruptible(lambda: failover.run(
            trials, messages, publishers=publishers, progress=status.update)))
    if json_out:
        for r in results:
            print(json.dumps(r.to_dict()))
        return
    show_times(f"rdvpump bench failover ({trials} trials)",
                [r for r in results if isinstance(r, failover.FailoverResult)])
    table = Table(title="redelivered to a routed consumer after each SIGKILL")
    for col in ("case", "failovers", "duplicates p50", "p99", "max",
                "first delivered before the kill, max s"):
        table.add_column(col, justify="left" if col == "case" else "right")
    for r in results:
        if isinstance(r, failover.RedeliveryResult):
            d = r.to_dict()
            table.add_row(r.case, str(d["failovers"]), str(d["duplicates_p50"]),
                          str(d["duplicates_p99"]), str(d["duplicates_max"]),
                          str(d["first_delivered_before_kill_max_s"]))
    show_table(table)
    show([r for r in results if isinstance(r, failover.ThroughputResult)], False,
          f"replication, 1 KiB publishes ({publishers} awaiting each, or batched)",
          ("case", "publish", "durability", "msgs/s", "baseline", "baseline msgs/s",
           "ratio"),
          lambda r: [r.case, r.publish, r.durability, f"{r.msgs_per_s:,.0f}", r.baseline,
                     f"{r.baseline_msgs_per_s:,.0f}",
                     f"{r.msgs_per_s / r.baseline_msgs_per_s:.2f}x"])


@app.command("partition")
def bench_partition(
    json_out: Annotated[bool, typer.Option("--json", help="JSON lines on stdout.")] = False,
    trials: Annotated[int, typer.Option(help="Cuts of the master's host (and of NATS's "
                                             "stream leader's).")] = 20,
) -> None:
    """A replicated group's master cut off from the network without a word, on network
    namespaces: the time to the first publish its successor acknowledges, beside a
    three-node NATS JetStream cluster's stream leader cut off the same way (root and
    iproute2)."""
    from ..bench import partition

    if (smoke := smoke_fraction()) < 1:
        trials = max(1, round(trials * smoke))
    if trials < 1:
        raise fail("--trials must be at least 1")
    with err.status("benchmarking a partition ...") as status:
        results = guard(lambda: interruptible(lambda: partition.run(
            trials, progress=status.update)))
    if json_out:
        for r in results:
            print(json.dumps(r.to_dict()))
        return
    show_times(f"rdvpump bench partition ({trials} trials)", results)


@app.command("nemesis")
def bench_nemesis(
    json_out: Annotated[bool, typer.Option("--json", help="JSON lines on stdout.")] = False,
    schedules: Annotated[int, typer.Option(help="Runs, each a schedule of its own "
                                                "seed.")] = 50,
    first_seed: Annotated[int, typer.Option(help="The first run's seed (the next ones "
                                                 "follow it).")] = 0,
    faults: Annotated[int, typer.Option(help="Faults in each schedule.")] = 3,
    insync_lag: Annotated[float | None, typer.Option(
        help="The members' --insync-lag (default: theirs).", show_default=False)] = None,
    cluster: Annotated[bool, typer.Option(
        "--cluster", help="A cluster of three primaries and a shared topic instead of a "
                          "group; their logs checked for two roots in an epoch.")] = False,
) -> None:
    """Jepsen-style runs of a sync replicated group (or a cluster) on network namespaces:
    seeded schedules of faults (cuts, splits, bridges, pauses, crashes, slow and lossy
    links) while a producer and a consumer on hosts of their own go on; every history
    checked. Availability, recovery after the heal, redeliveries (root, iproute2,
    ethtool)."""
    from ..bench import nemesis_runs

    if (smoke := smoke_fraction()) < 1:
        schedules, faults = max(1, round(schedules * smoke)), 1
    if schedules < 1 or faults < 1:
        raise fail("--schedules and --faults must be at least 1")
    if cluster and insync_lag is not None:
        raise fail("--insync-lag is a group's: a cluster has none")
    seeds = list(range(first_seed, first_seed + schedules))
    with err.status("playing schedules ...") as status:
        results = guard(lambda: interruptible(lambda: nemesis_runs.run(
            seeds, faults=faults, insync_lag=insync_lag, cluster=cluster,
            progress=status.update)))
    total = {**nemesis_runs.summary(results),
             **({} if cluster else {"insync_lag": insync_lag})}
    if json_out:
        for r in results:
            print(json.dumps(r.to_dict()))
        print(json.dumps(total))
    else:
        table = Table(title=f"rdvpump bench nemesis{' --cluster' if cluster else ''} "
                            f"({schedules} schedules)")
        for col in ("seed", "ok", "availability", "longest gap s", "recover s",
                    "redelivered", "findings"):
            table.add_column(col, justify="left" if col in ("ok", "findings") else "right")
        for r in results:
            d = r.to_dict()
            table.add_row(str(r.seed), "yes" if r.ok else "NO", f"{d['availability']:.2f}",
                          f"{d['longest_unavailable_s']:.2f}",
                          "-" if r.recover_s is None else f"{r.recover_s:.3f}",
                          str(r.redeliveries), ", ".join(f"{k} {v}" for k, v in
                                                        r.findings.items()) or "none")
        show_table(table)
    if total["failed"]:
        raise fail(f"schedules that failed their check: seeds {total['failed']}")


@app.command("cluster")
def bench_cluster(
    json_out: Annotated[bool, typer.Option("--json", help="JSON lines on stdout.")] = False,
    brokers: Annotated[int, typer.Option(help="Fanout servers (B) beside the root.")] = 3,
    queues: Annotated[int, typer.Option(help="Consume groups (Q) on each fanout "
                                             "server, a client each.")] = 4,
    messages: Annotated[int, typer.Option(help="1,000-byte messages the faucet "
                                               "publishes.")] = 20_000,
    isr: Annotated[bool, typer.Option(help="Also B = 7, Q = 12 into clients that "
                                           "discard (the internal rate's "
                                           "configuration).")] = True,
    in_flight: Annotated[int, typer.Option(help="Batches of 100 the faucet keeps in "
                                                "flight.")] = 2,
    sink: Annotated[str, typer.Option(help="How the clients consume: batch "
                                           "(receive_batch, columns) or messages "
                                           "(receive_many, a Message each).")] = "batch",
) -> None:
    """A cluster's external switching rate: one faucet into a shared topic at the root,
    B x Q clients on B fanout servers each receiving every message, against OpenAMQ's
    figure for B = Q = 4; and the internal rate's configuration."""
    from ..bench import cluster

    if (smoke := smoke_fraction()) < 1:
        messages = max(BATCH_MIN, round(messages * smoke))
    if brokers < 1 or queues < 1 or messages < 1 or in_flight < 1:
        raise fail("--brokers, --queues, --messages and --in-flight must be at least 1")
    if sink not in cluster.SINKS:
        raise fail(f"--sink must be one of {', '.join(cluster.SINKS)}, not {sink!r}")
    with err.status("benchmarking a cluster ...") as status:
        results = guard(lambda: interruptible(lambda: cluster.run(
            brokers, queues, messages, isr=isr, in_flight=in_flight, sink=sink,
            progress=status.update)))
    show(results, json_out, f"rdvpump bench cluster ({messages:,} messages of 1,000 bytes, "
                             f"{sink} sinks)",
          ("case", "B", "Q", "deliveries/s", "baseline", "baseline /s", "ratio",
           "CPU us/delivery"),
          lambda r: [r.case, str(r.brokers), str(r.queues), f"{r.deliveries_per_s:,.0f}",
                     r.baseline, f"{r.baseline_per_s:,.0f}",
                     f"{r.deliveries_per_s / r.baseline_per_s:.2f}x",
                     str(r.to_dict()["cpu_us_per_delivery"] or "-")])
