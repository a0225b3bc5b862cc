"""Universe files (TOML): read and checked into frozen specs before anything runs.

:func:`load_universe` names the file and the field of every problem; what would fail
once running (a message over the largest size, one port serving two kinds) is said
here too, the same for ``universe run`` and ``universe up``.  :func:`random_faults`
draws ``universe explore``'s faults: a pure function of the file and the seed.
"""

from __future__ import annotations

import math
import random
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from brokermgr.tracking import DEFAULT_TRACK_PORT
from channels import DEFAULT_MAX_MESSAGE_SIZE, DEFAULT_RING_CAPACITY
from pump import RdvpumpError

from .testing import ACTIONS

KINDS = ("echo", "stream", "fanout", "mq")
_UNIVERSE_KEYS = {"name", "ring_capacity", "seed", "token"}
_BROKER_KEYS = {"id"}
_WORKLOAD_KEYS = {"kind", "from", "to", "port", "messages", "size"}
#: What each fault action takes, besides ``at`` (virtual seconds) and ``action``.
FAULT_ARGS: dict[str, tuple[str, ...]] = {
    "partition": ("a", "b"), "heal": ("a", "b"), "hold": ("link",), "release": ("link",),
    "delay": ("link", "seconds", "jitter"), "drop": ("link", "probability"),
    "crash": ("broker",), "restart": ("broker",),
}
_EXPLORE_KEYS = {"faults", "within", "lasting", "actions"}


class UniverseFileError(RdvpumpError, ValueError):
    """A universe file that cannot be used, with the file and the field in the message."""


@dataclass(frozen=True)
class WorkloadSpec:
    kind: str
    source: str
    targets: tuple[str, ...]
    port: int
    messages: int
    size: int

    @property
    def label(self) -> str:
        return f"{self.kind} {self.source}->{','.join(self.targets)}:{self.port}"


@dataclass(frozen=True)
class FaultSpec:
    """One ``[[fault]]``: an action of :class:`rdvpump.testing.Faults` at a virtual time."""

    at: float
    action: str
    args: tuple[tuple[str, Any], ...]

    def kwargs(self) -> dict[str, Any]:
        return dict(self.args)

    @property
    def label(self) -> str:
        what = " ".join(f"{k}={'-'.join(v) if isinstance(v, list | tuple) else v}"
                        for k, v in self.args)
        return f"{self.at:g}s {self.action} {what}"


@dataclass(frozen=True)
class ExploreSpec:
    """The ``[explore]`` table: the fault budget of ``universe explore``, per seed."""

    faults: int = 2
    within: float = 0.05
    lasting: float = 0.5
    actions: tuple[str, ...] = ("partition", "hold", "delay")


@dataclass(frozen=True)
class UniverseSpec:
    name: str
    brokers: tuple[str, ...]
    workloads: tuple[WorkloadSpec, ...]
    ring_capacity: int = DEFAULT_RING_CAPACITY
    seed: int = 0
    token: str = ""
    faults: tuple[FaultSpec, ...] = ()
    #: The ``[explore]`` table, if the file has one: random faults drawn from the seed
    #: join the file's own in every run of it.
    explore: ExploreSpec | None = None

    def all_faults(self) -> tuple[FaultSpec, ...]:
        """The file's faults and, with an ``[explore]`` table, those drawn from the seed."""
        if self.explore is None:
            return self.faults
        return tuple(sorted(self.faults + random_faults(self, self.seed), key=lambda f: f.at))

    def roles(self, broker_id: str) -> tuple[list[tuple[str, int]], list[WorkloadSpec]]:
        """What ``broker_id`` serves (kind, port) and which workloads it drives."""
        serves = sorted({(w.kind if w.kind in ("echo", "mq") else "sink", w.port)
                         for w in self.workloads if broker_id in w.targets})
        drives = [w for w in self.workloads if w.source == broker_id]
        return serves, drives


def _check_keys(where: str, table: dict[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise UniverseFileError(f"{where}: unknown field {unknown[0]!r} "
                                f"(allowed: {', '.join(sorted(allowed))})")


def _int(where: str, table: dict[str, Any], key: str, default: int | None, low: int) -> int:
    value = table.get(key, default)
    if value is None:
        raise UniverseFileError(f"{where}: missing field {key!r}")
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise UniverseFileError(f"{where}: {key} must be an integer >= {low}, got {value!r}")
    return value


def load_universe(path: str | Path) -> UniverseSpec:
    """Read and check a universe file; every problem names the file and the field."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise UniverseFileError(f"{path}: no such file") from None
    except tomllib.TOMLDecodeError as exc:
        raise UniverseFileError(f"{path}: not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise UniverseFileError(f"{path}: not valid TOML: not UTF-8 text (byte "
                                f"{exc.object[exc.start]:#04x} at offset {exc.start})") from None
    _check_keys(str(path), data, {"universe", "broker", "workload", "fault", "explore"})
    uni = data.get("universe", {})
    _check_keys(f"{path} [universe]", uni, _UNIVERSE_KEYS)
    name = uni.get("name")
    if not isinstance(name, str) or not name:
        raise UniverseFileError(f"{path} [universe]: name must be a non-empty string")
    brokers = _brokers(path, data.get("broker", []))
    workloads = [_workload(f"{path} [[workload]] #{i + 1}", w, brokers)
                 for i, w in enumerate(data.get("workload", []))]
    if not brokers:
        raise UniverseFileError(f"{path}: a universe needs at least one [[broker]]")
    _check_runnable(path, workloads)
    ring = _int(f"{path} [universe]", uni, "ring_capacity", DEFAULT_RING_CAPACITY, 1)
    if ring & (ring - 1):
        raise UniverseFileError(f"{path} [universe]: ring_capacity must be a power of two")
    faults = tuple(_fault(f"{path} [[fault]] #{i + 1}", f, brokers)
                   for i, f in enumerate(data.get("fault", [])))
    return UniverseSpec(name, tuple(brokers), tuple(workloads), ring,
                        _int(f"{path} [universe]", uni, "seed", 0, 0), str(uni.get("token", "")),
                        faults, None if "explore" not in data else
                        _explore(f"{path} [explore]", data["explore"]))


def _brokers(path: Path, tables: list[Any]) -> list[str]:
    """The ``[[broker]]`` tables' ids: each a non-empty string not starting with ``@``,
    none twice."""
    brokers: list[str] = []
    for i, b in enumerate(tables):
        where = f"{path} [[broker]] #{i + 1}"
        _check_keys(where, b, _BROKER_KEYS)
        if not isinstance(b.get("id"), str) or not b["id"] or b["id"].startswith("@"):
            raise UniverseFileError(f"{where}: id must be a non-empty string not starting "
                                    "with '@'")
        if b["id"] in brokers:
            raise UniverseFileError(f"{where}: duplicate broker id {b['id']!r}")
        brokers.append(b["id"])
    return brokers


def _workload(where: str, w: dict[str, Any], brokers: list[str]) -> WorkloadSpec:
    """One ``[[workload]]`` table, between brokers of the file."""
    _check_keys(where, w, _WORKLOAD_KEYS)
    kind = w.get("kind")
    if kind not in KINDS:
        raise UniverseFileError(f"{where}: kind must be one of {', '.join(KINDS)}, "
                                f"got {kind!r}")
    source, targets = w.get("from"), w.get("to")
    if isinstance(targets, str):
        targets = [targets]
    if not isinstance(targets, list) or not targets or not all(
            isinstance(t, str) for t in targets):
        raise UniverseFileError(f"{where}: to must be a broker id or a list of them")
    if kind == "mq" and "port" not in w:
        w = {**w, "port": DEFAULT_TRACK_PORT}
    if kind != "fanout" and len(targets) != 1:
        raise UniverseFileError(f"{where}: {kind} goes to exactly one broker")
    for who in [source, *targets]:
        if who not in brokers:
            raise UniverseFileError(f"{where}: unknown broker {who!r}")
    return WorkloadSpec(kind, str(source), tuple(targets), _int(where, w, "port", 80, 0),
                        _int(where, w, "messages", None, 1), _int(where, w, "size", None, 0))


def _seconds(where: str, value: object, what: str) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or not value >= 0 \
            or not math.isfinite(value):
        raise UniverseFileError(f"{where}: {what} must be a number of seconds >= 0, "
                                f"got {value!r}")
    return float(value)


def _fault(where: str, table: dict[str, Any], brokers: list[str]) -> FaultSpec:
    action = table.get("action")
    if action not in FAULT_ARGS:
        raise UniverseFileError(f"{where}: action must be one of {', '.join(ACTIONS)}, "
                                f"got {action!r}")
    _check_keys(where, table, {"at", "action", *FAULT_ARGS[action]})
    at = _seconds(where, table.get("at"), "at")
    args: list[tuple[str, Any]] = []
    for key in FAULT_ARGS[action]:
        value = table.get(key)
        if key == "jitter" and value is None:
            value = 0.0
        if value is None:
            raise UniverseFileError(f"{where}: {action} needs {key!r}")
        if key in ("a", "b", "broker", "link"):
            ids = [value] if isinstance(value, str) else value
            if not isinstance(ids, list) or not ids or not all(isinstance(x, str) for x in ids):
                raise UniverseFileError(f"{where}: {key} must be a broker id or a list of them")
            if key == "link" and len(ids) != 2:
                raise UniverseFileError(f"{where}: link must name two brokers, "
                                        f"[\"from\", \"to\"]")
            if key == "broker" and len(ids) != 1:
                raise UniverseFileError(f"{where}: broker must be one broker id")
            for who in ids:
                if who not in brokers:
                    raise UniverseFileError(f"{where}: unknown broker {who!r}")
            value = ids[0] if key == "broker" else tuple(ids)
        elif key == "probability":
            if not isinstance(value, int | float) or isinstance(value, bool) \
                    or not 0 <= value <= 1:
                raise UniverseFileError(f"{where}: probability must be within 0..1, "
                                        f"got {value!r}")
            value = float(value)
        else:
            value = _seconds(where, value, key)
        args.append((key, value))
    return FaultSpec(at, action, tuple(args))


def _explore(where: str, table: dict[str, Any]) -> ExploreSpec:
    _check_keys(where, table, _EXPLORE_KEYS)
    default = ExploreSpec()
    actions = table.get("actions", list(default.actions))
    if not isinstance(actions, list) or not actions or any(
            a not in FAULT_ARGS or a in ("heal", "release", "restart") for a in actions):
        raise UniverseFileError(f"{where}: actions must be a list of partition, hold, delay, "
                                f"drop or crash, got {actions!r}")
    return ExploreSpec(_int(where, table, "faults", default.faults, 0),
                       _seconds(where, table.get("within", default.within), "within"),
                       _seconds(where, table.get("lasting", default.lasting), "lasting"),
                       tuple(actions))


def random_faults(spec: UniverseSpec, seed: int) -> tuple[FaultSpec, ...]:
    """The faults ``universe explore`` adds for ``seed``, from the file's ``[explore]``
    budget: each starts within ``within`` seconds and is undone (heal, release, delay
    0, drop 0, restart) within ``lasting`` seconds more.  A pure function of the file
    and the seed."""
    rng = random.Random(f"rdvpump explore {seed}")
    budget = spec.explore or ExploreSpec(faults=0)
    pairs = sorted({(w.source, t) for w in spec.workloads for t in w.targets})
    faults: list[FaultSpec] = []
    for _ in range(budget.faults):
        action = rng.choice(budget.actions)
        start = round(rng.uniform(0, budget.within), 6)
        end = round(start + rng.uniform(0, budget.lasting), 6)
        if action == "crash":
            who = rng.choice(spec.brokers)
            faults += [FaultSpec(start, "crash", (("broker", who),)),
                       FaultSpec(end, "restart", (("broker", who),))]
            continue
        if not pairs:
            continue
        pair = rng.choice(pairs)
        if action == "partition":
            faults += [FaultSpec(start, "partition", (("a", (pair[0],)), ("b", (pair[1],)))),
                       FaultSpec(end, "heal", (("a", (pair[0],)), ("b", (pair[1],))))]
        elif action == "hold":
            faults += [FaultSpec(start, "hold", (("link", pair),)),
                       FaultSpec(end, "release", (("link", pair),))]
        elif action == "delay":
            seconds = round(rng.uniform(0, budget.lasting / 10), 6)
            faults += [FaultSpec(start, "delay", (("link", pair), ("seconds", seconds),
                                                  ("jitter", seconds))),
                       FaultSpec(end, "delay", (("link", pair), ("seconds", 0.0),
                                                ("jitter", 0.0)))]
        elif action == "drop":
            faults += [FaultSpec(start, "drop", (("link", pair), ("probability", 0.01))),
                       FaultSpec(end, "drop", (("link", pair), ("probability", 0.0)))]
    return tuple(sorted(faults, key=lambda f: f.at))


def _check_runnable(path: Path, workloads: list[WorkloadSpec]) -> None:
    """What would fail once running, said before anything starts (the same for
    ``universe run`` and ``universe up``): messages over the queue's maximum size, and
    one port of a broker serving two kinds of workload."""
    serving: dict[tuple[str, int], tuple[str, int]] = {}
    for i, w in enumerate(workloads):
        where = f"{path} [[workload]] #{i + 1}"
        if w.size > DEFAULT_MAX_MESSAGE_SIZE:
            raise UniverseFileError(f"{where}: size {w.size} exceeds the largest message, "
                                    f"{DEFAULT_MAX_MESSAGE_SIZE} bytes")
        role = w.kind if w.kind in ("echo", "mq") else "sink"
        for target in w.targets:
            other = serving.setdefault((target, w.port), (role, i))
            if other[0] != role:
                raise UniverseFileError(
                    f"{where}: {target}:{w.port} already serves {other[0]} for workload "
                    f"#{other[1] + 1}; a port serves one kind: give this one another port")
