"""Every code block of the README runs as printed.

The first block (set up and run the demo; set up and run the tests) is what CI runs
itself.  Each Python block runs in a fresh interpreter, and what a ``# prints:`` comment
promises is in its output.  The shell blocks after the first follow each other in one
shell, as a reader pastes them, so they run in order in one bash (``set -e``: the first
command that fails stops it), from a scratch directory that holds the checkout's
``.venv``, ``examples/`` and ``replay/``, against 127.0.0.1 only, under one deadline;
everything they start in the background is killed and reaped at the end.  The ports
the README prints are mapped to free ones (two checkouts can run the suite at once),
and the benchmark commands run as printed at a smoke size (``RDVPUMP_BENCH_SCALE``):
what is tested is that they run and report, not their figures.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
#: Ports the README's shell blocks use: the manager, the MQ server, the tracker, Spark.
PORTS = (9876, 9877, 9878, 7077)
#: The fraction of their work the benchmark commands do here.
BENCH_SCALE = "0.002"
SHELL_DEADLINE = 1500.0
PYTHON_DEADLINE = 120.0


def blocks(language: str) -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(rf"^```{language}\n(.*?)^```$", text, flags=re.S | re.M)


def test_the_readme_has_the_blocks_this_test_runs() -> None:
    assert len(blocks("python")) >= 5
    assert len(blocks("sh")) >= 6
    fences = re.findall(r"^```(\S*)$", (ROOT / "README.md").read_text(), flags=re.M)
    assert set(fences[0::2]) == {"sh", "python"}, "a block in another language is not run"


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(blocks("python"))))
def test_python_block_runs_as_printed(index: int, tmp_path: pathlib.Path) -> None:
    code = blocks("python")[index]
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=PYTHON_DEADLINE, env=_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    for promised in re.findall(r"# prints: (.*)$", code, flags=re.M):
        assert promised.strip() in proc.stdout, (promised, proc.stdout)
    assert "Traceback" not in proc.stderr


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RDVPUMP_", "SPARK_"))}
    env["PYTHONPATH"] = str(ROOT)
    return env


@pytest.fixture
def scratch(tmp_path: pathlib.Path) -> pathlib.Path:
    venv = pathlib.Path(sys.prefix)
    if not (venv / "bin" / "activate").exists():
        pytest.skip("the README's shell blocks need the checkout's virtualenv")
    (tmp_path / ".venv").symlink_to(venv)
    for name in ("examples", "replay"):
        (tmp_path / name).symlink_to(ROOT / name)
    return tmp_path


@pytest.fixture
def free_ports() -> dict[int, int]:
    """A free port on 127.0.0.1 for each port the README prints."""
    socks = []
    try:
        for _ in PORTS:
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            socks.append(sock)
        return {port: sock.getsockname()[1] for port, sock in zip(PORTS, socks, strict=True)}
    finally:
        for sock in socks:
            sock.close()


def _mapped(script: str, ports: dict[int, int]) -> str:
    for printed, free in ports.items():
        script = re.sub(rf"(?<![0-9]){printed}(?![0-9])", str(free), script)
    return script


@pytest.mark.slow
@pytest.mark.spark
def test_shell_blocks_run_as_printed_in_order(scratch: pathlib.Path,
                                              free_ports: dict[int, int]) -> None:
    pytest.importorskip("pyspark")
    if shutil.which("java") is None:
        pytest.skip("the traces blocks run Spark, which needs Java 17 or 21")
    if shutil.which("redis-server") is None:
        pytest.skip("the benchmark block's `bench mq` needs redis-server (CI installs it)")
    # bash waits for what it started: on its way out (done, failed, or SIGTERM from the
    # deadline) it stops its background jobs and reaps them
    script = "\n".join(["set -euo pipefail", "trap 'exit 143' TERM",
                        "trap 'kill $(jobs -p) 2>/dev/null || true; wait' EXIT",
                        *blocks("sh")[1:]])
    script = _mapped(script, free_ports)
    log = scratch / "readme.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(["bash", "-c", script], cwd=scratch, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**_env(), "RDVPUMP_BENCH_SCALE": BENCH_SCALE},
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=SHELL_DEADLINE)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            _reap_group(proc)
    text = log.read_text(errors="replace")
    assert rc is not None, f"not done within {SHELL_DEADLINE} s:\n{text[-4000:]}"
    assert rc == 0, f"exit {rc}:\n{text[-4000:]}"
    assert "Traceback" not in text, text[-4000:]
    # what each section promises a reader, seen in the one log
    for seen in ("orders", "echo client1->server:80", "declared orders", "topics",
                 "sequenceDiagram", "analysis"):
        assert seen in text, seen
    assert (scratch / "analysis" / "summary.json").exists()
    assert list((scratch / "data").iterdir())


def _reap_group(proc: subprocess.Popen[bytes]) -> None:
    """The shell and what it left: SIGTERM to the process group (the shell's EXIT trap
    stops and reaps its jobs), SIGKILL to the group past 30 s; fails if any process of
    the group is left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not _group_alive(proc.pid):
            break
        os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            continue
    if proc.poll() is None:
        proc.wait(timeout=30)
    deadline = time.monotonic() + 30
    while _group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)  # orphans that the init process has yet to reap
    assert not _group_alive(proc.pid), "a process the README started outlived the test"


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True

