"""The examples run, print what the pages say, and the pages show them verbatim."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # real processes

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_embed_echo_example_runs() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "examples/embed_echo.py")],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["ack apple", "ack pear", "ack plum",
                                        "refused as expected: not bound"]


def page(name: str) -> str:
    return (ROOT / "docs" / name).read_text()


def test_the_tutorial_shows_the_example_verbatim() -> None:
    example = (ROOT / "examples/embed_echo.py").read_text()
    body = example.split('"""', 2)[2].strip()  # the code after the module docstring
    assert body in page("tutorial.md")


def test_the_testing_guide_shows_the_simulation_test_example_verbatim() -> None:
    example = (ROOT / "examples/test_partition.py").read_text()
    body = example.split('"""', 2)[2].strip()
    assert body in page("guides/testing.md")


def test_the_listener_example_runs_as_shown() -> None:
    section = page("guides/embedding.md").split("## Listener style", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "got b'hello'\n"


def test_tracking_example_runs() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "examples/tracking.py")],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "servers: ['s1:15555', 's2:15555', 's3:15555']"
    assert lines[1].endswith("['s2:15555']")  # the only server with consumers
    assert lines[-1] == "after s3 crashed: ['s1:15555', 's2:15555']"


def test_mq_example_runs_and_the_readme_shows_it() -> None:
    example = (ROOT / "examples/mq_orders.py").read_text()
    body = example.split('"""', 2)[2].strip()
    assert body in page("guides/mq.md")
    proc = subprocess.run([sys.executable, str(ROOT / "examples/mq_orders.py")],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "stored at [1, 2] on s1:15555"
    assert lines[1] == "eu-billing got b'order 1' tagged eu.fr"  # the filter: eu only
    assert "'eu-billing': {'consumers': 1" in lines[2]


def test_mq_listener_example_runs_and_the_readme_shows_it() -> None:
    example = (ROOT / "examples/mq_listener.py").read_text()
    assert example.split('"""', 2)[2].strip() in page("guides/mq.md")
    proc = subprocess.run([sys.executable, str(ROOT / "examples/mq_listener.py")],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["stored: [0, 1]", "got b'order 1' at offset 0",
                                        "got b'order 2' at offset 1"]


def test_the_tracking_snippet_runs_as_shown() -> None:
    readme = page("guides/tracking.md")
    code = readme.split("from brokermgr.tracking import ProducerRoute", 1)[0].rsplit(
        "```python\n", 1)[1] + "from brokermgr.tracking import ProducerRoute" + readme.split(
        "from brokermgr.tracking import ProducerRoute", 1)[1].split("```", 1)[0]
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "['s1:15555']\n['s1:15555']\n"
    assert proc.stderr == ""  # no warning: every broker has its state_dir
