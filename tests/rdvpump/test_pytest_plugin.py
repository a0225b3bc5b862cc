"""The pytest plugin users get with rdvpump: fixtures for simulations, and the seed of a
failing test in its report.  Each case runs pytest in a subprocess, as a user would."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # real processes

ROOT = pathlib.Path(__file__).resolve().parents[2]


def pytest_run(*args: str, cwd: pathlib.Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
                          capture_output=True, text=True, timeout=300, cwd=cwd)


def test_the_readme_example_passes_under_several_seeds() -> None:
    for seed in ("0", "7"):
        proc = pytest_run(str(ROOT / "examples/test_partition.py"), "--sim-seed", seed,
                          cwd=ROOT)
        assert proc.returncode == 0, proc.stdout
        assert "2 passed" in proc.stdout


FAILING = '''
import trio
from rdvpump.testing import open_simulation

def test_odd_seeds_fail(simulate, sim_seed):
    async def main():
        async with open_simulation(seed=sim_seed) as faults:
            return faults.universe.pump.random.random()
    simulate(main)
    assert sim_seed % 2 == 0
'''


def test_a_failing_test_says_its_seed(tmp_path: pathlib.Path) -> None:
    (tmp_path / "test_user.py").write_text(FAILING)
    proc = pytest_run("test_user.py", "--sim-seed", "3", cwd=tmp_path)
    assert proc.returncode == 1
    assert "seed 3: replay with pytest --sim-seed 3" in proc.stdout
    proc = pytest_run("test_user.py", "--sim-seed", "4", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout


ASYNC = '''
import pytest
import trio
from rdvpump.testing import open_simulation

@pytest.mark.trio
async def test_on_the_virtual_clock(sim_clock, sim_seed):
    order = []
    async with open_simulation(seed=sim_seed) as faults:
        start = trio.current_time()
        async def task(i):
            await trio.sleep(0)
            order.append(i)
        async with trio.open_nursery() as nursery:
            for i in range(20):
                nursery.start_soon(task, i)
        await trio.sleep(3600)
        assert trio.current_time() - start >= 3600
    print("ORDER", order)
'''


def test_sim_clock_gives_async_tests_the_virtual_clock_and_a_seeded_order(
        tmp_path: pathlib.Path) -> None:
    (tmp_path / "test_user.py").write_text(ASYNC)
    orders = []
    for seed in ("1", "1", "2"):
        proc = pytest_run("test_user.py", "-s", "--sim-seed", seed, cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "1 passed in 0." in proc.stdout  # an hour of virtual time, no real wait
        orders.append(next(line for line in proc.stdout.splitlines() if "ORDER" in line))
    assert orders[0] == orders[1]
    assert orders[2] != orders[0]
