"""What every command module of the CLI shares: consoles, options, and the error guard.

Library errors are caught here only, and become one red line on stderr and exit 1.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import pathlib
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Annotated, Any, TypeVar, cast

import typer

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

#: ``brokermgr.DEFAULT_MANAGER_PORT``, for the options' defaults and help: written here so
#: that ``--help`` does not import the brokers (a test holds the two equal).
MANAGER_PORT = 9876
TokenOption = Annotated[str, typer.Option(
    envvar="RDVPUMP_TOKEN", help="The universe's token (or $RDVPUMP_TOKEN).")]
IdentityOption = Annotated[str, typer.Option(
    "--identity", envvar="RDVPUMP_IDENTITY", metavar="NAME:SECRET",
    help="Speak as this identity (or $RDVPUMP_IDENTITY): its rights, not the token's, "
         "where the other side has an identities file.")]
IdentitiesOption = Annotated[pathlib.Path | None, typer.Option(
    "--identities", envvar="RDVPUMP_IDENTITIES",
    help="Identities file (TOML): whom links from other processes may speak as, and what "
         "each may do (or $RDVPUMP_IDENTITIES). Default: the token may do everything.")]
UniverseOption = Annotated[str, typer.Option(help="Universe name.")]
TraceOption = Annotated[pathlib.Path | None, typer.Option(
    "--trace", help="Record this run's trace here: one file per pump.")]
TraceFormatOption = Annotated[str, typer.Option(
    "--trace-format", help="Trace file format: jsonl or parquet.")]
RunOption = Annotated[str | None, typer.Option(
    "--run", help="Run id written in every trace row (default: derived from the universe).")]
MetricsOption = Annotated[str | None, typer.Option(
    "--metrics", metavar="HOST:PORT", help="Serve this process's Prometheus metrics at "
    "http://HOST:PORT/metrics (port 0: one the kernel picks; stderr says which). Off by "
    "default.")]
CertOption = Annotated[pathlib.Path | None, typer.Option(
    "--tls-cert", help="PEM certificate: links and manager connections use TLS.")]
KeyOption = Annotated[pathlib.Path | None, typer.Option("--tls-key", help="PEM private key.")]
CAOption = Annotated[pathlib.Path | None, typer.Option(
    "--tls-ca", help="PEM CA that peers' certificates must chain to (mutual TLS).")]


def tls_files(cert: pathlib.Path | None, key: pathlib.Path | None,
         ca: pathlib.Path | None) -> tuple[str, str, str | None] | None:
    if cert is None and key is None and ca is None:
        return None
    if cert is None or key is None:
        from pump import ConfigError

        raise ConfigError("TLS needs both --tls-cert and --tls-key")
    for path in (cert, key, ca):
        if path is not None and not path.is_file():
            from pump import ConfigError

            raise ConfigError(f"no such file: {path}")
    return str(cert), str(key), None if ca is None else str(ca)


class _FirstUse:
    """A rich ``Console`` made when first used: a command that prints nothing through it
    (``broker run``, ``manager serve``) starts without importing rich."""

    def __init__(self, **options: Any) -> None:
        self._options = options
        self._console: Console | None = None

    def _made(self) -> Console:
        if self._console is None:
            from rich.console import Console

            self._console = Console(**self._options)
        return self._console

    def __getattr__(self, name: str) -> Any:
        return getattr(self._made(), name)

    # ``with console:`` (rich's Live and Progress do it) looks these up on the type
    def __enter__(self) -> Console:
        return self._made().__enter__()

    def __exit__(self, *exc: Any) -> None:
        self._made().__exit__(*exc)


# no emoji codes: rich would print "127.0.0.1:100: refused" as "127.0.0.1💯 refused"
out = cast("Console", _FirstUse(emoji=False))
err = cast("Console", _FirstUse(stderr=True, soft_wrap=True, emoji=False))
T = TypeVar("T")

#: What the CLI says in one line: rdvpump's own errors (a bad setting is a
#: ``ConfigError``, a failed run a ``RunError``), the system's, and a link trio saw
#: break.  Anything else is a bug and keeps its traceback.
def _expected() -> tuple[type[BaseException], ...]:
    # imported when an error is to be judged, not when the CLI starts: ``--help`` and
    # the commands that need neither do without trio and the pump
    import trio

    from pump import RdvpumpError

    return (RdvpumpError, OSError, trio.BrokenResourceError, trio.ClosedResourceError,
            trio.TooSlowError)


#: What a deadline that passed says (trio's ``TooSlowError`` says nothing itself).
TOO_SLOW = "gave up: a step did not finish within its deadline (nothing answered)"


def _said(exc: BaseException, arg: str | None) -> str:
    """The one line an expected error prints."""
    if isinstance(exc, OSError):
        return os_message(exc, arg)
    return str(exc) or (TOO_SLOW if type(exc).__name__ == "TooSlowError"
                        else type(exc).__name__)


#: How an OS error on a path reads, by errno, after the path (and the option naming it).
_OS_PHRASES = {
    errno.EISDIR: "is a directory, not a file",
    errno.EEXIST: "is in the way: a file where a directory is needed",
    errno.ENOTDIR: "is under a file, not a directory",
    errno.ENOENT: "does not exist",
    errno.EACCES: "cannot be used: permission denied",
    errno.EPERM: "cannot be used: operation not permitted",
    errno.ENOSPC: "cannot be written: no space left on the device",
    errno.EROFS: "cannot be written: read-only file system",
}


def os_message(exc: OSError, arg: str | None = None) -> str:
    """An OS error on a path in words, naming the option (``arg``) that gave the path:
    ``--out /tmp is a directory, not a file`` rather than ``[Errno 21] Is a directory``."""
    phrase = _OS_PHRASES.get(exc.errno or 0)
    if exc.filename is None or phrase is None:
        return str(exc)
    return " ".join(filter(None, (arg, str(exc.filename), phrase)))


def guard(fn: Callable[[], T], arg: str | None = None) -> T:
    """Run library code; turn its errors into one red line and exit status 1.  ``arg``
    names the option or argument whose path an OS error is about."""
    try:
        return fn()
    except OSError as exc:
        raise fail(os_message(exc, arg)) from None
    except BaseExceptionGroup as group:  # errors raised inside trio nurseries
        from .._errors import first_leaf

        leaf = first_leaf(group)
        if not isinstance(leaf, _expected()):
            raise
        raise fail(_said(leaf, arg)) from None
    except Exception as exc:
        if not isinstance(exc, _expected()):
            raise
        raise fail(_said(exc, arg)) from None


#: The most open files a serving process asks for (when its hard limit has none).
OPEN_FILES_WANTED = 1 << 20


def as_a_server() -> None:
    """What a process that serves (``broker run``, ``manager serve``) sets for itself: its
    soft limit on open files raised to its hard limit (a server keeps a file open for each
    topic and a socket for each link: Linux's usual soft limit, 1,024, is some thousand
    topics), and the C library's allocator keeping what large frames
    free (:func:`channels.keep_freed_memory`)."""
    import resource

    from channels import keep_freed_memory

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = OPEN_FILES_WANTED if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < wanted:
        with contextlib.suppress(ValueError, OSError):  # as it was, where it may not
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    keep_freed_memory()


def check_trace_dir(trace: pathlib.Path | None) -> None:
    """``--trace`` names a directory, made here if missing: a file there, or a directory
    that cannot be made, is one clear error before anything starts (before the processes
    of ``universe up``, which write in it)."""
    if trace is None:
        return
    if trace.exists() and not trace.is_dir():
        raise fail(f"--trace {trace} is a file: give a directory (a trace file per pump is "
                   "written in it)")
    guard(lambda: trace.mkdir(parents=True, exist_ok=True), arg="--trace")


def recorder(trace: pathlib.Path | None, fmt: str, *, pump: str, run: str) -> Any:
    if trace is None:
        return None
    check_trace_dir(trace)
    from pump import open_trace

    return guard(lambda: open_trace(trace, pump=pump, run=run, format=fmt), arg="--trace")


def check_format(fmt: str, option: str = "--trace-format", others: tuple[str, ...] = ()
                 ) -> None:
    """A ConfigError naming ``option`` unless ``fmt`` is a trace format (or one of
    ``others``, which the caller handles)."""
    from pump import FORMATS, ConfigError

    if fmt not in FORMATS and fmt not in others:
        raise ConfigError(f"{option} must be one of {', '.join((*FORMATS, *others))}, "
                          f"got {fmt!r}")


def run_trio(fn: Callable[[], Awaitable[T]]) -> T:
    """``trio.run(fn)`` for a command that stops on Ctrl-C: the KeyboardInterrupt comes at
    the main task's next checkpoint, never inside a finalizer or an import's lock
    callback, where Python would print it as "Exception ignored" and go on."""
    import trio

    return trio.run(fn, restrict_keyboard_interrupt_to_checkpoints=True)


def interruptible(fn: Callable[[], T]) -> T:
    """:func:`guard`, and Ctrl-C (a KeyboardInterrupt, bare or inside trio's exception
    groups) ends the command with one line and exit status 130, the shell's convention."""
    try:
        return guard(fn)
    except BaseException as exc:
        if is_ctrl_c(exc):
            raise interrupted() from None
        raise


def is_ctrl_c(exc: BaseException) -> bool:
    """Whether ``exc`` is Ctrl-C's KeyboardInterrupt, bare or inside trio's groups."""
    from .._errors import first_leaf

    return isinstance(first_leaf(exc), KeyboardInterrupt)


def interrupted() -> typer.Exit:
    """Say "interrupted" (the last line a command stopped by Ctrl-C prints); raise the
    returned Exit (130, the shell's convention)."""
    err.print("interrupted", highlight=False)
    return typer.Exit(130)


@contextlib.contextmanager
def logs_above(console: Console, level: int = logging.ERROR) -> Iterator[None]:
    """While a live display (a progress bar) holds the terminal: log records at ``level``
    and above are printed through its console, above the display, instead of breaking
    into it; those below are left out (the caller says where to see them)."""
    root = logging.getLogger()

    class Above(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            from rich.markup import escape

            console.print(escape(self.format(record)), highlight=False, soft_wrap=True)

    above = Above(level)
    above.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    saved = root.handlers[:]
    root.handlers[:] = [above]
    try:
        yield
    finally:
        root.handlers[:] = saved


def show_table(table: Table, console: Console | None = None) -> None:
    """Print ``table`` with no word or figure of it broken: each column is kept as wide
    as its longest word (its header's too), and where those do not fit the terminal
    the table is printed wider than it (the terminal wraps the lines whole) rather than
    cut ``127.0.0.1:5672`` into ``127.0.`` and ``0.1:5672``."""
    from rich.measure import Measurement
    from rich.text import Text

    console = console or out
    for column in table.columns:
        words = [word for cell in (column.header, *column.cells) if isinstance(cell, str | Text)
                 for word in (Text.from_markup(cell) if isinstance(cell, str) else cell
                              ).plain.split()]
        longest = max((len(word) for word in words), default=0)
        column.min_width = max(column.min_width or 0, longest)
    need = Measurement.get(console, console.options.update(width=1 << 16), table).minimum
    console.print(table, width=need if need > console.width else None, crop=False)


def positive(value: float) -> float:
    """An option's callback: seconds to wait must be more than none (a usage error)."""
    if not value > 0:
        raise typer.BadParameter(f"{value:g} is not a number of seconds above 0")
    return value


def fail(message: str) -> typer.Exit:
    """One red line on stderr; raise the returned Exit."""
    from rich.markup import escape

    err.print(f"[red]error:[/red] {escape(message)}", highlight=False)
    return typer.Exit(1)


def slave_lags(members: list[tuple[Any, int | None]]) -> list[int | None]:
    """For each ``(group, held)`` row (a member's group as JSON, the records it said it
    holds): how many records a group's slave is behind its master; None for a master, a
    server in no group, or when either count is not known."""
    masters = {g["name"]: held for g, held in members
               if g and held is not None and g["role"] == "master"}
    return [max(0, masters[g["name"]] - held)
            if g and held is not None and g["role"] == "slave" and g["name"] in masters
            else None for g, held in members]


def group_cell(group: Any, lag: int | None = None, insync: bool = False) -> str:
    """A replicated group's member in a table: ``name/id role@epoch``, ``lag N`` (the
    records it is behind its master) when known, and ``in sync`` for a slave its master
    reports in sync (one a failover may promote); "" for none."""
    if not group:
        return ""
    cell = f"{group['name']}/{group['id']} {group['role']}@{group['epoch']}"
    cell = cell if lag is None else f"{cell} lag {lag}"
    return f"{cell}, in sync" if insync else cell
