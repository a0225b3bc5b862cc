"""The replay job on a real Spark standalone cluster on 127.0.0.1: a master, two workers,
``spark-submit replay/job.py`` unchanged, the same summary as local mode."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from replay import analyze

pytestmark = [pytest.mark.spark, pytest.mark.slow]
ROOT = pathlib.Path(__file__).resolve().parents[2]
START_TIMEOUT = 90.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Daemon:
    """A Spark daemon run through ``bin/spark-class`` in the foreground, its log in a file."""

    def __init__(self, spark_home: pathlib.Path, log: pathlib.Path, env: dict[str, str],
                 *args: str) -> None:
        self.log = log
        self._out = open(log, "wb")  # noqa: SIM115
        self.proc = subprocess.Popen([str(spark_home / "bin" / "spark-class"), *args],
                                     stdout=self._out, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=20)
        self._out.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    """A standalone master and two one-core workers from the installed pyspark."""
    pyspark = pytest.importorskip("pyspark")
    if shutil.which("java") is None:
        pytest.skip("Spark needs Java 17 or 21 on PATH")
    home = pathlib.Path(pyspark.__file__).parent
    logs = tmp_path_factory.mktemp("cluster")
    env = {**os.environ, "SPARK_HOME": str(home), "SPARK_LOCAL_IP": "127.0.0.1",
           "SPARK_LOCAL_DIRS": str(logs), "PYSPARK_PYTHON": sys.executable,
           "PYSPARK_DRIVER_PYTHON": sys.executable,
           "SPARK_DAEMON_JAVA_OPTS": f"-Dlog4j.configurationFile=file:{ROOT}/replay/"
                                     "log4j2.properties"}
    port = free_port()
    url = f"spark://127.0.0.1:{port}"
    daemons = []
    try:
        master = Daemon(home, logs / "master.log", env, "org.apache.spark.deploy.master.Master",
                        "--host", "127.0.0.1", "--port", str(port),
                        "--webui-port", str(free_port()))
        daemons.append(master)
        for i in range(2):
            worker = Daemon(home, logs / f"worker{i}.log", env,
                            "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                            "--cores", "1", "--memory", "1g", "--webui-port", str(free_port()),
                            "--work-dir", str(logs / f"work{i}"), url)
            daemons.append(worker)
        # the workers log their registration at INFO, which the quiet log4j file drops:
        # the master's port accepting connections and the job's own run are the signals
        wait_for_port(port, master)
        yield url, env
    finally:
        for daemon in reversed(daemons):
            daemon.stop()


def wait_for_port(port: int, daemon: Daemon) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if daemon.proc.poll() is not None:
                raise AssertionError(f"master exited: {daemon.log.read_text()[-2000:]}") from None
            if time.monotonic() > deadline:
                raise AssertionError(f"master not listening after {START_TIMEOUT} s") from None
            time.sleep(0.2)  # a port to open: polled, bounded


@pytest.fixture(scope="module")
def multi_process_traces(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    traces = tmp_path_factory.mktemp("mp") / "traces"
    proc = subprocess.run([sys.executable, "-m", "rdvpump", "universe", "up",
                           str(ROOT / "examples/echo.toml"), "--trace", str(traces),
                           "--run", "mp"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "COLUMNS": "160"})
    assert proc.returncode == 0, proc.stderr
    return traces


def test_spark_submit_on_a_standalone_cluster_matches_local_mode(
        cluster: tuple[str, dict[str, str]], multi_process_traces: pathlib.Path,
        spark: Any, tmp_path: pathlib.Path) -> None:
    url, env = cluster
    home = pathlib.Path(env["SPARK_HOME"])
    out = tmp_path / "cluster-out"
    proc = subprocess.run(
        [str(home / "bin" / "spark-submit"), "--master", url,
         "--conf", "spark.ui.enabled=false", "--conf", "spark.executor.memory=512m",
         "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.cores.max=2",
         "--driver-java-options",
         f"-Dlog4j.configurationFile=file:{ROOT / 'replay/log4j2.properties'}",
         str(ROOT / "replay/job.py"), "--traces", str(multi_process_traces),
         "--out", str(out)],
        capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    on_cluster = json.loads((out / "summary.json").read_text())
    local = analyze(spark, str(multi_process_traces), str(tmp_path / "local-out"))
    # 8,000 echo messages; the name service's own, on its links to the manager, apart
    assert on_cluster["violation_count"] == 0 and on_cluster["messages_matched"] == 8000
    assert on_cluster["name_service"]["links"] == 3
    assert on_cluster["pumps"] == ["client1", "client2", "manager", "server"]
    differ = ("out", "spark_jobs")
    assert {k: v for k, v in on_cluster.items() if k not in differ} == \
        {k: v for k, v in local.items() if k not in differ}
    for plot in ("throughput.png", "latency.png", "links.png"):
        assert (out / plot).stat().st_size > 10_000
    # the executors ran on the workers: each worker started one for this application
    work = [p for p in pathlib.Path(env["SPARK_LOCAL_DIRS"]).glob("work*/app-*/*")
            if p.is_dir()]
    assert len(work) == 2, work
