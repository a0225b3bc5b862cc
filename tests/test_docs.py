"""Every Python block of the pages in ``docs/`` (the guides' too) runs as printed: each in a fresh
interpreter, and what a ``# prints:`` comment promises is in its output.  A block that
puts processes on a network of namespaces (:mod:`rdvpump.nemesis`) is skipped, with the
reason, where this machine cannot make one."""

from __future__ import annotations

import os
import pathlib
import re
import tomllib

import pytest

from rdvpump.nemesis import unavailable

from .test_readme import runs_as_printed

DOCS = pathlib.Path(__file__).resolve().parents[1] / "docs"


def _blocks() -> list[tuple[str, int, str]]:
    found = []
    for page in sorted(DOCS.rglob("*.md")):
        for i, code in enumerate(re.findall(r"^```python\n(.*?)^```$", page.read_text(),
                                            flags=re.S | re.M)):
            found.append((str(page.relative_to(DOCS)), i, code))
    return found


def test_a_docs_cluster_file_is_one() -> None:
    """Each TOML block of a page that has a ``[cluster]`` is a cluster file as printed."""
    from mq.cluster._file import parse_cluster

    files = [tomllib.loads(code) for page in sorted(DOCS.glob("*.md"))
             for code in re.findall(r"^```toml\n(.*?)^```$", page.read_text(),
                                    flags=re.S | re.M)]
    clusters = [parse_cluster(data) for data in files if "cluster" in data]
    assert clusters and clusters[0].silence == 0.5


def test_the_failures_page_has_its_blocks() -> None:
    assert sum(name == "failures.md" for name, _, _ in _blocks()) == 2


@pytest.mark.slow  # each block in an interpreter of its own; some start processes
@pytest.mark.parametrize(("page", "index", "code"), _blocks(),
                         ids=[f"{name}-{i}" for name, i, _ in _blocks()])
def test_a_docs_python_block_runs_as_printed(page: str, index: int, code: str,
                                             tmp_path: pathlib.Path) -> None:
    if "network(" in code and (why := unavailable()) is not None:
        pytest.skip(why)
    runs_as_printed(code, tmp_path)


def test_the_changelog_names_the_version_rdvpump_says() -> None:
    """CHANGELOG.md has an Unreleased section and one for the version in pyproject.toml
    (the one ``rdvpump --version`` shows)."""
    root = DOCS.parent
    version = tomllib.loads((root / "pyproject.toml").read_text())["project"]["version"]
    headings = re.findall(r"^## \[([^\]]+)\]", (root / "CHANGELOG.md").read_text(), flags=re.M)
    assert headings[:1] == ["Unreleased"] and version in headings


@pytest.mark.slow  # a process, a few seconds
def test_the_site_builds_with_no_warning(tmp_path: pathlib.Path) -> None:
    """``mkdocs build --strict`` (warnings are errors: a broken link, a page left out of
    the navigation, a docstring the API reference cannot read): the site of the guides,
    the tutorial, the architecture and the API reference generated from the docstrings."""
    pytest.importorskip("mkdocs", reason="the site needs the docs extra")
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(tmp_path / "site")], cwd=DOCS.parent, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "WARNING" not in proc.stderr, proc.stderr[-3000:]
    site = tmp_path / "site"
    for page in ("index.html", "tutorial/index.html", "guides/mq/index.html",
                 "reference/mq/index.html", "architecture/index.html"):
        assert (site / page).stat().st_size > 10_000, page
    reference = (site / "reference" / "brokermgr" / "index.html").read_text()
    assert "PushTable" in reference and ":class:" not in reference
