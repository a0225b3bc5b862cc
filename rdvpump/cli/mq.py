"""rdvpump mq: topics, publishing and consuming on an MQ server of another process."""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import os
import pathlib
import sys
from typing import Annotated, Any

import typer
from rich.table import Table

from brokermgr import DEFAULT_MANAGER_PORT
from brokermgr.tracking import DEFAULT_TRACK_PORT
from mq import History, verify
from pump import RdvpumpError
from rdv import Address

from .. import admin, mqtool
from ._common import (
    IdentityOption,
    TokenOption,
    UniverseOption,
    err,
    fail,
    guard,
    interruptible,
    out,
    positive,
    run_trio,
    show_table,
)

app = typer.Typer(rich_markup_mode=None,
                  help="Topics, publishing and consuming on an MQ server (broker run "
                       "--role server --mq-dir DIR).", no_args_is_help=True)

ServerOption = Annotated[str, typer.Option(
    "--server", help="The server as BROKER@HOST:PORT (HOST:PORT: its process's ready line).")]
TrackPortOption = Annotated[int, typer.Option(help="The server's tracking port.")]
JsonOption = Annotated[bool, typer.Option("--json", help="JSON on stdout.")]
TimeoutOption = Annotated[float, typer.Option(callback=positive,
                                              help="Seconds to wait for the server.")]


#: ``--server`` of the commands that may follow a group's master instead.
FollowServerOption = Annotated[str | None, typer.Option(
    "--server", help="The server as BROKER@HOST:PORT (HOST:PORT: its process's ready line); "
                     "or --manager with --master-of.", show_default=False)]
ManagerOption = Annotated[str | None, typer.Option(
    "--manager", help="A manager HOST:PORT, with --master-of: the name service that names "
                      "the group's master.", show_default=False)]
MasterOfOption = Annotated[str | None, typer.Option(
    "--master-of", help="A replicated group: its master, found through --manager and "
                        "followed when it fails over (one line on stderr says so).",
    show_default=False)]


def _run_following(universe: str, server: str | None, manager: str | None,
                   master_of: str | None, token: str, identity: str, track_port: int,
                   timeout: float, body: Any) -> Any:
    """``body(client, following)`` on ``--server``'s client (``following`` None), or on
    the master of ``--master-of`` found through ``--manager`` and followed."""
    if (server is None) == (master_of is None) or (master_of is None) != (manager is None):
        raise fail("give --server, or --manager with --master-of")
    if server is not None:
        return _run(universe, server, token, identity, track_port, timeout,
                    lambda client: body(client, None))
    assert manager is not None and master_of is not None

    async def main() -> Any:
        async with mqtool.connect_group(universe, manager, master_of, token=token,
                                        identity=identity or None, track_port=track_port,
                                        timeout=timeout, say=lambda line: err.print(line)
                                        ) as following:
            assert following.client is not None
            return await body(following.client, following)

    return interruptible(lambda: run_trio(main))


def _run(universe: str, server: str, token: str, identity: str, track_port: int,
         timeout: float, body: Any) -> Any:
    async def main() -> Any:
        async with mqtool.connect(universe, server, token=token, identity=identity or None,
                                  track_port=track_port, timeout=timeout) as client:
            return await body(client)

    return interruptible(lambda: run_trio(main))


@app.command("declare")
def mq_declare(
    topic: Annotated[str, typer.Argument(help="Topic name.")],
    server: ServerOption,
    flag: Annotated[list[str], typer.Option(
        help="memory, rpc, exclusive or delete-on-exit (repeatable).")] = [],  # noqa: B006
    group: Annotated[str | None, typer.Option(help="A consume group to declare.")] = None,
    filter: Annotated[str | None, typer.Option(help="The group's tag filter.")] = None,
    start: Annotated[str | None, typer.Option(
        help="Where a new group starts: end, beginning, offset:N, time:MS, copy:GROUP.")] = None,
    shared: Annotated[bool, typer.Option(
        "--shared", help="A topic of the server's cluster: declared through its root, on "
                         "every server of the cluster.")] = False,
    universe: UniverseOption = "default", token: TokenOption = "",
    identity: IdentityOption = "",
    track_port: TrackPortOption = DEFAULT_TRACK_PORT, timeout: TimeoutOption = 10.0,
    as_json: JsonOption = False,
) -> None:
    """Declare a topic (and a consume group)."""
    reply = interruptible(lambda: run_trio(lambda: admin.declare(
        universe, server, topic, flags=flag, group=group, filter=filter, start=start,
        shared=shared, token=token, identity=identity or None, track_port=track_port,
        timeout=timeout)))
    if as_json:
        print(json.dumps({k: v for k, v in reply.items() if k != "seq"}))
    else:
        out.print(admin.declared(topic, reply, filter))


@app.command("publish")
def mq_publish(
    topic: Annotated[str, typer.Argument(help="Topic name.")],
    server: FollowServerOption = None,
    file: Annotated[list[str], typer.Option(
        help="Publish this file as one message (repeatable); without: each line of "
             "stdin.")] = [],  # noqa: B006
    tag: Annotated[str | None, typer.Option(help="Tag of every message.")] = None,
    batch: Annotated[int, typer.Option(help="Messages per request.")] = 100,
    immediate: Annotated[bool, typer.Option(
        "--immediate", help="Store a batch only if a consumer of one of the topic's groups "
        "is there to take it now; else the server returns it (counted; exit 1).")] = False,
    universe: UniverseOption = "default", token: TokenOption = "",
    identity: IdentityOption = "",
    track_port: TrackPortOption = DEFAULT_TRACK_PORT, timeout: TimeoutOption = 10.0,
    as_json: JsonOption = False,
    manager: ManagerOption = None, master_of: MasterOfOption = None,
) -> None:
    """Publish lines of stdin (or files), acknowledged by the server before the next batch.

    With --manager and --master-of, to a replicated group's master, followed when it
    fails over: a batch its master did not answer is sent again to the next one, with its
    numbers (so not stored twice)."""
    if batch < 1:
        raise typer.BadParameter("--batch must be at least 1")

    # at a terminal, the count so far on one line that the result replaces; else nothing
    with contextlib.ExitStack() as stack:
        status = stack.enter_context(err.status("publishing ...")) if err.is_terminal \
            else None

        def progress(n: int) -> None:
            if status is not None:
                status.update(f"{n:,} published ...")

        result = _run_following(
            universe, server, manager, master_of, token, identity, track_port, timeout,
            lambda c, following: mqtool.publish(c, topic, mqtool.arrivals(file), tag=tag,
                                                batch=batch, progress=progress,
                                                immediate=immediate, following=following))
    if as_json:
        print(json.dumps(result))
    else:
        # a shared topic's messages are stored by the cluster's root, not the server
        # that took them
        where = result["server"] if result["via"] is None else (
            f"{result['server']} (the cluster's root) via {result['via']}")
        out.print(f"published {result['published']:,} to {topic} on {where}"
                  + (f", offsets {result['first']}..{result['last']}"
                     if result["published"] else ""))
    if result["returned"]:
        raise fail(f"{result['returned']:,} messages returned, not stored: no consumer of "
                   f"topic {topic} was there to take them (--immediate)")


@app.command("consume")
def mq_consume(
    topic: Annotated[str, typer.Argument(help="Topic name.")],
    server: FollowServerOption = None,
    group: Annotated[str | None, typer.Option(help="Consume group (default: the topic's).")]
        = None,
    count: Annotated[int | None, typer.Option(min=1, help="Stop after this many "
                                                          "messages.")] = None,
    idle: Annotated[float, typer.Option(min=0.0, help="Stop after this many seconds "
                                                     "without a message; 0: never (until "
                                                     "--count or Ctrl-C).")] = 2.0,
    window: Annotated[int, typer.Option(help="Unacknowledged messages held at most.")] = 100,
    out_dir: Annotated[pathlib.Path | None, typer.Option(
        "--out", help="Write each message's exact bytes to a file of its own in this "
                      "directory (named by its offset), and print the file's path.")] = None,
    universe: UniverseOption = "default", token: TokenOption = "",
    identity: IdentityOption = "",
    track_port: TrackPortOption = DEFAULT_TRACK_PORT, timeout: TimeoutOption = 10.0,
    as_json: Annotated[bool, typer.Option(
        "--json", help="A JSON object per message: its fields, and its body as text "
                       "(\"body\") when it is UTF-8, else in base64 (\"body_base64\").")] = False,
    manager: ManagerOption = None, master_of: MasterOfOption = None,
) -> None:
    """Print messages of a topic and acknowledge them.

    By default each message's bytes go to stdout as they are, each followed by a newline:
    exact, but messages that hold newlines or binary data cannot be told apart there (use
    --out or --json).  A reader that stops reading (``| head``) ends the command quietly;
    what it did not read is not acknowledged.  A server lost ends it with one line and
    exit 1; with --manager and --master-of it follows the group's master instead.
    """
    if out_dir is not None:
        guard(lambda: out_dir.mkdir(parents=True, exist_ok=True), arg="--out")
    show = functools.partial(_show_message, sys.stdout.buffer, out_dir, as_json)

    async def consume(client: Any, following: Any) -> int | None:
        try:
            return await mqtool.consume(client, topic, group=group, count=count, idle=idle,
                                        window=window, show=show, following=following)
        except _ReaderGone:
            return None

    seen = _run_following(universe, server, manager, master_of, token, identity,
                          track_port, timeout, consume)
    if seen is None:
        # the reader is gone: nothing more to say, and no error at exit for the flush
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise typer.Exit(0)
    err.print(f"{seen:,} consumed and acknowledged", highlight=False)


def _show_message(stdout: Any, out_dir: pathlib.Path | None, as_json: bool, m: Any) -> None:
    """One message on stdout: its bytes and a newline, the path of the file that holds
    them (``--out``), or a JSON object (``--json``); :class:`_ReaderGone` when the reader
    stopped reading."""
    try:
        if out_dir is not None:
            path = out_dir / f"{m.offset:012d}.msg"
            path.write_bytes(m.body)
            line = str(path).encode() + b"\n"
        elif as_json:
            fields = {"offset": m.offset, "tag": m.tag, "producer": m.producer,
                      "sequence": m.sequence, "deliveries": m.deliveries,
                      "timestamp": m.timestamp}
            try:
                fields["body"] = m.body.decode()
            except UnicodeDecodeError:
                fields["body_base64"] = base64.b64encode(m.body).decode()
            line = json.dumps(fields).encode() + b"\n"
        else:
            line = m.body + b"\n"
        stdout.write(line)
        stdout.flush()
    except BrokenPipeError:
        raise _ReaderGone from None


class _ReaderGone(RdvpumpError):
    """What ``mq consume`` writes has no reader any more (a pipe closed)."""


@app.command("topics")
def mq_topics(
    server: ServerOption,
    universe: UniverseOption = "default", token: TokenOption = "",
    identity: IdentityOption = "",
    track_port: TrackPortOption = DEFAULT_TRACK_PORT, timeout: TimeoutOption = 10.0,
    as_json: JsonOption = False,
) -> None:
    """Topics with their depth, and each group's lag, consumers and dead letters."""
    reply = _run(universe, server, token, identity, track_port, timeout, lambda c: c.query_all())
    topics, unavailable = reply["topics"], reply.get("unavailable", {})
    if as_json:
        print(json.dumps(topics if not unavailable else {**topics,
                                                         "unavailable": unavailable}))
        return
    filtered = any(g["filter"] for t in topics.values() for g in t["groups"].values())
    table = _narrow_table(f"topics on {server}", "topic", "#stored", "#depth", "group",
                          *(("filter",) * filtered), "#lag", "#consumers", "#unacked",
                          "#dead", "status")
    relayed = False
    for name, t in sorted(topics.items()):
        first = True
        label = f"{name} ({', '.join(t['flags'])})" if t["flags"] else name
        if t.get("shared"):
            label += f" (shared, root {t.get('root') or 'not known'})"
        # a shared topic relayed here: its queue and its groups' lag are the root's
        at_root = bool(t.get("relayed"))
        relayed |= at_root
        for group, g in sorted(t["groups"].items()):
            table.add_row(label if first else "",
                          ("-" if at_root else f"{t['next'] - t['start']:,}") if first else "",
                          ("-" if at_root else f"{t['depth']:,}") if first else "", group,
                          *((g["filter"] or "",) * filtered),
                          "-" if at_root else f"{g['lag']:,}", str(g["consumers"]),
                          str(g["inFlight"]), "-" if at_root else str(g["deadLetters"]),
                          g.get("status", ""))
            first = False
    if relayed:
        table.caption = ("-: held by the cluster's root; mq topics on the root shows it "
                         "(consumers and unacked: this server's own)")
    show_table(table)
    for name, t in sorted(topics.items()):
        if t.get("error"):
            err.print(f"topic {name}: {t['error']}", style="red", markup=False,
                      highlight=False)
        for c in t.get("corrupt", []):
            last = "the end" if c["offsets"][1] is None else c["offsets"][1]
            err.print(f"topic {name}: damaged data skipped in {c['file']} at byte "
                      f"{c['position']} (offsets {c['offsets'][0]} to {last})",
                      style="yellow", markup=False, highlight=False)
    for where, reason in sorted(unavailable.items()):
        err.print(f"not served: {where}: {reason}", style="red", markup=False,
                  highlight=False)


@app.command("groups")
def mq_groups(
    topic: Annotated[str, typer.Argument(help="Topic name.")],
    server: ServerOption,
    universe: UniverseOption = "default", token: TokenOption = "",
    identity: IdentityOption = "",
    track_port: TrackPortOption = DEFAULT_TRACK_PORT, timeout: TimeoutOption = 10.0,
    as_json: JsonOption = False,
) -> None:
    """One topic's consume groups: filter, lag, consumers, in flight, dead letters."""
    topics = _run(universe, server, token, identity, track_port, timeout, lambda c: c.query(topic))
    groups = topics[topic]["groups"]
    if as_json:
        print(json.dumps(groups))
        return
    filtered = any(g["filter"] for g in groups.values())
    table = _narrow_table(f"{topic} on {server}", "group", *(("filter",) * filtered), "#lag",
                          "#consumers", "#unacked", "#dead letters", "status")
    for name, g in sorted(groups.items()):
        table.add_row(name, *((g["filter"] or "",) * filtered), f"{g['lag']:,}",
                      str(g["consumers"]), str(g["inFlight"]), str(g["deadLetters"]),
                      g.get("status", ""))
    show_table(table)


def _narrow_table(title: str, *columns: str) -> Table:
    """A table whose figures stay whole in 80 columns: a column named ``#name`` holds
    numbers (right-aligned, never wrapped); the text columns fold, and no padding is
    spent at the cells' edges."""
    table = Table(title=title, pad_edge=False)
    for col in columns:
        number = col.startswith("#")
        table.add_column(col.lstrip("#"), justify="right" if number else "left",
                         no_wrap=number, overflow="fold")
    return table


@app.command("verify")
def mq_verify(
    directory: Annotated[pathlib.Path, typer.Argument(
        help="An --mq-dir, one broker's directory in it, or one topic's directory.")],
    as_json: JsonOption = False,
) -> None:
    """Check a queue directory offline (nothing is changed): every record's checksum, the
    indexes, cursors and topic files. Exit 1 naming each damaged record, 0 when clean."""
    try:
        report = verify(directory)
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise fail(str(exc)) from None
    if as_json:
        print(json.dumps({"topics": report.topics, "segments": report.segments,
                          "records": report.records,
                          "findings": [{"file": f.file, "position": f.position, "what": f.what,
                                        "damage": f.damage} for f in report.findings]}))
    else:
        for finding in report.findings:
            (err if finding.damage else out).print(str(finding), highlight=False,
                                                   markup=False)
        verdict = (f"{len(report.damaged)} damaged" if report.damaged else "clean")
        out.print(f"{report.topics} topics, {report.segments} segments, "
                  f"{report.records:,} records checked: {verdict}", highlight=False)
    if report.damaged:
        raise typer.Exit(1)


@app.command("check-history")
def mq_check_history(
    history: Annotated[pathlib.Path, typer.Argument(
        help="JSON Lines, an operation a line: publish, consume and ack (see mq.History).")],
    group: Annotated[list[str] | None, typer.Option(
        "--group", help="TOPIC=GROUP: a group expected to receive every acknowledged "
                        "message of the topic (repeatable; default: the groups that "
                        "consumed from it).")] = None,
    idempotent: Annotated[bool, typer.Option(
        "--idempotent", help="The servers recognise a retried publish: a second copy of "
                             "a message in one partition is a finding.")] = False,
    as_json: JsonOption = False,
) -> None:
    """Check what clients saw against at-least-once delivery: acknowledged messages lost,
    more copies of a message than publishes of it, delivered again after a confirmed
    ack, out of order in a partition, two messages at one offset, two masters in one
    epoch. Exit 1 listing each finding, 0 when there is none."""
    groups: dict[str, list[str]] | None = None
    for pair in group or []:
        topic, eq, name = pair.partition("=")
        if not (topic and eq and name):
            raise fail(f"--group takes TOPIC=GROUP, not {pair!r}")
        groups = groups or {}
        groups.setdefault(topic, []).append(name)

    def read() -> History:
        with open(history, encoding="utf-8", errors="replace") as lines:
            return History.read(lines)

    report = interruptible(lambda: guard(read, "HISTORY").check(groups,
                                                                 idempotent=idempotent))
    if as_json:
        print(json.dumps(report.to_dict()))
    else:
        for finding in report.findings:
            err.print(f"{finding.kind}: {finding.topic + ': ' if finding.topic else ''}"
                      f"{finding.detail}", highlight=False, markup=False)
        counts = report.counts
        verdict = f"{len(report.findings)} findings" if report.findings else "clean"
        out.print(f"{counts['messages']:,} messages ({counts['acknowledged']:,} "
                  f"acknowledged), {counts.get('deliveries', 0):,} deliveries: {verdict}",
                  highlight=False)
    if not report.ok:
        raise typer.Exit(1)


@app.command("failover")
def mq_failover(
    group: Annotated[str, typer.Argument(help="The replicated group.")],
    to: Annotated[str, typer.Option(
        "--to", help="The member to make master: its broker id or member id.")],
    manager: Annotated[str, typer.Option(help="Manager HOST:PORT.")] = (
        f"127.0.0.1:{DEFAULT_MANAGER_PORT}"),
    universe: UniverseOption = "default",
    token: TokenOption = "",
    identity: IdentityOption = "",
    timeout: TimeoutOption = 10.0,
) -> None:
    """Switch a replicated group's master by hand: the member (it must be in sync with
    the master) is master at the next epoch, the old master steps down and copies it.
    Waits until the member says it is master."""
    from ..admin import master_switched, switch_master

    address = guard(lambda: Address.parse(manager, default_port=DEFAULT_MANAGER_PORT))
    info = interruptible(lambda: run_trio(lambda: switch_master(
        universe, address, group, to, token=token, identity=identity or None,
        timeout=timeout)))
    out.print(master_switched(group, info), highlight=False)
