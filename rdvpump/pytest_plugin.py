"""pytest fixtures for testing brokers in a simulation (registered as the ``rdvpump``
pytest plugin when rdvpump is installed).

- ``sim_seed``: the seed of the test's simulation, 0 unless ``--sim-seed N`` is given.
  A failing test says its seed, so that ``pytest --sim-seed N`` replays it exactly.
- ``simulate``: ``simulate(main, *args)`` runs the trio program ``main`` as a simulation
  (:func:`rdvpump.testing.run_simulation`) with that seed: for plain test functions.
- ``sim_clock``: for async tests under pytest-trio: the virtual clock (pytest-trio runs
  the test on it) with trio's scheduling order drawn from the seed.

Inside the program, :func:`rdvpump.testing.open_simulation` gives a universe with
:class:`rdvpump.testing.Faults` installed.

- ``nemesis``: for async tests under pytest-trio, on real processes and a real network:
  ``net = nemesis(["m", "a", "b"])`` makes a :class:`rdvpump.nemesis.Network` of those
  hosts (``impairable=True``: one whose latency and loss can be set); every process
  started on it is killed and reaped, and every namespace removed, when the test ends.
  Skipped, with the reason, where the machine cannot (root, iproute2, and ethtool for
  an impairable one, on Linux).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pytest
import trio.testing

from .testing import run_simulation, seeded_scheduling

if TYPE_CHECKING:
    from .nemesis import Network

_SEED = pytest.StashKey[int]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--sim-seed", type=int, default=0, metavar="N",
                     help="rdvpump: the seed of every simulation (default 0)")


@pytest.fixture
def sim_seed(request: pytest.FixtureRequest) -> int:
    """The seed of this test's simulation (``--sim-seed``)."""
    seed = int(request.config.getoption("--sim-seed"))
    request.node.stash[_SEED] = seed
    return seed


@pytest.fixture
def simulate(sim_seed: int) -> Callable[..., Any]:
    """``simulate(main, *args)``: run ``main(*args)`` on the virtual clock with the seed."""

    def run(main: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        return run_simulation(main, *args, seed=sim_seed)

    return run


@pytest.fixture
def sim_clock(sim_seed: int) -> Iterator[trio.testing.MockClock]:
    """The virtual clock for an async test under pytest-trio, with seeded scheduling."""
    with seeded_scheduling(sim_seed):
        yield trio.testing.MockClock(autojump_threshold=0)


@pytest.fixture
async def nemesis() -> AsyncIterator[Callable[..., Network]]:
    """A maker of networks of hosts on namespaces (:mod:`rdvpump.nemesis`), torn down
    with everything they ran when the test ends."""
    from .nemesis import Network, unavailable

    made: list[Network] = []

    def make(hosts: Sequence[str], *, impairable: bool = False) -> Network:
        why = unavailable(impairable=impairable)
        if why is not None:
            pytest.skip(why)
        network = Network(hosts, impairable=impairable).__enter__()
        made.append(network)
        return network

    try:
        yield make
    finally:
        for network in made:
            await network.aclose()
            network.close_namespaces()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    seed = item.stash.get(_SEED, None)
    if seed is not None and report.failed:
        report.sections.append(("rdvpump simulation",
                                f"seed {seed}: replay with pytest --sim-seed {seed}"))
    return report
