"""The replay job's driver-side helpers, without Spark."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest

from replay import jvm, measure
from replay import spark as job


@pytest.mark.parametrize(("duration", "width"), [
    (0.39, 0.002), (1.0, 0.005), (0.0, 1e-6), (30.0, 0.2), (200.0, 1.0), (3600.0, 20.0)])
def test_bins_fit_the_run_and_divide_a_second(duration: float, width: float) -> None:
    assert measure.bin_width(duration) == width
    assert duration / width <= measure.PLOT_BINS
    if width < 1:
        assert abs(round(1 / width) * width - 1) < 1e-9  # whole bins make a second


def test_the_jvm_profile_follows_the_size_of_the_traces(tmp_path: pathlib.Path) -> None:
    (tmp_path / "a.p.jsonl").write_bytes(b"x" * (1 << 20))
    assert jvm.jvm_for(str(tmp_path)) == "quick"
    (tmp_path / "b.p.parquet").write_bytes(b"x" * (4 << 20))
    assert jvm.jvm_for(str(tmp_path)) == "production"


def test_the_class_archive_can_be_turned_off(monkeypatch: pytest.MonkeyPatch,
                                             tmp_path: pathlib.Path) -> None:
    pytest.importorskip("pyspark")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("RDVPUMP_SPARK_CDS", "0")
    assert jvm.class_archive("quick") == ("", None)
    monkeypatch.delenv("RDVPUMP_SPARK_CDS")
    assert jvm.class_archive("quick", write=False) == ("", None)
    options, pending = jvm.class_archive("quick")
    assert pending is not None and f"-XX:ArchiveClassesAtExit={pending}" in options
    # while one JVM is to write it (this process's), the others go without
    assert jvm.class_archive("quick") == ("", None)
    # what a JVM left on its way out, unseen by the process that started it (which is
    # gone), may be cut short: it is removed, and the next JVM writes one again
    left = pathlib.Path(pending).rename(pathlib.Path(pending).with_suffix(".999999999"))
    left.write_bytes(b"jsa")
    options, pending = jvm.class_archive("quick")
    assert not left.exists() and pending is not None
    # the empty file of a JVM that ended without writing one is not kept
    jvm._keep_archive(pending)
    assert not pathlib.Path(pending).exists()
    assert not list(pathlib.Path(pending).parent.glob("*.jsa"))
    options, pending = jvm.class_archive("quick")
    assert pending is not None
    # one that stop_spark saw written is moved into place, and then used; a
    # SparkSession that is not to write one uses it too
    pathlib.Path(pending).write_bytes(b"j" * (2 << 20))
    jvm._keep_archive(pending)
    options, pending = jvm.class_archive("quick")
    assert pending is None and "-XX:SharedArchiveFile=" in options
    assert jvm.class_archive("quick", write=False) == (options, None)
    # another one left beside it is removed
    extra = pathlib.Path(str(options.split("SharedArchiveFile=")[1]) + ".999999998")
    extra.write_bytes(b"jsa")
    jvm.class_archive("quick")
    assert not extra.exists()
    # an archive of an older generation of the job (which loaded other classes) is
    # removed; the other profile's archive stays
    import os
    import shutil

    import pyspark

    archive = pathlib.Path(options.split("SharedArchiveFile=")[1])
    home = os.path.dirname(os.path.realpath(pyspark.__file__))
    java = os.path.realpath(shutil.which("java") or "java")
    assert archive.name == jvm._archive_name(java, "quick", home)
    ours = archive.name.rsplit("-", 1)[0]
    older = archive.with_name(f"{ours}-000000000000.jsa")
    production = archive.with_name(jvm._archive_name(java, "production", home))
    # and so is one such a JVM left unfinished when it died; one still being written stays
    dead = older.with_name(older.name + ".999999997")
    writing = older.with_name(f"{older.name}.{os.getpid()}")
    # one named before archives named their installation is removed; another
    # installation's (another virtualenv's, whose JVMs refuse this one's) stays
    unnamed = archive.with_name(f"spark-{pyspark.__version__}-000000000000.jsa")
    elsewhere = archive.with_name(jvm._archive_name(java, "quick", "/another/venv"))
    assert elsewhere != archive
    for path in (older, production, dead, writing, unnamed, elsewhere):
        path.write_bytes(b"jsa")
    jvm.class_archive("quick")
    assert not older.exists() and not dead.exists() and not unnamed.exists()
    assert archive.exists() and production.exists() and writing.exists()
    assert elsewhere.exists()


def test_a_jdk_upgraded_in_place_gets_an_archive_of_its_own(tmp_path: pathlib.Path) -> None:
    """A JVM refuses, silently, an archive another build wrote: the name follows the
    build (its java binary and ``release`` file), not only the path."""
    pytest.importorskip("pyspark")
    import os

    java = tmp_path / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_bytes(b"java")
    release = tmp_path / "jdk" / "release"
    release.write_text('JAVA_VERSION="17.0.15"\n')
    before = jvm._archive_name(str(java), "quick", "/venv")
    assert jvm._archive_name(str(java), "quick", "/venv") == before
    release.write_text('JAVA_VERSION="17.0.19"\n')
    os.utime(release, ns=(1, 1))
    assert jvm._archive_name(str(java), "quick", "/venv") != before


@pytest.mark.parametrize(("output", "reason"), [
    # the JVM refusing an option: its first line after the ones every start prints
    ("Picked up JAVA_TOOL_OPTIONS: -XX:CICompilerCount=1\n"
     "CICompilerCount (1) must be at least 2 \n"
     "Error: Could not create the Java Virtual Machine.\n",
     "CICompilerCount (1) must be at least 2"),
    ("Error: VM option 'X' is diagnostic and must be enabled first.\n",
     "VM option 'X' is diagnostic and must be enabled first."),
    # spark-submit refusing the master: the Java exception's message
    ("WARNING: Using incubator modules: jdk.incubator.vector\n"
     'Exception in thread "main" org.apache.spark.SparkException: Master must either '
     "be yarn or start with spark, k8s, or local\n\tat org.apache.spark.Foo(Foo.scala:1)\n",
     "Master must either be yarn or start with spark, k8s, or local"),
    # Spark giving up on the application: its reason, before any exception
    ("Setting default log level to \"WARN\".\n"
     "26/11/27 19:38:42 ERROR StandaloneSchedulerBackend: Application has been killed. "
     "Reason: All masters are unresponsive! Giving up.\n"
     "java.lang.IllegalStateException: Cannot call methods on a stopped SparkContext.\n",
     "All masters are unresponsive! Giving up."),
    # a worker's Python failing: its error as Python prints it, not the traceback's head
    ("26/11/27 19:41:16 ERROR Executor: Exception in task 0.0 in stage 0.0 (TID 0)\n"
     "org.apache.spark.api.python.PythonException: [PYTHON_EXCEPTION] An exception was "
     "thrown from the Python worker: Traceback (most recent call last):\n"
     '  File "worker.py", line 1, in <module>\n'
     "ModuleNotFoundError: No module named 'pyarrow'\n",
     "ModuleNotFoundError: No module named 'pyarrow'"),
    ("Picked up JAVA_TOOL_OPTIONS: -Xss1m\n\n", ""),
    ("26/11/27 19:41:16 WARN NativeCodeLoader: Unable to load native-hadoop library\n"
     "\tat org.apache.spark.Foo(Foo.scala:1)\n", ""),
])
def test_why_a_jvm_or_spark_would_not_go_on_is_its_first_complaint(output: str,
                                                                   reason: str) -> None:
    assert jvm.first_complaint(output) == reason


def test_size_buckets_are_the_least_power_of_two_at_or_above() -> None:
    import numpy as np

    from replay.fold import _size_buckets

    sizes = [-3, 0, 1, 2, 3, 63, 64, 65, 1 << 29, (1 << 29) + 1, (1 << 40) - 1]
    assert _size_buckets(np.array(sizes)).tolist() == [
        0, 0, 1, 2, 4, 64, 64, 128, 1 << 29, 1 << 30, 1 << 40]


def test_streams_are_spread_over_partitions_by_their_messages() -> None:
    from replay.fold import assign

    assert assign([10, 10, 10, 10], 2).tolist() == [0, 1, 0, 1]
    assert assign([100, 1, 1, 1, 1], 2).tolist() == [0, 1, 1, 1, 1]
    assert assign([5], 3).tolist() == [0]


def test_row_groups_are_packed_one_run_per_core_unless_a_run_is_too_big() -> None:
    """As many tasks as cores, each a run of row groups of near equal bytes; more where a
    task would read over spark.sql.files.maxPartitionBytes; never more than row groups."""
    from types import SimpleNamespace

    def spark(cores: int, most: str = "128m") -> object:
        conf = {"spark.sql.files.maxPartitionBytes": most}
        return SimpleNamespace(conf=SimpleNamespace(get=lambda k, d=None: conf.get(k, d)),
                               sparkContext=SimpleNamespace(defaultParallelism=cores))

    mb = 1 << 20
    assert job._pack([2 * mb] * 13, spark(1)) == [list(range(13))]
    assert job._pack([2 * mb] * 12, spark(2)) == [list(range(6)), list(range(6, 12))]
    assert job._pack([2 * mb] * 3, spark(8)) == [[0], [1], [2]]
    assert [len(t) for t in job._pack([2 * mb] * 12, spark(1, "8m"))] == [4, 4, 4]
    assert job._bytes("128m") == 128 * mb and job._bytes("4194304") == 4 * mb


def test_rows_are_put_in_stream_and_seq_order_null_first_whatever_the_numbers() -> None:
    """The packed sort key and the three-key sort (for numbers that do not pack) agree."""
    import numpy as np

    from replay.fold import _seq_order

    rng = np.random.default_rng(5)
    sid = rng.integers(0, 3, 500)
    seq = rng.integers(0, 50, 500)
    seq_ok = rng.random(500) > 0.1
    seq[~seq_ok] = 0
    packed = _seq_order(sid, seq, seq_ok)
    wide = _seq_order(sid, seq + (1 << 50), seq_ok)  # too wide to pack
    assert packed.tolist() == wide.tolist() == np.lexsort((seq, seq_ok, sid)).tolist()
    first = packed[0]
    assert sid[first] == sid.min() and (not seq_ok[first] or seq_ok.all())


def test_a_reduce_task_past_its_memory_holds_blocks_in_a_file_and_folds_the_same(
        monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    """Blocks past HELD_BYTES wait in a temporary file (in SPARK_LOCAL_DIRS) and come
    back whole: the fold's result is the same as when all are held in memory."""
    pa = pytest.importorskip("pyarrow")
    from replay import fold

    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path))
    rows: dict[str, list[object]] = {n: [] for n in (
        "kind", "run", "pump", "link", "dir", "time", "seq", "size", "step")}
    for link in ("a/1", "a/2"):
        for seq in range(200):
            late = 0.5 if seq == 77 else 0.0  # one message past its successor
            for kind, at in (("send", seq / 100), ("deliver", 1 + seq / 100 + late)):
                for name, value in (("kind", kind), ("run", "r"), ("pump", "p"),
                                    ("link", link), ("dir", "ab"), ("time", at),
                                    ("seq", seq), ("size", 8 + seq % 3),
                                    ("step", len(rows["step"]))):
                    rows[name].append(value)
    table = pa.table(rows)
    table = table.append_column("bad", pa.array([False] * len(table))).append_column(
        "ord", pa.array(range(len(table)), pa.int64()))
    sids = {("r", "a/1", "ab"): 0, ("r", "a/2", "ab"): 1}
    pieces = fold.Pieces([400, 400], [0, 0], [199, 199], most=100)
    to, keys = fold.assign(pieces.rows.tolist(), 1), fold.partition_keys(1)
    blocks = [(p, b) for half in (table.slice(0, 400), table.slice(400))
              for _, p, b in fold.route(half, sids, {}, pieces, to, keys)]
    assert len(blocks) == 8  # two map tasks' blocks of the same pieces

    def folded(held_bytes: int) -> Any:
        return fold.fold(blocks, start=0.0, width=0.5, per_second=False,
                         fine_per_decade=measure.FINE_PER_DECADE,
                         buckets_per_decade=measure.BUCKETS_PER_DECADE,
                         held_bytes=held_bytes).sort_by([("sid", "ascending")])

    in_memory, in_a_file = folded(fold.HELD_BYTES), folded(0)
    assert in_a_file.equals(in_memory) and in_memory.num_rows > 0
    with fold._Held(sum(len(b) for _, b in blocks[:3])) as held:
        for piece, block in blocks:
            held.add(piece, block)
        assert held.file is not None and all(isinstance(b, tuple) for bs in held.blocks.values()
                                    for b in bs)
        assert [b for p in held.pieces() for b in held.pop(p)] == [
            b for _, b in sorted(blocks, key=lambda pb: pb[0])]


def test_plots_of_a_run_where_no_time_passed_say_so_instead_of_a_rate(
        tmp_path: pathlib.Path) -> None:
    """A simulated run whose events share one instant: the throughput plot shows the
    messages each broker received, not a rate per second over a 1 µs bin; the latency
    bucket that holds zero says so; the timeline says no time passed."""
    pytest.importorskip("matplotlib")
    from replay import fold, plots

    per_broker = {"client1": {0: 2500}, "server": {0: 5000}, "client2": {0: 2500}}
    fig = plots.throughput(tmp_path / "t.png", per_broker, width=1e-6, bins=1, duration=0.0,
                           title="run r")
    (ax,) = fig.axes
    assert ax.get_ylabel() == "messages delivered" and "one instant" in ax.get_title()
    assert [t.get_text() for t in ax.get_xticklabels()] == ["server", "client1", "client2"]
    assert [p.get_height() for p in ax.patches] == [5000, 2500, 2500]
    (ax,) = plots.throughput(tmp_path / "t.png", per_broker, width=1e-6, bins=2,
                             duration=1e-6, title="run r").axes
    assert ax.get_ylabel() == "messages delivered per second"

    def notes(low_s: float) -> list[str]:
        fig = plots.latency(tmp_path / "l.png", [{"low_s": low_s, "high_s": low_s * 1.122,
                                                  "messages": 10_000}], None,
                              least=fold.LEAST_LATENCY_S, title="run r")
        return [t.get_text() for t in fig.axes[0].texts]

    assert notes(10 ** (-180 / 20)) == ["10,000 below 1.12 ns (zero included)"]
    assert notes(1e-6) == []
    links = [{"link": "s/1", "start": 0.0, "end": 0.0, "connect": 0.0, "bins": {0: 9}}]
    for duration, said in ((0.0, True), (0.5, False)):
        fig = plots.timeline(tmp_path / "x.png", links, width=1e-6 if said else 0.005,
                             duration=duration, title="run r")
        assert ("no time passed" in fig.axes[0].get_title()) is said


def test_a_held_block_that_comes_back_short_is_an_error_not_a_silent_loss() -> None:
    """A block the file no longer holds whole (the disk cut it) is an OSError naming the
    file, never a shorter block folded as if whole."""
    pytest.importorskip("pyarrow")
    import os

    from replay import fold

    with fold._Held(0) as held:
        held.add(3, b"x" * 100)
        held.add(3, b"y" * 50)
        held.pieces()
        os.ftruncate(held.file.fileno(), 120)
        with pytest.raises(OSError, match="a held block of piece 3 came back short"):
            held.pop(3)


def test_a_stop_that_is_never_answered_ends_with_the_jvm_killed() -> None:
    """After a Ctrl-C the gateway may never answer the session's stop: the command still
    ends within the stop's bound, with the JVM's process killed and reaped."""
    import subprocess
    import sys
    import threading
    import time
    import types

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    never = threading.Event()
    try:
        session = types.SimpleNamespace(
            stop=never.wait,  # a stop that hangs, as on a connection left mid-call
            sparkContext=types.SimpleNamespace(_gateway=types.SimpleNamespace(proc=proc)))
        start = time.monotonic()
        jvm.stop_spark(session, timeout=0.5)
        assert time.monotonic() - start < 5
        assert proc.returncode == -9
    finally:
        never.set()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_spark_failure_is_one_line_from_what_was_printed_else_from_the_exception() -> None:
    class Unprintable(Exception):
        def __str__(self) -> str:
            raise ValueError("no")

    start = jvm.SparkStartError("Spark did not start on local[x]", "Could not parse it")
    assert jvm.failure(start, "Exception in thread \"main\" java.lang.Error: bad\n") == (
        "Spark did not start on local[x]: bad")
    assert jvm.failure(start, "") == "Spark did not start on local[x]: Could not parse it"
    assert jvm.failure(jvm.SparkStartError("no JVM"), "") == "no JVM"
    assert jvm.failure(RuntimeError("x.y.SomeException: it broke"), "") == "it broke"
    assert jvm.failure(Unprintable(), "") == "Unprintable"


def test_py4j_deleting_an_object_of_a_jvm_gone_under_it_logs_nothing(
        caplog: pytest.LogCaptureFixture) -> None:
    """py4j's finalizer worker tells the JVM of each reference Python dropped; a JVM that
    dies in the middle of that call (here a server on 127.0.0.1 that reads the command and
    resets the connection) made py4j log the call with a traceback on the root logger,
    after a failed command's one-line error.  That is dropped; the same call failing on
    another thread is still logged."""
    clientserver = pytest.importorskip("py4j.clientserver")
    import collections
    import socket
    import struct
    import threading

    from py4j.java_gateway import GatewayProperty, PythonProxyPool

    jvm.quiet_py4j()
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(10)

    def dies_mid_call(calls: int) -> None:
        for _ in range(calls):
            conn, _ = listener.accept()
            conn.recv(1024)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()  # a reset, as from a killed JVM

    server = threading.Thread(target=dies_mid_call, args=(2,), daemon=True)
    server.start()
    tasks: collections.deque[Any] = collections.deque()
    client = clientserver.JavaClient(
        clientserver.JavaParameters(port=listener.getsockname()[1]),
        clientserver.PythonParameters(), GatewayProperty(False, PythonProxyPool()), tasks)
    worker = clientserver.FinalizerWorker(tasks)
    with caplog.at_level("WARNING"):
        worker.start()
        client.garbage_collect_object("o1")  # queued for the worker
        tasks.appendleft(clientserver.SHUTDOWN_FINALIZER_WORKER)
        worker.join(10)
        assert not worker.is_alive()
        assert caplog.records == []
        other = threading.Thread(target=client.garbage_collect_object, args=("o2", False))
        other.start()
        other.join(10)
    server.join(10)
    listener.close()
    assert [r.getMessage() for r in caplog.records] == ["Exception while sending command."]


def test_the_summary_keeps_latencies_of_virtual_and_real_clocks_apart(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Two runs, one simulated (its latencies 0: simulated time) and one on the real
    clock: no latency line over both; each run's own p50 and p99 instead.  Runs on one
    clock keep the line over all runs."""
    from replay.output import print_summary

    monkeypatch.setenv("COLUMNS", "200")

    def summary(clocks: tuple[str, str]) -> dict[str, Any]:
        runs = {f"r{i}": {"clock": clock, "duration_s": 1.0, "messages_matched": 10,
                          "latency_s": {"p50": 0.0, "p90": 0.0, "p99": 0.0, "max": 0.0}
                          if clock == "virtual" else
                          {"p50": 40e-6, "p90": 60e-6, "p99": 90e-6, "max": 120e-6}}
                for i, clock in enumerate(clocks)}
        return {"traces": "traces/", "files": 2, "pumps": ["a", "b"], "events": 40,
                "links": 2, "messages_sent": 20, "messages_delivered": 20,
                "messages_across_pumps": 0, "violation_count": 0,
                "undelivered_by_cause": {}, "latency_s": {"p50": 20e-6, "p90": 55e-6,
                                                          "p99": 90e-6, "max": 120e-6},
                "refusals": {}, "name_service": {"links": 0}, "corrupt_line_count": 0,
                "by_run": runs, "violations": [], "corrupt_lines": []}

    print_summary(summary(("virtual", "real")))
    shown = capsys.readouterr().out
    assert "(runs on virtual and real clocks: see each run)" in shown
    assert "20.0 us" not in shown  # the mixed figure is not printed
    assert "p50 / p99 0.0 us / 0.0 us" in shown and "p50 / p99 40.0 us / 90.0 us" in shown
    print_summary(summary(("real", "real")))
    assert "(all runs)" in capsys.readouterr().out
