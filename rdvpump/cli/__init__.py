"""The ``rdvpump`` command: one typer app, one module per command group.

Library errors are turned into one red line and exit 1 in :mod:`._common`; the
library itself never prints.  A command imports its own module only (``rdvpump broker
run`` never imports the benchmarks or Spark's helpers): each process a universe starts
pays for what it runs, and ``rdvpump --help`` imports them all.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, MutableMapping
from typing import Annotated, Any, NoReturn

import typer
from typer.core import TyperCommand, TyperGroup

from ._help import tidy_help

tidy_help()

#: The top-level commands, in the order of the help: (name, module, a function of the
#: module for a command or None for the module's ``app``, a group).
COMMANDS = (("demo", "demo", "demo"), ("routes", "routes", "routes"),
            ("status", "status", "status"), ("console", "console", "console"),
            ("bench", "bench", None),
            ("diagram", "diagram", None), ("trace", "trace", None),
            ("manager", "manager", None), ("broker", "broker", None), ("mq", "mq", None),
            ("identity", "identity", None), ("universe", "universe", None))
#: Each command's line in ``rdvpump --help``, so that the help imports no command module
#: (each would import trio and the brokers); a test holds them equal to the commands'.
SHORT_HELP = {
    "demo": "Run an in-process echo universe end to end and print what happened.",
    "routes": "The live route table built from trackers: servers, topics, versions and "
              "votes.",
    "status": "The brokers a manager knows, with their age and last heartbeat (and a "
              "replicated group's member's role, a cluster's server's root and epoch, and "
              "where a process serves its metrics).",
    "console": "A live web page of a running universe: its brokers, links and their "
               "rates, MQ groups' lag, trackers and recent warnings, read from the name "
               "service and the processes' --metrics pages once a second; read-only "
               "unless started with --admin.",
    "bench": "Benchmarks against the libraries users would pick instead.",
    "diagram": "Diagrams generated from the code.",
    "trace": "Analyse and draw pump traces.",
    "manager": "The universe's BrokerManager as a name service.",
    "broker": "Brokers in a process of their own.",
    "mq": "Topics, publishing and consuming on an MQ server (broker run --role server "
          "--mq-dir DIR).",
    "identity": "Identities: who may link, and what each may do (broker run and manager "
                "run --identities FILE).",
    "universe": "Universes from TOML files: echo, stream, fanout and mq workloads, "
                "simulated with faults or run for real.",
}


def _load(name: str, module: str, function: str | None) -> Any:
    """The click command of a module's ``app`` (a group), or of one of its functions."""
    loaded = importlib.import_module(f"{__name__}.{module}")
    if function is None:
        command: Any = typer.main.get_group(loaded.app)
    else:
        one = typer.Typer(rich_markup_mode=None, add_completion=False)
        one.command(name)(getattr(loaded, function))
        command = typer.main.get_command(one)
    command.name = name
    return command


class _Commands(MutableMapping[str, Any]):
    """A group's click commands by name, each loaded when first looked up."""

    def __init__(self, loaders: dict[str, Callable[[], Any]]) -> None:
        self.loaders = loaders
        self.loaded: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name not in self.loaded:
            self.loaded[name] = self.loaders[name]()
        return self.loaded[name]

    def __setitem__(self, name: str, command: Any) -> None:
        self.loaders[name] = lambda: command
        self.loaded[name] = command

    def __delitem__(self, name: str) -> None:
        del self.loaders[name]
        self.loaded.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        return iter(self.loaders)

    def __len__(self) -> int:
        return len(self.loaders)


#: click's ``UsageError`` (a bad option, value or command): the base of
#: ``typer.BadParameter``, which typer exports (typer 0.28 carries its own copy of click).
_UsageError: type[Exception] = typer.BadParameter.__bases__[0]


@contextlib.contextmanager
def _one_line_usage() -> Iterator[None]:
    """A usage error said in one line on stderr, with where to read the options, and the
    exit status click gives it (2); click would print the usage, a hint and the error on
    four.  A group called without a command still shows its help."""
    try:
        yield
    except _UsageError as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":
            raise
        ctx = getattr(exc, "ctx", None)
        where = ctx.command_path if ctx is not None else "rdvpump"
        message = " ".join(exc.format_message().split()).rstrip(".")  # type: ignore[attr-defined]
        print(f"error: {where}: {message} (see '{where} -h')", file=sys.stderr)
        raise typer.Exit(getattr(exc, "exit_code", 2)) from None


class _Lazy(TyperGroup):
    """The top-level group, its commands loaded as they are used; its help lists them
    from :data:`SHORT_HELP` without loading any.  A usage error anywhere under it is one
    line (:func:`_one_line_usage`)."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        self.commands = _Commands({name: functools.partial(_load, name, module, function)
                                   for name, module, function in COMMANDS})

    def make_context(self, info_name: str | None, args: list[str],
                     parent: Any = None, **extra: Any) -> Any:
        with _one_line_usage():
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx: Any) -> Any:
        with _one_line_usage():
            return super().invoke(ctx)

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        # each line cut to the terminal as click cuts a command's own help; through typer's
        # own command class, never ``import click``: typer 0.28 carries its own copy of
        # click and installs none, so click is not there in a plain install
        width = formatter.width - 6 - max(len(name) for name, _, _ in COMMANDS)
        rows = [(name, TyperCommand(name, help=SHORT_HELP[name]).get_short_help_str(width))
                for name, _, _ in COMMANDS]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


app = typer.Typer(rich_markup_mode=None, cls=_Lazy,
                  help="rdvpump: an event-pump actor framework for broker-to-broker links.",
                  no_args_is_help=True, add_completion=False,
                  context_settings={"help_option_names": ["-h", "--help"]})


def _version() -> str:
    # imported here, not at the top: importlib.metadata (and the email package under it)
    # would be loaded by every process a universe starts, for a flag it never reads
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("rdvpump")
    except PackageNotFoundError:  # pragma: no cover - running from an uninstalled tree
        return "unknown"


def _show_version(value: bool) -> None:
    if value:
        print(f"rdvpump {_version()}")
        raise typer.Exit()


@app.callback()
def _root(version_: Annotated[bool, typer.Option(
        "--version", help="Show the version and exit.", callback=_show_version,
        is_eager=True)] = False) -> None:
    """rdvpump: brokers, rendezvous, ring-buffer channels and message queues on one pump."""


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    # A shell starts a script's background jobs (``cmd &``) with SIGINT ignored, and
    # Python then never raises KeyboardInterrupt: every command stops on SIGINT all the
    # same, as the serving ones (which catch it themselves) do.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        app()  # ends in SystemExit, its status as the command said
    except SystemExit as done:
        _leave(done.code)


def _leave(code: Any) -> NoReturn:
    """End the process once the command is done.  After a command that loaded pyarrow
    (the trace commands, and every process that writes a trace: its writers use pyarrow
    when it is there, and each closes its files before the command returns), without
    the interpreter's teardown: unloading pyarrow, pandas and matplotlib is a noticeable
    part of a small trace's analysis, and Arrow's native threads, torn down at exit, can
    abort a process whose work is done (``std::terminate``, exit -6).  What the teardown
    would still do for the user is done first: the ``atexit`` functions run, logging is
    shut down, the output is flushed.  A thread of the command still at work (not a
    daemon) gets the normal exit, which waits for it."""
    if "pyarrow" not in sys.modules or any(
            not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        raise SystemExit(code)
    # the command is done: a Ctrl-C now ends the process by the signal, as it does during
    # the interpreter's own teardown, not with a traceback from the exit functions
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    if code is None or isinstance(code, int):
        status = code or 0
    else:  # as Python does with ``sys.exit(message)``
        print(code, file=sys.stderr)
        status = 1
    atexit._run_exitfuncs()  # reach-in: no public call runs them; os._exit would skip them
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a reader gone, a stream closed
            stream.flush()
    os._exit(status)  # reach-in: the documented exit without the interpreter's teardown


__all__ = ["app", "main"]
