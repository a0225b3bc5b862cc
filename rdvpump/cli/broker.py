"""rdvpump broker: brokers in a process of their own."""

from __future__ import annotations

import functools
import pathlib
from typing import TYPE_CHECKING, Annotated, Any

import trio
import typer

from brokermgr import (
    DEFAULT_HEARTBEAT,
    DEFAULT_MANAGER_PORT,
    EXPIRY_BEATS,
    GROUP_HEARTBEAT,
    QUIET,
    SUSPECT_BEATS,
    GroupMember,
)
from brokermgr.tracking import (
    DEFAULT_REPORT_INTERVAL,
    DEFAULT_SCAN_INTERVAL,
    DEFAULT_SERVER_EXPIRY,
    DEFAULT_TRACK_PORT,
)
from pump import ConfigError
from rdv import Address

from ..children import ready_line
from ..processes import TrackingOptions, run_brokers
from ._common import (
    CAOption,
    CertOption,
    IdentitiesOption,
    IdentityOption,
    KeyOption,
    MetricsOption,
    RunOption,
    TokenOption,
    TraceFormatOption,
    TraceOption,
    UniverseOption,
    as_a_server,
    err,
    fail,
    guard,
    recorder,
    tls_files,
)

if TYPE_CHECKING:
    from mq import ClusterConfig

app = typer.Typer(rich_markup_mode=None, help="Brokers in a process of their own.",
                  no_args_is_help=True)


# broker run's own options (the shared ones are in ._common)
BrokerIdOption = Annotated[list[str], typer.Option("--id", help="Broker id (repeatable).")]
ManagerOption = Annotated[list[str], typer.Option(help="Manager HOST:PORT (repeatable).")]
ListenOption = Annotated[str | None, typer.Option(
    help="HOST:PORT for links (port 0: any); by default 127.0.0.1:0, or a --cluster "
         "server's address in its file.", show_default=False)]
EchoOption = Annotated[list[int], typer.Option(
    help="Echo messages on this port (repeatable). Every broker echoes on port 80 "
         "unless told otherwise; --echo 0: on no port.")]
HeartbeatOption = Annotated[float | None, typer.Option(
    help=f"Seconds between heartbeats to the managers [default: {DEFAULT_HEARTBEAT:g}; "
         f"{GROUP_HEARTBEAT:g} for a --group member, which a manager drops after "
         f"{EXPIRY_BEATS} of them without one]", show_default=False)]
PlanOption = Annotated[pathlib.Path | None, typer.Option(
    help="Play these brokers' roles in a universe file (used by `universe up`).")]
RoleOption = Annotated[str | None, typer.Option(
    help="Tracking role of these brokers: server, tracker or both (default: none).")]
TrackPortOption = Annotated[int, typer.Option(help="Rendezvous port of the tracking role.")]
TrackerOption = Annotated[list[str], typer.Option(
    help="A tracker BROKER:PORT this server publishes to (repeatable).")]
TopicOption = Annotated[list[str], typer.Option(
    help="A topic the server role declares at start (repeatable).")]
ReportIntervalOption = Annotated[float, typer.Option(
    help="Seconds between a server's reports to its trackers.")]
TrackExpiryOption = Annotated[float, typer.Option(
    help="Seconds without a report before a tracker drops a server.")]
TrackScanOption = Annotated[float, typer.Option(
    help="Seconds between a tracker's expiry scans.")]
StateDirOption = Annotated[pathlib.Path | None, typer.Option(
    help="Where InfoVersion epochs persist, so versions grow across restarts.")]
MqDirOption = Annotated[pathlib.Path | None, typer.Option(
    help="Run an MQ server on each server role, its topics in DIR/<broker id> "
         "(needs --role server or both).")]
DurabilityOption = Annotated[str, typer.Option(
    help="When the MQ server acknowledges a produce: sync (after fsync, shared by "
         "concurrent produces), interval:SECONDS or none.")]
RetainMbOption = Annotated[float | None, typer.Option(
    help="MQ retention: keep at most this many MB per topic (whole 64 MiB segments "
         "go, oldest first).")]
RetainHoursOption = Annotated[float | None, typer.Option(
    help="MQ retention: drop segments whose newest message is older than this.")]
SegmentMbOption = Annotated[float, typer.Option(
    help="MQ segment size in MB: a topic's log starts a new file (and seals the last, "
         "with its index and checksum) past it. Default: 64 MiB (67.108864 MB).",
    show_default=False)]
BusyPollUsOption = Annotated[float, typer.Option(
    help="Links poll a quiet socket this long before sleeping: lower latency for a "
         "busy core (0: off).")]
GroupOption = Annotated[str | None, typer.Option(
    help="The replicated group this MQ server belongs to (one --id; needs --mq-dir): "
         "member 0 is its master, the others copy it.")]
GroupIdOption = Annotated[int, typer.Option(
    help="This server's member id in --group (0: the master).")]
ReplicationOption = Annotated[str, typer.Option(
    help="When a group's master acknowledges a produce: async (once it stored it) or "
         "sync (once --min-insync members copied it too).")]
MinInsyncOption = Annotated[int, typer.Option(
    help="Under --replication sync, the members that must have copied a produce "
         "before it is acknowledged.")]
InsyncLagOption = Annotated[float | None, typer.Option(
    help="Seconds a member may stay behind its master (a slow or silent one) and "
         "still count as in sync: a sync master waits that long for one cut off "
         "before it acknowledges without it [default: 10]", show_default=False)]
SilenceOption = Annotated[float | None, typer.Option(
    help=f"Seconds a --group member's master may say nothing to it (it answers every "
         f"--heartbeat) before the member counts it as silent: it tells its managers "
         f"at once, which drop a master that every member in sync finds silent after "
         f"{SUSPECT_BEATS} of its heartbeats, and a member promoted then takes over "
         f"from it [default: {QUIET / GROUP_HEARTBEAT:g} heartbeats, {QUIET:g} s; at least "
         f"two]",
    show_default=False)]
ClusterOption = Annotated[pathlib.Path | None, typer.Option(
    help="A cluster file: these brokers are servers of that cluster, each linked to "
         "every other server listed in it (one --id without --listen listens at its "
         "address there); their epoch and vote are kept in --state-dir, or --mq-dir.")]


@app.command("run")
def broker_run(
    broker_id: BrokerIdOption, manager: ManagerOption,
    universe: UniverseOption = "default", listen: ListenOption = None,
    token: TokenOption = "", identity: IdentityOption = "",
    identities: IdentitiesOption = None,
    echo: EchoOption = [80],  # noqa: B006
    heartbeat: HeartbeatOption = None, tls_cert: CertOption = None,
    tls_key: KeyOption = None, tls_ca: CAOption = None, plan: PlanOption = None,
    trace: TraceOption = None, trace_format: TraceFormatOption = "jsonl",
    run: RunOption = None, role: RoleOption = None,
    track_port: TrackPortOption = DEFAULT_TRACK_PORT,
    tracker: TrackerOption = [],  # noqa: B006
    topic: TopicOption = [],  # noqa: B006
    report_interval: ReportIntervalOption = DEFAULT_REPORT_INTERVAL,
    track_expiry: TrackExpiryOption = DEFAULT_SERVER_EXPIRY,
    track_scan: TrackScanOption = DEFAULT_SCAN_INTERVAL, state_dir: StateDirOption = None,
    mq_dir: MqDirOption = None, durability: DurabilityOption = "sync",
    retain_mb: RetainMbOption = None, retain_hours: RetainHoursOption = None,
    segment_mb: SegmentMbOption = 64 * 1024 * 1024 / 1e6,
    busy_poll_us: BusyPollUsOption = 0.0, group: GroupOption = None,
    group_id: GroupIdOption = 0, replication: ReplicationOption = "async",
    min_insync: MinInsyncOption = 1, insync_lag: InsyncLagOption = None,
    silence: SilenceOption = None, cluster: ClusterOption = None,
    metrics: MetricsOption = None,
) -> None:
    """Run brokers in this process, registered with the managers, until Ctrl-C."""
    managers = guard(lambda: [Address.parse(m, default_port=DEFAULT_MANAGER_PORT) for m in manager])
    address = guard(lambda: Address.parse(listen or "127.0.0.1:0"))
    metrics_at = None if metrics is None else guard(lambda: Address.parse(metrics))
    tls = guard(lambda: tls_files(tls_cert, tls_key, tls_ca))
    _storage(mq_dir, state_dir, durability)
    member = guard(lambda: _member(group, group_id, broker_id, mq_dir, replication, min_insync))
    if insync_lag is not None and not 0 < insync_lag < float("inf"):
        raise fail(f"--insync-lag must be a positive number of seconds, got {insync_lag:g}")
    beat, quiet = _group_timing(member, heartbeat, silence)
    if role is None and (tracker or topic or mq_dir is not None):
        raise fail("--tracker, --topic and --mq-dir need a tracking --role (server, tracker "
                   "or both)")
    tracking = None if role is None else _tracking(
            role=role, port=track_port, trackers=tuple(tracker), topics=tuple(topic),
            report_interval=report_interval, expiry=track_expiry, scan_interval=track_scan,
            state_dir=state_dir, mq_dir=mq_dir, durability=durability, segment_mb=segment_mb,
            retain_bytes=None if retain_mb is None else int(retain_mb * 1e6),
            retain_age=None if retain_hours is None else retain_hours * 3600,
            group=member, replication=replication, min_insync=min_insync,
            insync_lag=insync_lag, group_beat=beat, group_silence=quiet)
    clustered = None if cluster is None else guard(lambda: _cluster(cluster, broker_id))
    _member_notes(cluster, group, identities, kept=state_dir or mq_dir)
    if clustered is not None and listen is None and len(broker_id) == 1:
        address = _listed_address(clustered, broker_id[0])  # where the file says
    trace_recorder = recorder(trace, trace_format, pump="+".join(broker_id), run=run or universe)
    as_a_server()
    guard(lambda: trio.run(lambda: run_brokers(
        universe, broker_id, managers, listen=address, token=token,
        identity=identity or None, identities=None if identities is None else str(identities),
        echo_ports=[port for port in echo if port != 0], heartbeat=_heartbeat(heartbeat, group),
        tls=tls, plan=None if plan is None else str(plan),
        trace=trace_recorder, tracking=tracking, busy_poll=busy_poll_us * 1e-6,
        cluster=clustered, cluster_store=state_dir or mq_dir, metrics=metrics_at,
        ready=ready_line("brokers"))))


def _heartbeat(heartbeat: float | None, group: str | None) -> float:
    """The beat to the managers: a group's member beats faster by default."""
    if heartbeat is not None:
        return heartbeat
    return GROUP_HEARTBEAT if group is not None else DEFAULT_HEARTBEAT


def _storage(mq_dir: pathlib.Path | None, state_dir: pathlib.Path | None,
             durability: str) -> None:
    """The directories made (here, so that a path that cannot be is named by its option),
    the durability checked."""
    for option, path in (("--mq-dir", mq_dir), ("--state-dir", state_dir)):
        if path is not None:
            guard(functools.partial(path.mkdir, parents=True, exist_ok=True), arg=option)
    if durability != "sync" or mq_dir is not None:  # the default needs no check, and a
        from mq import Durability  # broker with no MQ server starts without loading mq

        guard(lambda: Durability.parse(durability))


def _listed_address(cluster: ClusterConfig, broker_id: str) -> Address:
    listed = cluster.server(broker_id)
    assert listed is not None
    return guard(lambda: Address.parse(listed.address))


def _tracking(*, role: str, state_dir: pathlib.Path | None, mq_dir: pathlib.Path | None,
              segment_mb: float, **options: Any) -> TrackingOptions:
    """The tracking role's options, checked; a note when its versions cannot outlive a
    restart."""
    from brokermgr.tracking import ROLES

    if role not in ROLES:  # before any note about the role's other options
        raise fail(f"--role must be one of {', '.join(ROLES)}, got {role!r}")
    if mq_dir is not None and role == "tracker":
        raise fail("--mq-dir needs a server role (--role server or both)")
    segment_bytes = guard(lambda: _segment_bytes(segment_mb))
    if state_dir is None and mq_dir is None:
        err.print("note: tracking without --state-dir (or --mq-dir): the versions of "
                  "this process's route information start from the wall clock, so they "
                  "keep increasing across a restart only if the clock does",
                  markup=False, highlight=False)
    # an MQ server's directory keeps its epochs too
    return TrackingOptions(role=role, state_dir=state_dir or mq_dir, mq_dir=mq_dir,
                           segment_bytes=segment_bytes, **options)


def _member_notes(cluster: pathlib.Path | None, group: str | None,
                  identities: pathlib.Path | None, *, kept: pathlib.Path | None) -> None:
    """What a group's or a cluster's member is told on stderr at start."""
    if (cluster is not None or group is not None) and identities is None:
        err.print(f"note: without --identities any holder of the universe's token may speak "
                  f"as a member of this {'cluster' if cluster is not None else 'group'} "
                  f"(rdvpump identity new --help)", markup=False, highlight=False)
    if cluster is not None and kept is None:
        err.print(f"warning: {cluster}: without --state-dir (or --mq-dir) this server's "
                  f"epoch and vote are not kept across restarts: one that restarts may vote "
                  f"twice in an epoch", markup=False, highlight=False)


def _cluster(path: pathlib.Path, broker_ids: list[str]) -> ClusterConfig:
    """The cluster file, every --id one of its servers."""
    from mq import load_cluster

    config = load_cluster(path)
    for b in broker_ids:
        if config.server(b) is None:
            raise ConfigError(f"{path}: broker {b!r} is not a server of cluster "
                              f"{config.name!r} ({', '.join(s.id for s in config.servers)})")
    return config


def _member(group: str | None, group_id: int, broker_ids: list[str],
            mq_dir: pathlib.Path | None, replication: str, min_insync: int
            ) -> GroupMember | None:
    """This process's place in a replicated group: member 0 is the master (at the
    group's first epoch, 1), the others slaves; None without --group."""
    if replication not in ("async", "sync"):
        raise ConfigError(f"--replication is async or sync, not {replication!r}")
    if min_insync < 1:
        raise ConfigError(f"--min-insync must be 1 or more, got {min_insync}")
    if group is None:
        return None
    if len(broker_ids) != 1 or mq_dir is None:
        raise ConfigError("--group needs one --id and an --mq-dir (a member of a group is "
                          "one MQ server)")
    if group_id < 0:
        raise ConfigError(f"--group-id must be 0 or more, got {group_id}")
    return GroupMember(group, group_id, "master" if group_id == 0 else "slave", epoch=1)


def _group_timing(member: GroupMember | None, heartbeat: float | None,
                  silence: float | None) -> tuple[float | None, float | None]:
    """A group member's beat (its --heartbeat) and silence, for its MQ server (None,
    None: not a member)."""
    if member is None:
        if silence is not None:
            raise fail("--silence is a --group member's")
        return None, None
    beat = GROUP_HEARTBEAT if heartbeat is None else heartbeat
    # by default, as many beats as the default's: 0.4 s at 0.1 s
    chosen = QUIET / GROUP_HEARTBEAT * beat if silence is None else silence
    if not 0 < beat < float("inf"):
        raise fail(f"--heartbeat must be a positive number of seconds, got {beat:g}")
    if not chosen >= 2 * beat:
        raise fail(f"--silence must be at least two heartbeats ({2 * beat:g} s), got "
                   f"{chosen:g}")
    return beat, chosen


def _segment_bytes(megabytes: float) -> int:
    size = int(megabytes * 1e6)
    if size < 4096:
        raise ConfigError(f"--segment-mb {megabytes:g} is below 0.004096 MB (4,096 bytes)")
    return size
