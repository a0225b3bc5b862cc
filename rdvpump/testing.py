"""Deterministic simulation for users: universes on a virtual clock, and faults on their links.

Every run is a pure function of its seed (after FoundationDB's simulation
testing; the faults after turmoil's partition, hold, release and crash):

- :func:`run_simulation` runs a trio program on a virtual clock
  (``trio.testing.MockClock`` with autojump) with trio's order of runnable
  tasks drawn from the seed, so the same program and seed give the same run,
  down to the bytes of its trace.
- :class:`Faults`, installed on a universe before its first link, relays every
  in-memory link (:class:`channels.FaultLink`) and acts on it: partitions
  between brokers or groups of brokers, held and delayed links, lossy links,
  crashed and restarted brokers.  Its randomness (jitter, loss) is the pump's
  seeded generator.
- :func:`open_simulation` is both at once for a trio program: a universe with
  faults installed.

Only links inside one process (one pump) are simulated; links over TCP are
real.  The pytest fixtures of :mod:`rdvpump.pytest_plugin` wrap these.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from typing import Any, TypeGuard, TypeVar

import trio

from brokermgr import Broker, BrokerManager, open_universe
from channels import Channel, FaultLink
from pump import RdvpumpError, Timer
from pump.schema import Kind

#: Seconds a link across a partition stalls before it closes with the reason "partitioned".
DEFAULT_PARTITION_TIMEOUT = 10.0

#: The actions of :meth:`Faults.apply` (and of ``[[fault]]`` tables in universe files).
ACTIONS = ("partition", "heal", "hold", "release", "delay", "drop", "crash", "restart")

T = TypeVar("T")
#: A broker id, or several: a group of brokers.
Group = str | Iterable[str]


class SimulationError(RdvpumpError, ValueError):
    """A fault that cannot be applied (an unknown broker or link, a bad setting)."""


# -- the virtual clock and trio's scheduling order --------------------------------------

def _scheduler() -> Any:
    # trio has no public hook for a seeded order of runnable tasks; its Hypothesis plugin
    # sets these two for the same purpose (``_hypothesis_plugin_setup`` in trio._core._run).
    import trio._core._run as run  # reach-in: seeded scheduling, as trio's Hypothesis plugin

    return run


@contextlib.contextmanager
def seeded_scheduling(seed: int) -> Iterator[None]:
    """Within the block, trio runs its runnable tasks in an order drawn from ``seed``
    (by default it shuffles them from an unseeded generator, on purpose)."""
    run = _scheduler()
    flag, state = run._ALLOW_DETERMINISTIC_SCHEDULING, run._r.getstate()  # reach-in: see above
    run._ALLOW_DETERMINISTIC_SCHEDULING = True  # reach-in: see above
    run._r.seed(random.Random(seed).getrandbits(64))  # reach-in: see above
    try:
        yield
    finally:
        run._ALLOW_DETERMINISTIC_SCHEDULING = flag  # reach-in: see above
        run._r.setstate(state)  # reach-in: see above


def run_simulation(async_fn: Callable[..., Awaitable[T]], *args: Any, seed: int = 0,
                   clock: str = "virtual") -> T:
    """``trio.run(async_fn, *args)`` as a simulation: on the virtual clock, time jumps
    whenever every task waits, and trio's scheduling order comes from ``seed``.

    ``clock="real"`` runs it on trio's real clock instead (for throughput figures).

    Ctrl-C raises KeyboardInterrupt at the main task's next checkpoint, not wherever the
    code happens to be: raised inside a finalizer or an import's lock callback, Python
    would print it as "Exception ignored" and the run would go on.
    """
    if clock == "real":
        return trio.run(async_fn, *args, restrict_keyboard_interrupt_to_checkpoints=True)
    if clock != "virtual":
        raise SimulationError(f"clock must be 'virtual' or 'real', got {clock!r}")
    from trio.testing import MockClock  # here: it imports pytest, which a CLI start need not

    with seeded_scheduling(seed):
        return trio.run(async_fn, *args, clock=MockClock(autojump_threshold=0),
                        restrict_keyboard_interrupt_to_checkpoints=True)


# -- faults -----------------------------------------------------------------------------

LinkRef = FaultLink | int | tuple[str, str] | Any


class Faults:
    """Faults on the in-memory links of one universe, driven by its pump.

    Install it right after the universe is made, before its first link: every
    link made afterwards is relayed and listed in :attr:`links`.  A *link*
    argument is a :class:`~channels.FaultLink`, a link id, a queue (anything
    with ``link_id``), or a pair of broker ids: then the fault holds for every
    link between the two, those open now and those that form until it is undone
    (``release``, ``delay(..., 0)``, ``drop(..., 0)``).
    """

    def __init__(self, universe: BrokerManager, *,
                 partition_timeout: float = DEFAULT_PARTITION_TIMEOUT) -> None:
        if universe.channels.gate is not None:
            raise SimulationError(f"universe {universe.name!r} already has faults installed")
        if not partition_timeout > 0:
            raise SimulationError(f"partition_timeout must be a positive number of seconds, "
                                  f"got {partition_timeout!r}")
        self.universe = universe
        self.pump = universe.pump
        self.partition_timeout = partition_timeout
        #: Every fault link, in the order they formed.
        self.links: list[FaultLink] = []
        self._cut: dict[tuple[str, str], None] = {}  # partitioned pairs (ordered: a dict)
        self._crashed: dict[str, None] = {}
        self._expiry: dict[int, Timer] = {}  # link id -> close timer of a stalled link
        self._rules: dict[tuple[str, str], dict[str, Any]] = {}  # broker pair -> settings
        #: Called with a broker's id when it crashes, and with the new broker when it
        #: restarts: what serves on a broker starts again here.
        self.on_crash: list[Callable[[str], object]] = []
        self.on_restart: list[Callable[[Broker], object]] = []
        universe.channels.gate = self

    def __repr__(self) -> str:
        return (f"<Faults of {self.universe.name!r}: {len(self.links)} links, "
                f"{len(self._cut)} partitioned pairs, crashed {list(self._crashed)}>")

    # -- the gate the channel manager consults ----------------------------------------

    def refusal(self, src: str, dst: str) -> str | None:
        """Why ``src`` cannot reach ``dst`` now, or None."""
        if dst in self._crashed:
            return f"{dst} crashed"
        if self.partitioned(src, dst):
            return "partitioned"
        return None

    def join(self, a: Channel, b: Channel) -> None:
        link = FaultLink(self.pump, a, b)
        self.links.append(link)
        rule = self._rules.get(_key(a.local, b.local), {})
        for way in (link.ab, link.ba):
            way.delay, way.jitter = rule.get("delay", (0.0, 0.0))
            way.loss = rule.get("loss", 0.0)
        if rule.get("held"):
            link.hold()
        if self.partitioned(a.local, b.local):  # formed as a partition began: it stalls
            self._stall(link)

    # -- queries -----------------------------------------------------------------------

    def partitioned(self, a: str, b: str) -> bool:
        return (a, b) in self._cut

    def live_links(self) -> list[FaultLink]:
        return [link for link in self.links if not link.ended]

    def find(self, ref: LinkRef) -> list[FaultLink]:
        """The live links ``ref`` names (see the class); an unknown one is an error.  For
        a pair of brokers that has no live link the list is empty."""
        if isinstance(ref, FaultLink):
            return [ref]
        if _is_pair(ref):
            for who in ref:
                if who not in self.universe and who not in self._crashed:
                    raise SimulationError(f"universe {self.universe.name!r} has no broker "
                                          f"{who!r}")
            key = _key(*ref)
            return [link for link in self.live_links() if _key(*link.brokers) == key]
        link_id = ref if isinstance(ref, int) else getattr(ref, "link_id", None)
        if not isinstance(link_id, int):
            raise SimulationError(f"not a link: {ref!r} (give a link, a link id, a queue "
                                  "or a pair of broker ids)")
        found = [link for link in self.links if link.link_id == link_id]
        if not found:
            raise SimulationError(f"universe {self.universe.name!r} has no link with "
                                  f"id {link_id}")
        return found

    def _targets(self, ref: LinkRef, setting: str, value: Any) -> list[FaultLink]:
        """``find(ref)``; for a pair of brokers, the setting also holds for its future
        links."""
        found = self.find(ref)
        if _is_pair(ref):
            self._rules.setdefault(_key(*ref), {})[setting] = value
        return found

    # -- partitions --------------------------------------------------------------------

    def partition(self, a: Group, b: Group) -> None:
        """Cut every broker of ``a`` off from every broker of ``b``: connects between
        them are refused (``unreachable: partitioned``); links between them stall,
        nothing delivered and nothing lost, and close with the reason ``partitioned``
        after :attr:`partition_timeout` unless healed first."""
        pairs = _pairs(a, b)
        for x, y in pairs:
            self._cut[(x, y)] = self._cut[(y, x)] = None
        for link in self.live_links():
            if link.brokers in pairs or link.brokers[::-1] in pairs:
                self._stall(link)
        self._emit("partition", _name(a), _name(b))

    def heal(self, a: Group, b: Group) -> None:
        """End a partition: stalled links go on, in order, with nothing lost."""
        pairs = _pairs(a, b)
        for x, y in pairs:
            self._cut.pop((x, y), None)
            self._cut.pop((y, x), None)
        for link in self.live_links():
            x, y = link.brokers
            if ((x, y) in pairs or (y, x) in pairs) and not self.partitioned(x, y):
                self._unstall(link)
        self._emit("heal", _name(a), _name(b))

    def _stall(self, link: FaultLink) -> None:
        link.hold()
        if link.link_id not in self._expiry:
            self._expiry[link.link_id] = self.pump.call_later(
                self.partition_timeout, self._expire, link, owner=link, kind="partition")

    def _unstall(self, link: FaultLink) -> None:
        timer = self._expiry.pop(link.link_id, None)
        if timer is not None:
            timer.cancel()
        link.release()

    def _expire(self, link: FaultLink) -> None:
        self._expiry.pop(link.link_id, None)
        if self.partitioned(*link.brokers):
            link.cut("partitioned")

    # -- links -------------------------------------------------------------------------

    def hold(self, link: LinkRef) -> None:
        """Messages on the link wait (both ways) until :meth:`release`; none is lost."""
        for found in self._targets(link, "held", True):
            found.hold()
        self._emit("hold", *self._ends(link))

    def release(self, link: LinkRef) -> None:
        """Held messages go on, in order."""
        for found in self._targets(link, "held", False):
            if not self.partitioned(*found.brokers):
                found.release()
        self._emit("release", *self._ends(link))

    def delay(self, link: LinkRef, seconds: float, *, jitter: float = 0.0) -> None:
        """Every byte on the link waits ``seconds`` plus up to ``jitter`` more (seeded),
        in order; ``delay(link, 0)`` ends it."""
        if not seconds >= 0 or not jitter >= 0:
            raise SimulationError(f"delay and jitter must be >= 0 seconds, got {seconds!r} "
                                  f"and {jitter!r}")
        for found in self._targets(link, "delay", (float(seconds), float(jitter))):
            for way in (found.ab, found.ba):
                way.delay, way.jitter = float(seconds), float(jitter)
        self._emit("delay", *self._ends(link), detail=f"{seconds:g}s + up to {jitter:g}s")

    def drop(self, link: LinkRef, probability: float) -> None:
        """Make the link lossy: each batch of bytes it moves is lost with ``probability``,
        which breaks the link (both ends close with a "dropped" reason).  The message
        queue itself never loses or reorders; ``drop(link, 0)`` ends it."""
        if not 0 <= probability <= 1:
            raise SimulationError(f"probability must be within 0..1, got {probability!r}")
        for found in self._targets(link, "loss", float(probability)):
            found.ab.loss = found.ba.loss = float(probability)
        self._emit(Kind.DROP, *self._ends(link), detail=f"{probability:g}")

    def _ends(self, ref: LinkRef) -> tuple[str, str, FaultLink | None]:
        if _is_pair(ref):
            return ref[0], ref[1], None
        (link,) = self.find(ref)
        return link.brokers[0], link.brokers[1], link

    # -- brokers -----------------------------------------------------------------------

    def crash(self, broker_id: str) -> None:
        """The broker dies: its links close as after a kill (the peers see them lost,
        ``<id> crashed``), connects to it are refused (``unreachable``) until
        :meth:`restart`.  What it keeps on disk stays."""
        broker = self._broker(broker_id)
        if broker_id in self._crashed:
            raise SimulationError(f"broker {broker_id!r} has already crashed")
        self._crashed[broker_id] = None
        self._emit("crash", broker_id)
        for link in self.live_links():
            if broker_id in link.brokers:
                link.cut(f"{broker_id} crashed")
        broker.close(f"{broker_id} crashed")
        for hook in list(self.on_crash):
            hook(broker_id)

    def restart(self, broker_id: str) -> Broker:
        """A crashed broker comes back, a new broker with the same id; the
        :attr:`on_restart` hooks start what serves on it."""
        if broker_id not in self._crashed:
            raise SimulationError(f"broker {broker_id!r} has not crashed")
        del self._crashed[broker_id]
        broker = self.universe.add_broker(broker_id)
        self._emit("restart", broker_id)
        for hook in list(self.on_restart):
            hook(broker)
        return broker

    def _broker(self, broker_id: str) -> Broker:
        try:
            return self.universe.broker(broker_id)
        except KeyError as exc:
            raise SimulationError(exc.args[0]) from None

    # -- one entry for every action ----------------------------------------------------

    def apply(self, action: str, **args: Any) -> None:
        """Apply an action by name with its arguments (what a ``[[fault]]`` table says):
        ``partition``/``heal`` (``a``, ``b``), ``hold``/``release`` (``link``),
        ``delay`` (``link``, ``seconds``, ``jitter``), ``drop`` (``link``,
        ``probability``), ``crash``/``restart`` (``broker``)."""
        if action in ("partition", "heal"):
            getattr(self, action)(args["a"], args["b"])
        elif action in ("hold", "release"):
            getattr(self, action)(_pair(args["link"]))
        elif action == "delay":
            self.delay(_pair(args["link"]), args["seconds"], jitter=args.get("jitter", 0.0))
        elif action == "drop":
            self.drop(_pair(args["link"]), args["probability"])
        elif action == "crash":
            self.crash(args["broker"])
        elif action == "restart":
            self.restart(args["broker"])
        else:
            raise SimulationError(f"unknown fault action {action!r} "
                                  f"(one of {', '.join(ACTIONS)})")

    def _emit(self, action: str, a: str, b: str | None = None,
              link: FaultLink | None = None, *, detail: str | None = None) -> None:
        self.pump.emit(Kind.FAULT, broker=a, peer=b, outcome=action, reason=detail,
                       link=None if link is None else link.a.trace_link,
                       port=None if link is None else link.a.port)


def _is_pair(ref: object) -> TypeGuard[tuple[str, str]]:
    return (isinstance(ref, tuple) and len(ref) == 2
            and all(isinstance(x, str) for x in ref))


def _key(a: str, b: str) -> tuple[str, str]:
    return (a, b) if a <= b else (b, a)


def _group(g: Group) -> list[str]:
    return [g] if isinstance(g, str) else list(g)


def _name(g: Group) -> str:
    return g if isinstance(g, str) else ",".join(g)


def _pairs(a: Group, b: Group) -> set[tuple[str, str]]:
    pairs = {(x, y) for x in _group(a) for y in _group(b) if x != y}
    if not pairs:
        raise SimulationError(f"nothing to partition between {_name(a)!r} and {_name(b)!r}")
    return pairs


def _pair(link: Any) -> Any:
    """A link as a universe file names it: a list of two broker ids."""
    if isinstance(link, list):
        return tuple(link)
    return link


# -- both at once -----------------------------------------------------------------------

@contextlib.asynccontextmanager
async def open_simulation(name: str = "sim", *, seed: int = 0,
                          partition_timeout: float = DEFAULT_PARTITION_TIMEOUT,
                          **options: Any) -> AsyncIterator[Faults]:
    """A universe (see :func:`brokermgr.open_universe`, whose ``options`` these are) with
    :class:`Faults` installed; the universe is ``faults.universe``.  Run the program
    with :func:`run_simulation` for a run that is a pure function of the seed."""
    async with open_universe(name, seed=seed, **options) as universe:
        yield Faults(universe, partition_timeout=partition_timeout)


__all__ = [
    "ACTIONS",
    "DEFAULT_PARTITION_TIMEOUT",
    "Faults",
    "SimulationError",
    "open_simulation",
    "run_simulation",
    "seeded_scheduling",
]
