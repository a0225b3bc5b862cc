"""rdvpump trace: analyse and draw pump traces."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pathlib
import shutil
import signal
import sys
from collections.abc import Callable, Iterator
from typing import Annotated, Any

import typer

from ._common import err, fail, guard

app = typer.Typer(rich_markup_mode=None, help="Analyse and draw pump traces.",
                  no_args_is_help=True)


AnalysisOutOption = Annotated[pathlib.Path | None, typer.Option(
    help="Write tables, summary.json, plots and Spark's log here (default: "
         "TRACES/analysis, or FILE.analysis beside one file).")]
EngineOption = Annotated[str, typer.Option(
    help="Where the analysis runs: local (in this process, no JVM: traces that fit "
         "in memory), spark, or auto: local for traces of up to about 400,000 events "
         "(64 MB of JSON Lines, 8 MB of Parquet) unless --master is given, Spark "
         "above. Both give the same results.")]
JvmOption = Annotated[str, typer.Option(
    help="Spark's JVM profile: quick (C1 compiler, serial GC), production (full JIT, "
         "parallel GC), or auto: quick for traces of up to about 200,000 events (32 MB "
         "of JSON Lines, 4 MB of Parquet), production above.")]


@app.command("analyze")
def trace_analyze(
    traces: Annotated[pathlib.Path, typer.Argument(
        help="Directory of trace files, or one trace file.")],
    out: AnalysisOutOption = None, engine: EngineOption = "auto",
    master: Annotated[str | None, typer.Option(
        help="Spark master (implies --engine spark; default local[2]).")] = None,
    jvm: JvmOption = "auto",
    json_out: Annotated[bool, typer.Option("--json", help="Print summary.json instead.")] =
        False,
    verbose: Annotated[bool, typer.Option(
        "--verbose", "-v", help="Print each stage with its time, and the Spark jobs.")] = False,
) -> None:
    """Check and measure traces (replay/): invariants, latency, throughput."""
    import time

    try:
        from replay import JVM_PROFILES, analyze, check_traces, engine_for, print_summary
    except ImportError:
        raise fail("trace analyze needs pyarrow and matplotlib: pip install "
                   "'rdvpump[replay]'") from None
    if jvm != "auto" and jvm not in JVM_PROFILES:
        raise fail(f"--jvm must be auto, {' or '.join(JVM_PROFILES)}, got {jvm!r}")
    guard(lambda: check_traces(str(traces)))  # what is no trace is said before a JVM starts
    engine = _engine(engine, master, traces, engine_for)
    target = _analysis_dir(traces, out)
    began = time.perf_counter()
    where = "in this process" if engine == "local" else f"on Spark ({master or 'local[2]'})"

    def stage(what: str) -> None:
        status.update(f"analysing {traces} {where}: {what} ...")
        if verbose:
            err.print(f"{time.perf_counter() - began:6.2f} s  {what}")

    with err.status(f"analysing {traces} {where} ...") as status, \
            _stopped_by_ctrl_c() as on_interrupt:
        if engine == "local":
            from replay.local import leave_pandas_out

            leave_pandas_out()
            summary = guard(lambda: analyze(str(traces), str(target), progress=stage))
        else:
            summary = _on_spark(traces, target, master or "local[2]", jvm, verbose, stage,
                                on_interrupt)
    if verbose:
        err.print(f"{time.perf_counter() - began:6.2f} s  done"
                  + (f": {summary['spark_jobs']} Spark jobs" if engine == "spark" else ""))
    if json_out:
        print(json.dumps(summary, default=str))
    else:
        print_summary(summary)
        err.print(f"tables, summary.json and plots in {target}/")
    if summary["violation_count"]:
        raise typer.Exit(1)


def _on_spark(traces: pathlib.Path, target: pathlib.Path, master: str, jvm: str,
              verbose: bool, stage: Callable[[str], None],
              on_interrupt: Callable[[Any], None]) -> dict[str, Any]:
    """The analysis on a SparkSession started here (its JVM's output to
    ``target/spark.log`` unless ``verbose``), stopped after."""
    from replay import SparkStartError, analyze, ending, jvm_for, start_spark
    from replay.jvm import failure, from_spark

    profile = guard(lambda: jvm_for(str(traces))) if jvm == "auto" else jvm
    stage(f"starting Spark ({master}, {profile} JVM)")
    log = target / "spark.log"
    where = "above" if verbose else f"in {log}"

    def printed() -> str:
        """What the JVM and Spark printed, where this process can read it."""
        if verbose:
            return ""
        try:
            return log.read_text(errors="replace")
        except OSError:
            return ""

    def start() -> Any:
        try:
            return start_spark(master, jvm=profile, log4j="" if verbose else None)
        except SparkStartError as exc:
            raise fail(f"{failure(exc, printed())} (all it printed is {where})") from None

    with contextlib.nullcontext() if verbose else _jvm_output_to(log):
        spark = guard(start)
    on_interrupt(spark)
    with ending(spark, progress=stage):
        try:
            summary: dict[str, Any] = guard(lambda: analyze(str(traces), str(target),
                                                            spark=spark, progress=stage))
        except Exception as exc:
            if not from_spark(exc):
                raise
            raise fail(f"the analysis failed on Spark: {failure(exc, printed())} (all Spark "
                       f"printed is {where})") from None
    return summary


def _engine(engine: str, master: str | None, traces: pathlib.Path,
            engine_for: Callable[[str], str]) -> str:
    """The engine asked for, or chosen by the traces' size: local or spark, and Spark's
    needs (pyspark, Java) checked, saying why Spark, and the other way, when chosen."""
    if engine not in ("auto", "local", "spark"):
        raise fail(f"--engine must be auto, local or spark, got {engine!r}")
    if engine == "local" and master is not None:
        raise fail("--master runs the analysis on Spark: it cannot go with --engine local")
    by_size = engine == "auto" and master is None
    if engine == "auto":
        engine = "spark" if master is not None else guard(lambda: engine_for(str(traces)))
    if engine == "spark":
        # chosen by size, Spark may not be what the user asked for: say why, and the other way
        why, instead = (("traces this large (over about 400,000 events: 64 MB of JSON Lines, "
                         "8 MB of Parquet) are analysed on Spark",
                         "; or --engine local, with every row in this process's memory")
                        if by_size else ("trace analyze --engine spark runs Spark", ""))
        try:
            import pyspark  # noqa: F401
        except ImportError:
            raise fail(f"{why}: pip install 'rdvpump[spark]'{instead}") from None
        if shutil.which("java") is None:
            raise fail(f"{why}, which needs Java 17 or 21 on PATH (for example: apt-get "
                       f"install openjdk-17-jre-headless){instead}")
    return engine


def _analysis_dir(traces: pathlib.Path, out: pathlib.Path | None) -> pathlib.Path:
    """Where the analysis goes (made): ``--out``, else TRACES/analysis, or
    FILE.analysis beside one file."""
    if out is not None:
        target = out
    elif traces.is_file():
        target = traces.with_name(traces.name.split(".")[0] + "." + ".".join(
            traces.name.split(".")[1:-1] + ["analysis"]))
    else:
        target = traces / "analysis"
    if target.exists() and not target.is_dir():
        raise fail(f"--out {target} is a file, not a directory")
    guard(lambda: target.mkdir(parents=True, exist_ok=True))
    return target


@contextlib.contextmanager
def _stopped_by_ctrl_c() -> Iterator[Callable[[Any], None]]:
    """Ctrl-C ends the command with one line and exit status 130 (stopping the session on
    the way out cancels Spark's jobs), whatever Spark or py4j raise meanwhile.  Yields a
    function to call with the session once it exists (pyspark installs its own SIGINT
    handler when it starts)."""
    interrupted = False
    previous = signal.getsignal(signal.SIGINT)

    def on_sigint(signum: int, frame: Any) -> None:
        # no call into the JVM here: the main thread may be inside one on the same
        # connection; stopping the session on the way out cancels the jobs
        nonlocal interrupted
        interrupted = True
        logging.disable(logging.CRITICAL)  # py4j logs the call it was in, with a traceback
        raise KeyboardInterrupt

    def started(session: Any) -> None:
        signal.signal(signal.SIGINT, on_sigint)

    signal.signal(signal.SIGINT, on_sigint)
    try:
        yield started
        if interrupted:  # a library swallowed the KeyboardInterrupt: the user still asked
            raise KeyboardInterrupt
    except BaseException as exc:
        if interrupted or isinstance(exc, KeyboardInterrupt):  # ours, or pyspark's handler
            err.print("interrupted", highlight=False)
            raise typer.Exit(130) from None
        raise
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def _jvm_output_to(log: pathlib.Path) -> Iterator[None]:
    """The JVM started inside writes its own stdout and stderr (the JVM's and Spark's
    start-up lines, then anything Spark prints) to ``log``; this process keeps the
    terminal."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    streams = sys.stdout, sys.stderr
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        sys.stdout = os.fdopen(os.dup(saved[0]), "w", buffering=1)
        sys.stderr = os.fdopen(os.dup(saved[1]), "w", buffering=1)
        yield
    finally:
        sys.stdout.close()
        sys.stderr.close()
        sys.stdout, sys.stderr = streams
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in (fd, *saved):
            os.close(f)


@app.command("diagram")
def trace_diagram(
    file: Annotated[pathlib.Path, typer.Argument(help="One trace file (.jsonl or .parquet).")],
    link: Annotated[str | None, typer.Option(help="Link id, e.g. server/1.")] = None,
    connects_of: Annotated[str | None, typer.Option(
        "--connects-of", help="Instead: every connect attempt of this broker.")] = None,
    output: Annotated[pathlib.Path | None, typer.Option(
        "--out", help="Write here instead of stdout.")] = None,
    most: Annotated[int, typer.Option(
        help="Events drawn per kind (send, deliver, write, read) and direction; the rest "
             "is one note.")] = 3,
    every: Annotated[bool, typer.Option("--all", help="Draw every event.")] = False,
) -> None:
    """A Mermaid sequence diagram of one link's life, from a real trace."""
    from replay.diagram import connect_diagram, link_diagram, read_events

    if (link is None) == (connects_of is None):
        raise fail("give one of --link or --connects-of")
    if file.is_dir():
        found = sorted(p.name for p in file.iterdir() if p.suffix in (".jsonl", ".parquet"))
        raise fail(f"{file} is a directory: trace diagram reads one trace file"
                   + (f", for example {file / found[0]}" if found else ""))
    events = guard(lambda: read_events(file))
    if most < 0:
        raise fail(f"--most must be 0 or more, got {most}")
    text = guard(lambda: link_diagram(events, link, None if every else most)
                 if link is not None
                  else connect_diagram(events, connects_of or ""))
    if output is None:
        print(text, end="")
    else:
        guard(lambda: output.write_text(text), arg="--out")
        err.print(f"wrote {output}")
