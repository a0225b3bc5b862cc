"""The JVM and the SparkSession of the replay: JVM settings, a class-data-sharing
archive of Spark's classes for local masters, Spark's logging kept to errors.

``rdvpump trace analyze --engine spark``, ``rdvpump bench replay`` and the tests start
their SparkSessions here; under ``spark-submit replay/job.py`` the job asks for one without a
master, which leaves everything to spark-submit.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pump import RdvpumpError
from replay.sources import under


class SparkStartError(RdvpumpError, RuntimeError):
    """No SparkSession: its JVM ended before it started (a JVM option it refused, too
    little memory, no Java it can run), or Spark refused the master or could not reach
    it.  What the JVM printed says why (:func:`first_complaint`); ``detail`` is Spark's
    own message when it gave one."""

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail


#: JVM settings.  "production" keeps the full JIT (C1, then C2) and the parallel
#: collector, for throughput; "quick" stops at the C1 compiler and uses the serial
#: collector: it starts and warms up faster, and wins on traces that take seconds.
JVM_PROFILES = {"production": "-XX:+UseParallelGC",
                "quick": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"}
#: Traces smaller than this on disk (JSON Lines, Parquet: about 200,000 events either way)
#: are analysed with the quick profile by default; on larger ones the full JIT wins.
QUICK_BYTES = {"jsonl": 32 << 20, "parquet": 4 << 20}


def jvm_for(traces: str) -> str:
    """The JVM profile for these traces: quick under :data:`QUICK_BYTES`, else production."""
    return "quick" if under(traces, QUICK_BYTES) else "production"


#: Bumped when the job comes to load other classes (a new kind of Spark work): a new
#: archive is then written, since an old one lacks them.  2: the Python workers' Arrow.
_ARCHIVED_CLASSES = 2


def class_archive(profile: str, *, write: bool = True) -> tuple[str, str | None]:
    """JVM options for a class-data-sharing archive of Spark's classes, and the path the
    archive is written to when this JVM exits (None when it is already there, when
    another JVM is writing it, or with ``write`` False: the options are then empty until
    it is there).

    Loading Spark's classes from an archive instead of its jars saves about two
    seconds of every start on this machine.  The first run writes the archive (about
    170 MB) under ``$XDG_CACHE_HOME/rdvpump`` (``~/.cache/rdvpump``) for the JVM, the
    pyspark installation (a JVM refuses an archive whose jars are not where they were:
    each virtualenv has its own), the profile and :data:`_ARCHIVED_CLASSES`: its JVM
    writes it on its way out, and :func:`stop_spark` moves it into place once that JVM
    has ended well.  One JVM writes it at a time (the file it is to write is there from
    its start: the JVMs that start meanwhile go without).  What a JVM left that way is
    removed once the process that started it is gone (it may be cut short: the JVM
    killed, or its process never waited), and so are the archives of older generations
    for the same pyspark installation.  Set ``RDVPUMP_SPARK_CDS=0`` to go without.
    """
    if os.environ.get("RDVPUMP_SPARK_CDS", "1") == "0":
        return "", None
    import pyspark

    final = archive_path(profile)
    cache = final.parent
    current = {archive_path(p).name for p in JVM_PROFILES}
    ours = final.name.rsplit("-", 1)[0]  # spark-VERSION-WHERE: this installation's
    for other in cache.glob(f"spark-{pyspark.__version__}-*.jsa*"):  # older generations
        # finished (NAME.jsa), or written by a JVM on its way out (NAME.jsa.PID)
        name, pid = (other.name, "") if other.suffix == ".jsa" else (other.stem, other.suffix[1:])
        # this installation's, or one named before archives named their installation
        mine = name.startswith(ours + "-") or name.count("-") == 2
        if mine and name not in current and not (pid.isdigit() and _alive(int(pid))):
            other.unlink(missing_ok=True)
    writing = False
    for left in cache.glob(final.name + ".*"):  # being written, or never moved into place
        pid = left.suffix[1:]
        if pid.isdigit() and _alive(int(pid)):
            writing = True
        else:
            left.unlink(missing_ok=True)
    if final.exists():
        return f"{_QUIET_CDS} -XX:SharedArchiveFile={final}", None
    if writing or not write:
        return "", None
    pending = Path(f"{final}.{os.getpid()}")
    try:
        cache.mkdir(parents=True, exist_ok=True)
        pending.touch()  # this process's JVM writes it: the others see so
    except OSError:
        return "", None
    return f"{_QUIET_CDS} -XX:ArchiveClassesAtExit={pending}", str(pending)


#: The JVM options that keep class-data sharing quiet: a JVM says nothing of an archive it
#: cannot use (not there, or of another JVM build), and runs without it.
_QUIET_CDS = "-Xlog:cds=off -Xlog:cds+dynamic=off -Xshare:auto"


def archive_path(profile: str) -> Path:
    """Where the class archive of Spark's classes for ``profile``, this Java and this
    pyspark installation is, once a JVM has written it (:func:`class_archive`)."""
    import shutil as _shutil

    import pyspark

    java = os.path.realpath(_shutil.which("java") or "java")
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rdvpump"
    home = os.path.dirname(os.path.realpath(pyspark.__file__))
    return cache / _archive_name(java, profile, home)


def archive_options(profile: str) -> str:
    """JVM options that load the class archive for ``profile`` if it is there when the
    JVM starts, and start without it (silently) if not: for JVMs started later by
    something else (a script's ``JAVA_TOOL_OPTIONS``), which may find it written by
    then.  Empty with ``RDVPUMP_SPARK_CDS=0``."""
    if os.environ.get("RDVPUMP_SPARK_CDS", "1") == "0":
        return ""
    return f"{_QUIET_CDS} -XX:SharedArchiveFile={archive_path(profile)}"


#: Less than this is not an archive of Spark's classes (about 170 MB): a JVM that ended
#: without writing one left the empty file :func:`class_archive` made.
_LEAST_ARCHIVE = 1 << 20


def _keep_archive(pending: str) -> None:
    """The archive a JVM wrote on its way out, moved into place (the first one wins)."""
    final = pending.rsplit(".", 1)[0]
    try:
        if os.path.exists(final) or os.path.getsize(pending) < _LEAST_ARCHIVE:
            os.unlink(pending)
        else:
            os.replace(pending, final)
    except OSError:  # the cache is a convenience: going without it is never an error
        pass


def _archive_name(java: str, profile: str, home: str) -> str:
    """The archive's file name, ``spark-VERSION-WHERE-TAG.jsa``: WHERE stands for the
    pyspark installation at ``home`` (a JVM refuses, silently, an archive whose jars were
    elsewhere), TAG for this JVM build (and any other's: a JDK upgraded in place keeps its
    path), the profile and the generation."""
    import hashlib

    import pyspark

    build = ""
    for path in (Path(java), Path(java).parent.parent / "release"):
        with contextlib.suppress(OSError):
            stat = path.stat()
            build += f"\0{stat.st_size}\0{stat.st_mtime_ns}"
    where = hashlib.sha256(home.encode()).hexdigest()[:8]
    tag = hashlib.sha256(f"{java}{build}\0{pyspark.__version__}\0{profile}\0"
                         f"{_ARCHIVED_CLASSES}".encode()).hexdigest()[:12]
    return f"spark-{pyspark.__version__}-{where}-{tag}.jsa"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class _Py4jAfterTheJvm(logging.Filter):
    """Drops what py4j logs from the two threads whose calls into the JVM may fail only
    because the JVM is gone, or is being ended, under them: py4j's finalizer worker,
    telling the JVM that Python dropped a reference (an object of a JVM that no longer
    exists needs no deleting), and :func:`stop_spark`'s stop, whose JVM it kills when the
    stop is not answered.  py4j logs such a failed call on the root logger with a
    traceback (``Exception while sending command.``) whatever the call was; a command
    whose JVM it ended would print that after its own one-line error."""

    def filter(self, record: logging.LogRecord) -> bool:
        import threading

        import py4j
        from py4j.clientserver import FinalizerWorker

        if not record.pathname.startswith(os.path.dirname(py4j.__file__) + os.sep):
            return True
        thread = threading.current_thread()
        return not (isinstance(thread, FinalizerWorker) or thread.name == _STOP_THREAD)


_STOP_THREAD = "spark-stop"
_QUIET_PY4J = _Py4jAfterTheJvm()


def quiet_py4j() -> None:
    """:class:`_Py4jAfterTheJvm` on the root logger, where py4j logs (once: a filter there
    is not added again).  :func:`start_spark` calls it."""
    logging.getLogger().addFilter(_QUIET_PY4J)


def start_spark(master: str | None = None, *, app: str = "rdvpump-replay",
            log4j: str | None = None, warehouse: str | None = None,
            driver_memory: str = "2g", jvm: str = "production",
            shuffle_partitions: int = 4, write_archive: bool = True) -> Any:
    """A SparkSession on ``master`` with the JVM profile ``jvm`` (:data:`JVM_PROFILES`);
    ``master`` None leaves everything to spark-submit.  Its JVM loads Spark's classes
    from the class archive (:func:`class_archive`), or writes it when it is not there and
    ``write_archive`` (for a SparkSession that :func:`stop_spark` will end well).

    Spark logs errors only (``replay/log4j2.properties``); ``log4j=""`` keeps Spark's
    own logging, another path names a log4j2 configuration file.
    """
    from pyspark.sql import SparkSession

    quiet_py4j()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app)
    if master is not None:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        archive, pending = class_archive(jvm, write=write_archive)
        if log4j is None:
            log4j = str(Path(__file__).resolve().parent / "log4j2.properties")
        jopts = " ".join(filter(None, (
            f"-Dlog4j.configurationFile=file:{log4j}" if log4j else "", JVM_PROFILES[jvm],
            archive)))
        builder = (builder.master(master)
                   .config("spark.ui.enabled", "false")
                   .config("spark.ui.showConsoleProgress", "false")
                   .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
                   .config("spark.driver.host", "127.0.0.1")
                   .config("spark.driver.bindAddress", "127.0.0.1")
                   .config("spark.driver.memory", driver_memory)
                   .config("spark.driver.extraJavaOptions", jopts))
        if warehouse:
            builder = builder.config("spark.sql.warehouse.dir", warehouse)
    else:
        pending = None
    builder = builder.config("spark.sql.session.timeZone", "UTC")
    try:
        spark = builder.getOrCreate()
    except BaseException as exc:
        if pending is not None:  # no JVM of ours is to write it: another may
            Path(pending).unlink(missing_ok=True)
        if _condition(exc) == "JAVA_GATEWAY_EXITED":
            raise SparkStartError("Spark's JVM ended before it started") from exc
        if master is not None and type(exc).__name__ == "Py4JJavaError":
            raise SparkStartError(f"Spark did not start on {master}",
                                  _java_message(exc)) from exc
        raise
    spark.sparkContext.setLogLevel("ERROR")
    if pending is not None:
        _PENDING[id(spark)] = pending
    return spark


#: A Java exception's line: ``org.apache.spark.SparkException: Invalid master URL: x``,
#: after ``Exception in thread "main"`` when it ended the JVM.
_EXCEPTION = re.compile(r'(?:Exception in thread "[^"]*" )?[\w.$]+(?:Exception|Error): (.+)')
#: Lines every JVM or Spark start may print, which say nothing of a failure.
_NOISE = ("Picked up ", "WARNING: Using incubator", "Setting default log level",
          "To adjust logging level", "at ")
#: Spark's log lines below its errors (``26/11/27 19:41:16 WARN NativeCodeLoader: ...``).
_MINOR = re.compile(r"\d\d/\d\d/\d\d \d\d:\d\d:\d\d (?:WARN|INFO|DEBUG|TRACE) ")


def first_complaint(output: str) -> str:
    """Why a JVM or Spark would not start, from what it printed: the reason Spark gave
    for ending the application (``All masters are unresponsive! Giving up.``), else the
    first Java exception's message (``Invalid master URL: spark://x``) or Python
    exception (``ModuleNotFoundError: No module named 'pyarrow'``), else the first
    line that is not one every start prints (``CICompilerCount (1) must be at least
    2``); empty if there is none."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for line in lines:
        if "Reason: " in line:
            return line.split("Reason: ", 1)[1]
    for line in lines:
        match = _EXCEPTION.fullmatch(line)
        if match is None or match.group(1).endswith("Traceback (most recent call last):"):
            continue  # a Python worker's traceback: its last line says what it was
        name = line.split(":", 1)[0].rsplit(" ", 1)[-1]
        # a Java exception by its message; a Python one as Python prints it
        return match.group(1) if "." in name else line
    for line in lines:
        if not line.startswith(_NOISE) and not _MINOR.match(line):
            return line.removeprefix("Error: ")
    return ""


def failure(exc: BaseException, output: str) -> str:
    """One line of why Spark did not start or a job failed: the JVM's or Spark's own
    words from ``output`` (what it printed), else from the exception (Spark's detail for
    a start, the first complaint in its text, or its type's name)."""
    said = first_complaint(output)
    if isinstance(exc, SparkStartError):
        said = said or exc.detail
        return f"{exc}: {said}" if said else str(exc)
    if not said:
        try:
            said = first_complaint(str(exc))
        except Exception:  # noqa: BLE001 - pyspark's PythonException may fail to print
            said = ""
    return said or type(exc).__name__


def from_spark(exc: BaseException) -> bool:
    """Whether ``exc`` is Spark's (a job that failed, its workers' Python included)."""
    from pyspark.errors import PySparkException

    return isinstance(exc, PySparkException) or type(exc).__name__ == "Py4JJavaError"


def _java_message(exc: BaseException) -> str:
    """The first line of the Java exception a Py4JJavaError carries, or empty."""
    try:
        message = exc.java_exception.getMessage()  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - the gateway may be gone too: no detail then
        return ""
    return str(message or "").strip().split("\n", 1)[0]


def _condition(exc: BaseException) -> str | None:
    """The error condition of a pyspark error (``JAVA_GATEWAY_EXITED``), else None."""
    get = getattr(exc, "getCondition", None) or getattr(exc, "getErrorClass", None)
    condition = get() if callable(get) else None
    return condition if isinstance(condition, str) else None


#: The class archive each SparkSession's JVM writes on its way out (:func:`class_archive`).
_PENDING: dict[int, str] = {}
#: Seconds a JVM is given to write the class archive once told to exit.
ARCHIVE_WAIT = 60.0


def stop_spark(spark: Any, timeout: float = 10.0, *, archive: bool = True,
               progress: Callable[[str], None] | None = None) -> None:
    """Stop ``spark`` and end its JVM before returning, so that a command leaves no JVM
    behind: the SparkSession is stopped through the gateway (which cancels its jobs), then
    the JVM is told to exit and waited for.  A JVM started to write the class archive
    (:func:`class_archive`) writes it then, within :data:`ARCHIVE_WAIT` seconds, and the
    archive is moved into place (``progress`` is told, if given).  ``archive=False``
    (after a Ctrl-C or a failure) kills the JVM at once instead: nothing is written on
    the way out.

    The JVM is killed too if the stop has not returned within ``timeout`` seconds: after
    a Ctrl-C the gateway connection may be left in the middle of a call, and a stop sent
    on it may never be answered; a command must still end."""
    import subprocess
    import threading

    done = threading.Event()

    def stop() -> None:
        try:
            spark.stop()
        except Exception:  # noqa: BLE001 - the JVM may be gone already; it is killed below
            pass
        finally:
            done.set()

    pending = _PENDING.pop(id(spark), None)
    threading.Thread(target=stop, name=_STOP_THREAD, daemon=True).start()
    stopped = done.wait(timeout)
    gateway = getattr(spark.sparkContext, "_gateway", None)
    proc = getattr(gateway, "proc", None)
    try:
        if proc is not None and stopped and archive:
            if pending is not None and progress is not None:
                progress("writing Spark's class archive for the runs after this one")
            if proc.stdin is not None:  # pyspark's gateway exits at the end of its input
                proc.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(ARCHIVE_WAIT if pending is not None else timeout)
    finally:  # interrupted while it writes, too: nothing is left running or half written
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        if pending is not None:
            if stopped and archive and proc is not None and proc.returncode == 0:
                _keep_archive(pending)
            else:
                Path(pending).unlink(missing_ok=True)


@contextlib.contextmanager
def ending(spark: Any, *, progress: Callable[[str], None] | None = None) -> Iterator[Any]:
    """``spark`` for the block, its JVM ended on the way out by :func:`stop_spark`: the
    class archive written only when the block ended without an exception (a Ctrl-C or a
    failure kills the JVM at once)."""
    try:
        yield spark
    except BaseException:
        stop_spark(spark, archive=False)
        raise
    stop_spark(spark, progress=progress)
