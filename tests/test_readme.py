"""Every code block of the README and of the guides runs as printed.

The README's first block (set up and run the demo; set up and run the tests) is what CI
runs itself.  Each Python block runs in a fresh interpreter, and what a ``# prints:``
comment promises is in its output (the guides' Python blocks: ``tests/test_docs.py``).
The guides' shell blocks follow each other in one shell, as a reader pastes them, page
after page in the order of :data:`CHAIN`, so they run in order in one bash (``set -e``:
the first command that fails stops it), from a scratch directory that holds the
checkout's ``.venv``, ``examples/`` and ``replay/``, against 127.0.0.1 only, under one
deadline; everything they start in the background is killed and reaped at the end.  The
benchmark page's block needs nothing from the others and runs the same way in a test of
its own, at a smoke size (``RDVPUMP_BENCH_SCALE``): what is tested is that its commands
run and report, not their figures.  The ports the pages print are mapped to free ones
(two checkouts can run the suite at once).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from rdvpump.bench import _ports

ROOT = pathlib.Path(__file__).resolve().parents[1]
#: The pages whose shell blocks follow each other, in this order (a universe started in
#: the CLI guide serves the tracking and MQ guides), and the benchmark page.
CHAIN = ("docs/guides/cli.md", "docs/guides/tracking.md", "docs/guides/mq.md",
         "docs/guides/metrics.md", "docs/guides/traces.md", "docs/guides/testing.md")
BENCH_PAGE = "docs/guides/benchmarks.md"
#: The fences a page may hold: run (sh, python), parsed (toml), drawn (mermaid), or a
#: figure of text.
FENCES = {"sh", "python", "toml", "mermaid", "text"}
#: Ports the guides' shell blocks use: the manager, the MQ server, the tracker, Spark.
PORTS = (9876, 9877, 9878, 7077, 9100, 8080)
#: The fraction of their work the benchmark commands do here.
BENCH_SCALE = "0.002"
SHELL_DEADLINE = 1500.0
PYTHON_DEADLINE = 120.0


def blocks(language: str, page: str = "README.md") -> list[str]:
    text = (ROOT / page).read_text()
    return re.findall(rf"^```{language}\n(.*?)^```$", text, flags=re.S | re.M)


def pages() -> list[str]:
    """The README and every page of the documentation."""
    return ["README.md", *sorted(str(p.relative_to(ROOT))
                                 for p in (ROOT / "docs").rglob("*.md"))]


def test_the_readme_is_a_front_door() -> None:
    """Two commands, one example, one picture, and at most about 250 lines."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    assert len(blocks("python")) == 1 and len(blocks("sh")) == 1
    assert len(blocks("sh")[0].splitlines()) == 2
    assert len(blocks("mermaid")) == 1


def test_every_block_of_every_page_is_one_the_tests_run() -> None:
    """No fence of another language, and every shell block is in the chain or is the
    benchmark page's."""
    for page in pages():
        fences = re.findall(r"^```(\S*)$", (ROOT / page).read_text(), flags=re.M)
        assert set(fences[0::2]) <= FENCES, (page, set(fences[0::2]) - FENCES)
        if page not in ("README.md", *CHAIN, BENCH_PAGE):
            assert not blocks("sh", page), f"{page}: a shell block that no test runs"


def test_the_test_command_installs_what_the_spark_extra_holds() -> None:
    """The test command installs pyspark in a pip of its own beside the ``replay`` extra:
    together, the ``spark`` extra (pyspark's requirement written the same in both)."""
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    (pyspark,) = [r for r in extras["spark"] if r.startswith("pyspark")]
    assert sorted(extras["spark"]) == sorted([pyspark, "rdvpump[replay]"])
    setup, test = blocks("sh")[0].splitlines()
    script = (ROOT / test.split()[-1]).read_text()
    assert (f"pip install -q --no-compile --config-settings=--build-option=--compression=stored "
            f"'{pyspark}' &") in script
    assert "pip install -q --no-compile -e '.[dev,replay,docs]'" in script
    assert setup.split("&&")[1].split() == [".venv/bin/pip", "install", "-q", "."], \
        "the demo's command installs no extra"


@pytest.mark.slow
def test_the_readme_example_runs_as_printed(tmp_path: pathlib.Path) -> None:
    runs_as_printed(blocks("python")[0], tmp_path)


def runs_as_printed(code: str, where: pathlib.Path) -> None:
    """``code`` runs in a fresh interpreter in ``where``, and prints what its
    ``# prints:`` comments promise."""
    proc = subprocess.run([sys.executable, "-c", code], cwd=where, capture_output=True,
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
        pytest.skip("the guides' shell blocks need the checkout's virtualenv")
    (tmp_path / ".venv").symlink_to(venv)
    for name in ("examples", "replay"):
        (tmp_path / name).symlink_to(ROOT / name)
    return tmp_path


@pytest.fixture
def free_ports() -> dict[int, int]:
    """A free port on 127.0.0.1 for each port the guides print, all different and below
    the ephemeral range (:func:`~rdvpump.bench._ports.free_ports`: the blocks hold them
    for minutes while their processes bind and connect)."""
    return dict(zip(PORTS, _ports.free_ports(len(PORTS)), strict=True))


def _mapped(script: str, ports: dict[int, int]) -> str:
    for printed, free in ports.items():
        script = re.sub(rf"(?<![0-9]){printed}(?![0-9])", str(free), script)
    return script


def shell_chains() -> tuple[list[str], list[str]]:
    """The guides' shell blocks as two chains that share nothing: the blocks that build
    on each other (a universe, its traces, their analysis), page after page in
    :data:`CHAIN` order, and the benchmark page's block, whose commands
    (``.venv/bin/rdvpump bench ...``) need nothing from the others, so it runs in a test
    of its own, beside them."""
    chain = [block for page in CHAIN for block in blocks("sh", page)]
    return chain, blocks("sh", BENCH_PAGE)


def test_the_benchmark_block_needs_nothing_from_the_others() -> None:
    chain, bench = shell_chains()
    assert len(bench) == 1 and len(chain) >= 6
    commands = [line for line in bench[0].splitlines() if line.strip()]
    assert all(c.startswith(".venv/bin/rdvpump bench ") for c in commands)
    assert "rdvpump bench" not in "\n".join(chain)


#: Every JVM of the README's Spark blocks starts with the options of ``--jvm quick``
#: (the C1 compiler only, the serial collector): on small traces they spend less CPU
#: starting than compiling would save.  What is run is unchanged.
QUICK_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def quick_jvm() -> str:
    """:data:`QUICK_JVM`, and the replay's class-data-sharing archive of Spark's classes
    for that profile: each JVM of the blocks (the local ``spark-submit``, then the
    cluster's master, worker, driver and executor, as ``trace analyze`` does) loads its
    classes from it if it is there when that JVM starts.  On a first run another test's
    JVM writes it, often while these blocks run; none is written here: four JVMs would
    each dump one on their way out."""
    from replay.jvm import archive_options

    return f"{QUICK_JVM} {archive_options('quick')}".strip()


#: Before the Spark cluster's block: keep what local mode wrote, to compare.
KEEP_LOCAL = "rm -rf local-analysis && cp -r analysis local-analysis"


def _run_script(scratch: pathlib.Path, blocks_: list[str], ports: dict[int, int],
                env: dict[str, str]) -> str:
    """``blocks_`` in order in one bash (``set -e``), from ``scratch``, under one deadline;
    everything it started is reaped.  Its output, after checking it succeeded."""
    # bash waits for what it started: on its way out (done, failed, or SIGTERM from the
    # deadline) it stops its background jobs and reaps them
    script = "\n".join(["set -euo pipefail", "trap 'exit 143' TERM",
                        "trap 'kill $(jobs -p) 2>/dev/null || true; wait' EXIT", *blocks_])
    script = _mapped(script, ports)
    log = scratch / "readme.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(["bash", "-c", script], cwd=scratch, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**_env(), **env}, start_new_session=True)
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
    return text


@pytest.mark.slow
@pytest.mark.spark
def test_shell_blocks_run_as_printed_in_order(scratch: pathlib.Path,
                                              free_ports: dict[int, int]) -> None:
    """The chain of blocks, in order.  The traces section's ``spark-submit`` runs the job
    file unchanged in local mode and then on a standalone cluster of one master and one
    two-core worker: both analyses agree, and the cluster's executor ran on its
    worker."""
    pytest.importorskip("pyspark")
    if shutil.which("java") is None:
        pytest.skip("the traces blocks run Spark, which needs Java 17 or 21")
    chain, _ = shell_chains()
    (cluster,) = [i for i, b in enumerate(chain) if "deploy.master.Master" in b]
    chain = [*chain[:cluster], KEEP_LOCAL, *chain[cluster:]]
    text = _run_script(scratch, chain, free_ports,
                       {"SPARK_WORKER_DIR": str(scratch / "spark-work"),
                        "JAVA_TOOL_OPTIONS": quick_jvm()})
    # what each section promises a reader, seen in the one log
    for seen in ("orders", "echo client1->server:80", "declared orders", "topics",
                 "sequenceDiagram", "analysis", "identical"):
        assert seen in text, seen
    assert " INFO " not in text, text[-4000:]  # Spark's own log: its errors only
    # a server started beside its tracker waits for it to register without a warning
    # (a warning as the blocks' processes are stopped together is another matter)
    assert "unknown broker; dialling again" not in text, text[-4000:]
    assert list((scratch / "data").iterdir())
    local = json.loads((scratch / "local-analysis" / "summary.json").read_text())
    on_cluster = json.loads((scratch / "analysis" / "summary.json").read_text())
    assert local["violation_count"] == 0
    assert local["messages_sent"] == local["messages_matched"] > 0
    differ = ("out", "spark_jobs")
    assert {k: v for k, v in on_cluster.items() if k not in differ} == \
        {k: v for k, v in local.items() if k not in differ}
    for plot in ("throughput.png", "latency.png", "links.png"):
        assert (scratch / "analysis" / plot).stat().st_size > 10_000
    # the executor ran on the worker: it started one for the application
    work = [p for p in (scratch / "spark-work").glob("app-*/*") if p.is_dir()]
    assert len(work) == 1, work


#: Seconds each benchmark command takes at the smoke size on this machine, alone (others:
#: 1), to share the block between tests that xdist runs side by side.
BENCH_SECONDS = {"mq": 19, "partition": 18, "failover": 24, "cluster": 12, "replay": 11,
                 "nemesis": 9, "tcp": 6, "routes": 4, "scale": 2}
#: The benchmark block's parts, each a test of its own.
BENCH_PARTS = 3


def bench_parts() -> list[list[str]]:
    """The benchmark block's commands in :data:`BENCH_PARTS` parts of about equal time."""
    _, bench = shell_chains()
    lines = [line for line in bench[0].splitlines() if line.strip()]
    parts: list[list[str]] = [[] for _ in range(BENCH_PARTS)]
    cost = [0] * BENCH_PARTS

    def seconds(line: str) -> int:
        return BENCH_SECONDS.get(line.split()[2], 1)

    for line in sorted(lines, key=seconds, reverse=True):
        lighter = cost.index(min(cost))
        parts[lighter].append(line)
        cost[lighter] += seconds(line)
    return [[line for line in lines if line in part] for part in parts]


def test_the_benchmark_parts_hold_every_command_once() -> None:
    _, bench = shell_chains()
    lines = [line for line in bench[0].splitlines() if line.strip()]
    parts = bench_parts()
    assert sorted(line for part in parts for line in part) == sorted(lines) and all(parts)


@pytest.mark.slow
@pytest.mark.parametrize("part", range(BENCH_PARTS))
def test_the_benchmark_block_runs_as_printed(scratch: pathlib.Path,
                                             free_ports: dict[int, int], part: int) -> None:
    """Every benchmark command as printed, at a smoke size (``RDVPUMP_BENCH_SCALE``), in
    parts that run side by side: what is tested is that each runs and reports (a JSON
    object per line), not its figures."""
    pytest.importorskip("pyspark")
    if shutil.which("java") is None:
        pytest.skip("`bench replay` runs Spark, which needs Java 17 or 21")
    if shutil.which("redis-server") is None:
        pytest.skip("`bench mq` needs redis-server (CI installs it)")
    if shutil.which("nats-server") is None:
        pytest.skip("`bench failover` needs nats-server (CI installs it)")
    from rdvpump.nemesis import unavailable

    if (why := unavailable()) is not None:
        pytest.skip(f"`bench partition` {why}")
    commands = bench_parts()[part]
    text = _run_script(scratch, ["\n".join(commands)], free_ports,
                       {"RDVPUMP_BENCH_SCALE": BENCH_SCALE})
    json_commands = [line for line in commands if "--json" in line]
    results = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    assert len(json_commands) >= 3 and len(results) >= len(json_commands), text[-4000:]
    assert all("case" in r for r in results)


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
    assert not _group_alive(proc.pid), "a process the blocks started outlived the test"


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True

