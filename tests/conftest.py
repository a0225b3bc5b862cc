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
    it out.  Slow tests are handed out first, the README's blocks (the longest of all)
    before the others: longest jobs first keeps the last worker from finishing long
    after the others.  (Each pytest-xdist worker that runs a test on the
    ``spark`` fixture starts a JVM: one test uses it.)"""
    for item in items:
        if item.get_closest_marker("spark") is not None:
            item.add_marker(pytest.mark.slow)
    items.sort(key=lambda item: (item.get_closest_marker("slow") is None,
                                 item.path.name != "test_readme.py"))


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
