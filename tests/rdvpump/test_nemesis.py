"""The network nemesis (:mod:`rdvpump.nemesis`) on real namespaces: a host cut off
silently, a split, a hung host; what the brokers make of each.  Skipped, with the
reason, where the machine cannot make namespaces (root and iproute2)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence

import pytest
import trio

from pump import ConfigError
from rdvpump.nemesis import ACTIONS, IMPAIR, Fault, Network, schedule
from tests.mq.test_cluster_processes import Lines

RDVPUMP = [sys.executable, "-m", "rdvpump"]
ENV = {**os.environ, "RDVPUMP_TOKEN": "tok"}
Make = Callable[[Sequence[str]], Network]


def test_a_schedule_is_a_function_of_its_seed() -> None:
    hosts = ["m", "a", "b", "c", "d"]
    one = schedule(7, hosts, faults=5)
    assert one == schedule(7, hosts, faults=5) and one != schedule(8, hosts, faults=5)
    assert {f.action for f in schedule(1, hosts, faults=50)} == {"cut", "split", "bridge",
                                                                 "pause", "crash"}
    for fault in schedule(3, hosts, faults=50):
        assert fault.hosts and set(fault.hosts) <= set(hosts)
        if fault.action == "split":  # a minority on one side
            assert len(fault.hosts) * 2 < len(hosts)
        if fault.action == "bridge":  # a host between two sides, neither of them empty
            assert 2 <= len(fault.hosts) < len(hosts) and fault.hosts[0] not in fault.hosts[1:]
    drawn = schedule(5, hosts, faults=40, actions=(*ACTIONS, IMPAIR))
    impaired = [f for f in drawn if f.action == IMPAIR]
    assert impaired and all(0 <= f.impairment[1] <= f.impairment[0] <= 0.1
                            and 0 <= f.impairment[2] <= 0.05 and f.impairment[3] <= 0.02
                            for f in impaired)
    assert not any(f.action == "bridge" for f in schedule(1, ["a", "b"], faults=30))
    with pytest.raises(ConfigError, match="actions are among"):
        schedule(1, hosts, actions=("flood",))
    ends = [(f.at, f.at + f.lasting) for f in one]
    assert all(end <= start for (_, end), (start, _) in zip(ends, ends[1:], strict=False))


async def manager_on(net: Network, host: str) -> str:
    address = f"{net.hosts[host].address}:9876"
    proc = await net.spawn(host, [*RDVPUMP, "manager", "serve", "--universe", "k",
                                  "--listen", address], env=ENV)
    await Lines(proc).address()
    return address


async def known(net: Network, host: str, manager: str) -> str:
    shown = await trio.run_process(
        net.hosts[host].command([*RDVPUMP, "status", "--universe", "k", "--manager",
                                 manager, "--timeout", "5"]),
        capture_stdout=True, env={**ENV, "COLUMNS": "200"})
    return shown.stdout.decode()


async def three_primaries(net: Network, tmp_path: os.PathLike[str], manager: str
                          ) -> dict[str, Lines]:
    """MQ servers a, b and c of a cluster of three primaries, on hosts of those names,
    once each says a is root."""
    import pathlib

    from tests.mq.test_cluster_processes import cluster_file

    shop = cluster_file(pathlib.Path(tmp_path) / "shop.toml",
                        [("a", "primary"), ("b", "primary"), ("c", "primary")])
    lines = {}
    for name in ("a", "b", "c"):
        state = pathlib.Path(tmp_path) / name
        state.mkdir()
        proc = await net.spawn(name, [
            *RDVPUMP, "broker", "run", "--universe", "k", "--id", name, "--cluster", shop,
            "--state-dir", str(state), "--role", "server", "--mq-dir", str(state),
            "--manager", manager, "--listen", f"{net.hosts[name].address}:0"], env=ENV)
        lines[name] = Lines(proc)
    for name in "abc":
        await lines[name].until("(2 of 2 peers); root a")
    return lines


@pytest.mark.slow
async def test_a_broker_cut_off_silently_is_dropped_by_the_manager_in_seconds(
        nemesis: Make) -> None:
    """No FIN, no RST: keepalive and TCP_USER_TIMEOUT close the manager's connection to
    the cut-off broker within seconds, where the name service's expiry is 120 s."""
    net = nemesis(["m", "far"])
    manager = await manager_on(net, "m")
    broker = await net.spawn("far", [*RDVPUMP, "broker", "run", "--universe", "k", "--id",
                                     "far", "--manager", manager, "--listen",
                                     f"{net.hosts['far'].address}:0"], env=ENV)
    await Lines(broker).address()
    assert " far " in await known(net, "m", manager)
    net.cut("far")
    cut_at = trio.current_time()
    with trio.fail_after(30):
        while " far " in await known(net, "m", manager):
            await trio.sleep(0.5)  # polled: the manager's table, bounded
    assert trio.current_time() - cut_at < 15


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["cut", "pause", "split"])
async def test_a_cluster_root_cut_off_hung_or_split_away_is_replaced(
        nemesis: Make, tmp_path: os.PathLike[str], fault: str) -> None:
    """Three primaries on three hosts: the root's host cut off, its process stopped, or
    the root alone on one side of a split; the two others elect b (the root's peers
    count it out after the silence timeout); healed, a is root again at a newer epoch
    and the three agree."""
    net = nemesis(["m", "a", "b", "c"])
    lines = await three_primaries(net, tmp_path, await manager_on(net, "m"))
    seen = {name: len(lines[name].seen) for name in "abc"}
    began = trio.current_time()
    {"cut": lambda: net.cut("a"), "pause": lambda: net.pause("a"),
     "split": lambda: net.split(["a"])}[fault]()
    for name in "bc":
        await _until_or_all(lines, name, "a silent)", "root b", after=seen[name])
    took = trio.current_time() - began
    assert took < 5, took
    net.heal()
    net.resume("a")
    for name in "abc":
        await lines[name].until("(2 of 2 peers); root a", after=seen[name])


async def _until_or_all(lines: dict[str, Lines], name: str, *needles: str, after: int
                        ) -> str:
    """:meth:`Lines.until` on ``name``'s lines; if none comes, the error holds every
    server's lines (what one server saw rarely says why the others did what they did)."""
    try:
        return await lines[name].until(*needles, after=after)
    except AssertionError as exc:
        for other in lines.values():
            if other.proc.returncode is None:
                await other.drain()
        said = {n: other.seen for n, other in lines.items()}
        raise AssertionError(f"{name}: no line with {needles} after line {after}; the "
                             f"servers' stderr: {said}") from exc


def test_a_fault_says_what_it_does() -> None:
    assert Fault(1.5, "split", ("a", "b"), 2.0).label == "1.50s split a,b for 2.00s"
    assert (Fault(0, "bridge", ("c", "a"), 1.0).label
            == "0.00s bridge c between a and the rest for 1.00s")
    assert (Fault(0, "impair", (), 1.0, (0.05, 0.02, 0.02, 0.01)).label
            == "0.00s impair 50+/-20ms loss 2.0% dup 1.0% for 1.00s")


#: Seconds of a slow, lossy network in the no-false-alarm test (longer runs:
#: RDVPUMP_CALM_SECONDS=300).
CALM = float(os.environ.get("RDVPUMP_CALM_SECONDS", "8"))


@pytest.mark.slow
async def test_a_slow_lossy_network_replaces_nobody(nemesis: Make, tmp_path: os.PathLike[str]
                                                    ) -> None:
    """50 +/- 20 ms on every frame and 2 % of them lost, for CALM seconds: no server is
    counted out, the root stays, and publishes through another server keep being
    acknowledged by it."""
    net = nemesis(["m", "a", "b", "c"], impairable=True)
    lines = await three_primaries(net, tmp_path, await manager_on(net, "m"))
    on_c = f"c@{await lines['c'].address()}"
    declared = await trio.run_process(net.hosts["m"].command(
        [*RDVPUMP, "mq", "declare", "orders", "--shared", "--server", on_c, "--universe",
         "k"]), capture_stdout=True, env=ENV)
    assert declared.stdout.startswith(b"declared orders")
    before = {}
    for name in "abc":
        await lines[name].drain()
        before[name] = len(lines[name].seen)
    net.impair(delay=0.05, jitter=0.02, loss=0.02)
    end = trio.current_time() + CALM
    published = 0
    while trio.current_time() < end:
        done = await trio.run_process(net.hosts["m"].command(
            [*RDVPUMP, "mq", "publish", "orders", "--server", on_c, "--universe", "k",
             "--timeout", "30"]), stdin=b"m\n", capture_stdout=True, env=ENV)
        assert done.stdout.startswith(b"published 1 to orders on a:15555"), done.stdout
        published += 1
        await trio.sleep(1)  # a publish a second through the slow network
    assert published >= CALM / 4
    for name in "abc":
        await lines[name].drain()
        said = lines[name].seen[before[name]:]
        assert not [line for line in said if "silent" in line or "steps down" in line
                    or "no root" in line], said



@pytest.mark.slow
async def test_a_slow_lossy_network_fails_no_group_over(nemesis: Make,
                                                        tmp_path: os.PathLike[str]) -> None:
    """The same network under a ``sync`` group of three, every setting at its default
    (its members beat to the manager every 0.1 s; a master silent for 0.5 s whose slaves
    have not heard it for 0.4 s either is dropped, any member after 1 s of silence):
    for CALM seconds s0 stays master, so that every publish there is acknowledged (a
    member that took over would make s0 a slave, which refuses writes)."""
    import pathlib

    net = nemesis(["m", "s0", "s1", "s2"], impairable=True)
    manager = await manager_on(net, "m")
    where = {}
    for i in range(3):
        name = f"s{i}"
        proc = await net.spawn(name, [
            *RDVPUMP, "broker", "run", "--universe", "k", "--id", name, "--manager", manager,
            "--listen", f"{net.hosts[name].address}:0", "--role", "server", "--mq-dir",
            str(pathlib.Path(tmp_path) / name), "--group", "a", "--group-id", str(i),
            "--replication", "sync"], env=ENV)
        where[name] = await Lines(proc).address()

    async def mq(*args: str, stdin: bytes = b"") -> bytes:
        done = await trio.run_process(
            net.hosts["m"].command([*RDVPUMP, "mq", *args, "--server", f"s0@{where['s0']}",
                                    "--universe", "k"]), stdin=stdin, capture_stdout=True,
            capture_stderr=True, env=ENV, check=False)
        return bytes(done.stdout)

    with trio.fail_after(60):  # the master confirmed, its slaves in sync: polled, bounded
        while not (await mq("declare", "orders")).startswith(b"declared"):
            await trio.sleep(0.2)
        while not (await mq("publish", "orders", stdin=b"m\n")).startswith(b"published"):
            await trio.sleep(0.2)
    net.impair(delay=0.05, jitter=0.02, loss=0.02)
    end = trio.current_time() + CALM
    published = 0
    while trio.current_time() < end:
        said = await mq("publish", "orders", "--timeout", "30", stdin=b"m\n")
        assert said.startswith(b"published 1 to orders on s0:15555"), said
        published += 1
        await trio.sleep(1)  # a publish a second through the slow network
    assert published >= CALM / 4


#: The seeds of the schedules the suite plays (more: RDVPUMP_NEMESIS_SEEDS=0-49, or
#: ``rdvpump bench nemesis`` for a group's).
SEEDS = os.environ.get("RDVPUMP_NEMESIS_SEEDS", "1")


def _seeds() -> list[int]:
    first, _, last = SEEDS.partition("-")
    return list(range(int(first), int(last or first) + 1))


@pytest.mark.slow
@pytest.mark.parametrize("seed", _seeds())
async def test_a_seeded_schedule_of_faults_loses_no_acknowledged_message(
        nemesis: Make, tmp_path: os.PathLike[str], seed: int) -> None:
    """A ``sync`` group of three while a schedule drawn from ``seed`` cuts, splits,
    bridges, pauses, crashes and impairs (delay, jitter, loss, duplicates) its hosts, as
    ``bench nemesis`` plays it: a producer and a consumer on hosts of their own follow
    the master the name service names throughout; once the network is whole again the
    history checker finds no acknowledged message lost, none stored twice or out of
    order, no offset with two messages and no epoch with two masters, and publishes are
    acknowledged again."""
    import pathlib

    from rdvpump.bench.nemesis_runs import HOSTS, play

    net = nemesis(HOSTS, impairable=True)
    result = await play(net, seed, pathlib.Path(tmp_path))
    assert result.ok, result.to_dict()
    assert result.acknowledged >= 100 and result.deliveries >= result.acknowledged, (
        result.to_dict())


@pytest.mark.slow
@pytest.mark.parametrize("seed", _seeds())
async def test_a_seeded_schedule_of_faults_never_gives_a_cluster_two_roots_or_loses_a_message(
        nemesis: Make, tmp_path: os.PathLike[str], seed: int) -> None:
    """Three primaries of a cluster while a schedule drawn from ``seed`` cuts, splits,
    bridges, pauses, crashes and impairs their hosts, as ``bench nemesis --cluster``
    plays it: a producer and a consumer of a shared topic on hosts of their own move to
    the next server when one fails them; every server's log of the roots it became
    names at most one root an epoch, no two servers acknowledge as root in one epoch,
    no acknowledged message is lost, and publishes are acknowledged again once the
    network is whole."""
    import pathlib

    from rdvpump.bench.nemesis_runs import CLUSTER_HOSTS, play_cluster

    net = nemesis(CLUSTER_HOSTS, impairable=True)
    result = await play_cluster(net, seed, pathlib.Path(tmp_path))
    assert result.ok, result.to_dict()
    assert result.root_epochs and result.acknowledged >= 100, result.to_dict()
    assert result.deliveries >= result.acknowledged, result.to_dict()

