"""A network nemesis: real processes on hosts of their own, and faults a test injects or
draws from a seed, as Jepsen does to databases.

Each host is a Linux network namespace with one address (``10.66.N.i``), joined by a
veth pair to a bridge in a namespace of the network's own; nothing touches the
machine's own interfaces, and several networks can run at once.  Faults:

* :meth:`Network.cut` a host off, or :meth:`Network.split` the hosts in two sides (or in
  two sides and a bridge that hears both: ``split(side, other)``), silently: the frames
  go nowhere (a ``tc`` filter redirects them to a veth whose peer is down), so no FIN or
  RST says that anything happened, as when a cable is pulled or a switch fails;
  :meth:`Network.heal` ends every cut and split;
* :meth:`Network.pause` (SIGSTOP) and :meth:`Network.resume` a host's processes,
  :meth:`Network.crash` them (SIGKILL) and :meth:`Network.restart` them with the same
  command lines.

:func:`schedule` draws faults from a seed (the same seed, the same schedule), and
:meth:`Network.play` runs one against a live network.

Latency, jitter, loss and duplication (:meth:`Network.impair`) come from a switch in user
space (:mod:`rdvpump._switch`, ``Network(..., impairable=True)``) in place of the kernel's
bridge, since not every kernel has ``sch_netem``: each frame delayed by its own draw, so
that jitter reorders frames as netem's does.  The hosts' veths then compute their own
checksums and send whole frames (``ethtool``), which a switch that copies frames needs.

It needs root and iproute2 (``ip``, ``tc``), and ethtool for an impairable network;
:func:`unavailable` says why not where it cannot run, and the ``nemesis`` pytest fixture
skips with that reason.  Every namespace
is removed, and every process it started killed and reaped, when the network closes.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import trio

from pump import ConfigError

#: What :func:`schedule` draws from by default: a host cut off, a minority split away, a
#: bridge (two sides that cannot hear each other, and one host that hears both), a host's
#: processes paused (SIGSTOP) or crashed (SIGKILL, then restarted).
ACTIONS = ("cut", "split", "bridge", "pause", "crash")
#: ``impair``: every frame delayed, jittered (so reordered), lost and duplicated, from
#: draws (a network made ``impairable``; :meth:`Network.impair`).
IMPAIR = "impair"


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, timeout=10)
    if done.returncode != 0:
        raise OSError(f"ip {' '.join(args)}: {done.stderr.decode().strip()}")


def unavailable(*, impairable: bool = False) -> str | None:
    """Why this machine cannot run a network (None: it can)."""
    if sys.platform != "linux":
        return "network namespaces are Linux's"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "needs iproute2 (ip and tc): apt-get install iproute2"
    if impairable and shutil.which("ethtool") is None:
        return "needs ethtool for the user-space switch: apt-get install ethtool"
    if os.geteuid() != 0:
        return "needs root to make network namespaces"
    probe = f"rdvprobe{uuid.uuid4().hex[:6]}"
    try:
        _ip("netns", "add", probe)
    except OSError as exc:
        return f"cannot make a network namespace: {exc}"
    _ip("netns", "del", probe)
    return None


@dataclass
class Host:
    """One host: its namespace, its address, and the processes run on it."""

    name: str
    namespace: str
    address: str
    device: str
    processes: list[trio.Process] = field(default_factory=list)
    #: What it ran: each command's arguments, and its env, stdout, stderr and stdin.
    commands: list[tuple[list[str], dict[str, Any]]] = field(default_factory=list)

    def command(self, args: Sequence[str]) -> list[str]:
        """``args`` as run on this host."""
        return ["ip", "netns", "exec", self.namespace, *args]


class Network:
    """Hosts named ``hosts`` on one bridge; use as a context manager."""

    def __init__(self, hosts: Sequence[str], *, subnet: int | None = None,
                 impairable: bool = False, seed: int = 0) -> None:
        if not hosts or len(set(hosts)) != len(hosts) or len(hosts) > 200:
            raise ConfigError("a network needs 1 to 200 hosts, each named once")
        tag = uuid.uuid4().hex[:6]
        self.tag = tag
        subnet = random.randrange(1, 250) if subnet is None else subnet
        self.switch = f"rdvsw{tag}"
        self.hosts = {name: Host(name, f"rdv{tag}{i}", f"10.66.{subnet}.{i + 1}",
                                 f"eth{i}")
                      for i, name in enumerate(hosts)}
        self._cut: set[str] = set()
        self._made: list[str] = []
        #: The user-space switch (:meth:`impair`), when the network is impairable.
        self.impairable = impairable
        self.seed = seed
        self._switch: subprocess.Popen[bytes] | None = None

    # -- life ----------------------------------------------------------------------------

    def __enter__(self) -> Network:
        try:
            self._make()
        except BaseException:
            self.close_namespaces()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close_namespaces()

    def _make(self) -> None:
        _ip("netns", "add", self.switch)
        self._made.append(self.switch)
        if not self.impairable:
            _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.switch, "link", "set", "br0", "up")
        for i, host in enumerate(self.hosts.values()):
            _ip("netns", "add", host.namespace)
            self._made.append(host.namespace)
            _ip("link", "add", host.device, "netns", host.namespace, "type", "veth", "peer",
                "name", f"port{i}", "netns", self.switch)
            if self.impairable:
                _ip("-n", self.switch, "link", "set", f"port{i}", "up")
                done = subprocess.run(
                    ["ip", "netns", "exec", host.namespace, "ethtool", "-K", host.device,
                     "tx", "off", "tso", "off", "gso", "off", "gro", "off"],
                    capture_output=True, timeout=10)
                if done.returncode != 0:
                    raise OSError(f"ethtool on {host.name}: {done.stderr.decode().strip()}")
            else:
                _ip("-n", self.switch, "link", "set", f"port{i}", "master", "br0", "up")
            _ip("-n", host.namespace, "link", "set", "lo", "up")
            _ip("-n", host.namespace, "addr", "add", f"{host.address}/16", "dev", host.device)
            _ip("-n", host.namespace, "link", "set", host.device, "up")
            # where a cut sends frames: a veth whose peer stays down
            _ip("-n", host.namespace, "link", "add", "hole", "type", "veth", "peer", "name",
                "hole-peer")
            _ip("-n", host.namespace, "link", "set", "hole", "up")
            self._tc(host, "qdisc", "add", "dev", host.device, "clsact")
        if self.impairable:
            ports = ",".join(f"port{i}" for i in range(len(self.hosts)))
            self._switch = subprocess.Popen(
                ["ip", "netns", "exec", self.switch, sys.executable, "-m", "rdvpump._switch",
                 "--ports", ports, "--seed", str(self.seed)], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE)
            assert self._switch.stdout is not None
            if self._switch.stdout.readline().strip() != b"ready":
                raise OSError("the nemesis's switch did not start")

    def impair(self, *, delay: float = 0.0, jitter: float = 0.0, loss: float = 0.0,
               duplicate: float = 0.0) -> None:
        """Every frame between hosts from now on: delayed ``delay`` seconds plus a uniform
        draw within ``jitter``, lost with probability ``loss``, sent twice with probability
        ``duplicate`` (all zero: a plain switch)."""
        if self._switch is None or self._switch.stdin is None:
            raise ConfigError("impair needs Network(..., impairable=True)")
        if not (delay >= 0 and 0 <= jitter <= max(delay, jitter) and 0 <= loss < 1
                and 0 <= duplicate < 1):
            raise ConfigError("delay and jitter are seconds (0 or more); loss and duplicate "
                              "probabilities below 1")
        self._switch.stdin.write(f"{delay} {jitter} {loss} {duplicate}\n".encode())
        self._switch.stdin.flush()

    def close_namespaces(self) -> None:
        """Remove every namespace (the processes left in them keep running: see
        :meth:`aclose`)."""
        if self._switch is not None:
            self._switch.kill()
            self._switch.wait(timeout=10)
            for pipe in (self._switch.stdin, self._switch.stdout):
                if pipe is not None:
                    pipe.close()
            self._switch = None
        for namespace in reversed(self._made):
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True,
                           timeout=10)
        self._made.clear()

    async def aclose(self) -> None:
        """Kill and reap every process started on the network's hosts."""
        for host in self.hosts.values():
            for proc in host.processes:
                await _kill(proc)

    # -- processes -----------------------------------------------------------------------

    async def spawn(self, host: str, args: Sequence[str], *, env: dict[str, str] | None = None,
                    stdout: int | None = subprocess.PIPE,
                    stderr: int | None = subprocess.PIPE,
                    stdin: int | None = None) -> trio.Process:
        """Start ``args`` on ``host`` (remembered for :meth:`restart`, with where its
        output goes: a file descriptor given is written to again by the restarted
        process, a pipe is a new one)."""
        where = self.hosts[host]
        proc = await trio.lowlevel.open_process(where.command(args), env=env, stdout=stdout,
                                                stderr=stderr, stdin=stdin)
        where.processes.append(proc)
        where.commands.append((list(args), {"env": env, "stdout": stdout, "stderr": stderr,
                                            "stdin": stdin}))
        return proc

    def pause(self, host: str) -> None:
        """SIGSTOP every process of ``host``: hung, its connections open."""
        self._signal(host, signal.SIGSTOP)

    def resume(self, host: str) -> None:
        self._signal(host, signal.SIGCONT)

    async def crash(self, host: str) -> None:
        """SIGKILL every process of ``host`` (reaped)."""
        for proc in self.hosts[host].processes:
            await _kill(proc)

    async def restart(self, host: str) -> list[trio.Process]:
        """Start again, on ``host``, every command it ran (crashed first if alive)."""
        where = self.hosts[host]
        await self.crash(host)
        commands, where.commands, where.processes = where.commands, [], []
        return [await self.spawn(host, args, **how) for args, how in commands]

    def _signal(self, host: str, sig: signal.Signals) -> None:
        for proc in self.hosts[host].processes:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(sig)

    # -- the network ---------------------------------------------------------------------

    def cut(self, host: str) -> None:
        """``host`` hears nothing and is heard by no one, silently, until :meth:`heal`."""
        self._drop(self.hosts[host], None)

    def split(self, side: Sequence[str], other: Sequence[str] | None = None) -> None:
        """No frame crosses between ``side`` and ``other`` (by default every other host),
        silently, until :meth:`heal`; each side still hears itself."""
        rest = [h for h in self.hosts if h not in side] if other is None else list(other)
        for mine, theirs in ((side, rest), (rest, side)):
            for name in mine:
                for peer in theirs:
                    self._drop(self.hosts[name], self.hosts[peer].address)

    def heal(self) -> None:
        """Every cut and split ends."""
        for host in self.hosts.values():
            if host.name in self._cut:
                self._tc(host, "qdisc", "del", "dev", host.device, "clsact")
                self._tc(host, "qdisc", "add", "dev", host.device, "clsact")
        self._cut.clear()

    def _drop(self, host: Host, peer: str | None) -> None:
        """Frames between ``host`` and ``peer``'s address (None: everyone) go nowhere."""
        for direction, match in (("egress", "dst"), ("ingress", "src")):
            what = (["u32", "match", "u32", "0", "0"] if peer is None
                    else ["u32", "match", "ip", match, f"{peer}/32"])
            self._tc(host, "filter", "add", "dev", host.device, direction, "protocol", "all"
                     if peer is None else "ip", *what, "action", "mirred", "egress",
                     "redirect", "dev", "hole")
        self._cut.add(host.name)

    def _tc(self, host: Host, *args: str) -> None:
        done = subprocess.run(["ip", "netns", "exec", host.namespace, "tc", *args],
                              capture_output=True, timeout=10)
        if done.returncode != 0:
            raise OSError(f"tc {' '.join(args)} on {host.name}: "
                          f"{done.stderr.decode().strip()}")

    # -- schedules -----------------------------------------------------------------------

    async def play(self, faults: Sequence[Fault]) -> None:
        """Run ``faults`` (each at its time, in seconds from now), each healed, resumed or
        restarted at its end."""
        start = trio.current_time()
        events = sorted([(f.at, 0, f) for f in faults] + [(f.at + f.lasting, 1, f)
                                                         for f in faults],
                        key=lambda e: (e[0], e[1]))
        for at, end, fault in events:
            await trio.sleep_until(start + at)
            if not end:
                await self._begin(fault)
            else:
                await self._end(fault)

    async def _begin(self, fault: Fault) -> None:
        if fault.action == "cut":
            self.cut(fault.hosts[0])
        elif fault.action == "split":
            self.split(fault.hosts)
        elif fault.action == "bridge":  # the first host hears both sides of the rest
            rest = [h for h in self.hosts if h not in fault.hosts]
            self.split(fault.hosts[1:], rest)
        elif fault.action == IMPAIR:
            delay, jitter, loss, duplicate = fault.impairment
            self.impair(delay=delay, jitter=jitter, loss=loss, duplicate=duplicate)
        elif fault.action == "pause":
            self.pause(fault.hosts[0])
        elif fault.action == "crash":
            await self.crash(fault.hosts[0])

    async def _end(self, fault: Fault) -> None:
        if fault.action in ("cut", "split", "bridge"):
            self.heal()
        elif fault.action == IMPAIR:
            self.impair()
        elif fault.action == "pause":
            self.resume(fault.hosts[0])
        elif fault.action == "crash":
            await self.restart(fault.hosts[0])


@dataclass(frozen=True)
class Fault:
    """One fault of a schedule: ``action`` on ``hosts`` (a split's one side; a bridge's
    host, then one side of the others), ``at`` seconds in, for ``lasting`` seconds; an
    impairment's ``(delay, jitter, loss, duplicate)`` on every frame."""

    at: float
    action: str
    hosts: tuple[str, ...]
    lasting: float
    impairment: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)

    @property
    def label(self) -> str:
        if self.action == IMPAIR:
            delay, jitter, loss, duplicate = self.impairment
            what = (f"{delay * 1000:.0f}+/-{jitter * 1000:.0f}ms loss {loss:.1%} "
                    f"dup {duplicate:.1%}")
        elif self.action == "bridge":
            what = f"{self.hosts[0]} between {','.join(self.hosts[1:])} and the rest"
        else:
            what = ",".join(self.hosts)
        return f"{self.at:.2f}s {self.action} {what} for {self.lasting:.2f}s"


def schedule(seed: int, hosts: Sequence[str], *, faults: int = 3, within: float = 10.0,
             lasting: tuple[float, float] = (1.0, 4.0),
             actions: Sequence[str] = ACTIONS) -> list[Fault]:
    """``faults`` faults one after another (each healed before the next), drawn from
    ``seed``: the same seed and hosts, the same schedule.  A split puts a minority of the
    hosts on one side; a bridge (three hosts or more) one host between two sides of the
    others; an impairment (in ``actions`` only if asked: it needs an impairable network)
    delays every frame up to 100 ms, with jitter up to as much, and loses and duplicates
    up to 5 % and 2 % of them."""
    unknown = [a for a in actions if a not in (*ACTIONS, IMPAIR)]
    if unknown or not actions:
        raise ConfigError(f"actions are among {', '.join((*ACTIONS, IMPAIR))}, got "
                          f"{unknown}")
    rng = random.Random(seed)
    out, at = [], 0.0
    choices = [a for a in actions if a != "bridge" or len(hosts) >= 3]
    for _ in range(faults):
        at += rng.uniform(0, within / max(faults, 1))
        action = rng.choice(choices)
        impairment = (0.0, 0.0, 0.0, 0.0)
        if action == "split" and len(hosts) > 1:
            side = tuple(sorted(rng.sample(list(hosts), rng.randint(1, (len(hosts) - 1) // 2
                                                                    or 1))))
        elif action == "bridge":
            bridge = rng.choice(list(hosts))
            rest = [h for h in hosts if h != bridge]
            side = (bridge, *sorted(rng.sample(rest, rng.randint(1, len(rest) - 1))))
        elif action == IMPAIR:
            side = ()
            delay = rng.uniform(0, 0.1)
            impairment = (round(delay, 4), round(rng.uniform(0, delay), 4),
                          round(rng.uniform(0, 0.05), 4), round(rng.uniform(0, 0.02), 4))
        else:
            side = (rng.choice(list(hosts)),)
        length = rng.uniform(*lasting)
        out.append(Fault(round(at, 3), action, side, round(length, 3), impairment))
        at += length
    return out


async def _kill(proc: trio.Process) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGCONT)
            proc.kill()
    with trio.move_on_after(10):
        await proc.wait()


@contextlib.contextmanager
def network(hosts: Sequence[str], *, impairable: bool = False) -> Iterator[Network]:
    """:class:`Network` as a context manager (:func:`unavailable` first: ConfigError with
    the reason where it cannot run)."""
    why = unavailable(impairable=impairable)
    if why is not None:
        raise ConfigError(why)
    with Network(hosts, impairable=impairable) as made:
        yield made
