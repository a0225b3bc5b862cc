"""Fixtures shared by several test packages, and the hypothesis profiles.

Two profiles, registered once here: ``ci`` (the default: the whole suite, as CI and
the README's test command run it) and ``quick`` (the quick loop:
``pytest -m "not slow" --hypothesis-profile quick``).  No test sets its own number
of examples.
"""

from __future__ import annotations

import compileall
import pathlib

import pytest
from hypothesis import settings

settings.register_profile("ci", max_examples=100, deadline=None)
settings.register_profile("quick", max_examples=15, deadline=None)
settings.load_profile("ci")


ROOT = pathlib.Path(__file__).resolve().parents[1]
#: The directories of Python the tests import or start processes from.
SOURCES = ("pump", "rdv", "channels", "brokermgr", "mq", "rdvpump", "replay", "bench",
           "examples", "tests")


def pytest_configure(config: pytest.Config) -> None:
    """Byte-compile the checkout once, before the workers start.  Hundreds of the tests'
    processes (brokers, managers, universes, the CLI) import the project; where Python
    may not write its bytecode cache (``PYTHONDONTWRITEBYTECODE``, set on some CI
    machines) each of them would compile every module from source again."""
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: the controller did it
        return
    for name in SOURCES:
        compileall.compile_dir(ROOT / name, quiet=2, workers=1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A Spark test is a slow one (it starts a JVM, or works one): the quick loop leaves
    it out.

    Longest first, one per worker: pytest-xdist hands each worker two tests at the
    start and then one at a time (``--maxschedchunk 1``, in ``pyproject.toml``), so the
    tests of :data:`LONGEST` go out each with a quick test behind it (two of them on one
    worker ran one after the other, a minute or two past the rest), then the other
    Spark tests, the slow ones, the rest.  (Each worker that runs a test on the
    ``spark`` fixture starts a JVM: one test uses it.)"""
    for item in items:
        if item.get_closest_marker("spark") is not None:
            item.add_marker(pytest.mark.slow)
    items.sort(key=_cost_rank)
    longest = [item for item in items if _cost_rank(item)[0] == 0]
    rest = items[len(longest):]
    quick = rest[len(rest) - min(len(longest), len(rest)):]
    rest = rest[:len(rest) - len(quick)]
    items[:] = [*(x for pair in zip(longest, quick, strict=False) for x in pair),
                *longest[len(quick):], *rest]


#: The tests that run longest (a minute or more on two cores), in the order they are
#: handed out: the README's chain of shell blocks, its benchmark block, the engines'
#: comparison on Spark.
LONGEST = ("test_shell_blocks_run_as_printed_in_order",
           "test_the_benchmark_block_runs_as_printed",
           "test_the_engines_give_the_same_summary_tables_and_plots")


def _cost_rank(item: pytest.Item) -> tuple[int, int]:
    name = getattr(item, "originalname", item.name)
    if name in LONGEST:
        return 0, LONGEST.index(name)
    if item.get_closest_marker("spark") is not None:
        return 1, 0
    return (2 if item.get_closest_marker("slow") is not None else 3), 0


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    import trustme

    d = tmp_path_factory.mktemp("pki")
    ca, other_ca = trustme.CA(), trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    paths = {"cert": d / "cert.pem", "key": d / "key.pem", "ca": d / "ca.pem",
             "other_ca": d / "other.pem"}
    cert.cert_chain_pems[0].write_to_path(str(paths["cert"]))
    cert.private_key_pem.write_to_path(str(paths["key"]))
    ca.cert_pem.write_to_path(str(paths["ca"]))
    other_ca.cert_pem.write_to_path(str(paths["other_ca"]))
    return {k: str(v) for k, v in paths.items()}
