"""What the benchmark commands share: the smoke size, the sizes option, the tables."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from rich.table import Table
from rich.text import Text

from pump import ConfigError

from ._common import err, fail, show_table

#: The environment variable of a smoke run (a test runs every bench command of the guides as
#: printed, at a small size, this way).
SMOKE_ENV = "RDVPUMP_BENCH_SCALE"


def smoke_fraction() -> float:
    """The fraction of a smoke run (1.0: a real run), said on stderr when it is one."""
    text = os.environ.get(SMOKE_ENV, "").strip()
    if not text:
        return 1.0
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= 1:
        raise fail(f"{SMOKE_ENV} must be a number within (0, 1], got {text!r}")
    err.print(f"{SMOKE_ENV}={value:g}: a smoke run at that fraction of the work, once; its "
              f"figures are not comparable", highlight=False)
    return value


def show_times(title: str, results: list[Any]) -> None:
    """Failover times (``FailoverResult``s) as a table: p50, p99 and max of each case."""
    table = Table(title=title)
    for col in ("case", "trials", "p50 s", "p99 s", "max s"):
        table.add_column(col, justify="left" if col == "case" else "right")
    for r in results:
        d = r.to_dict()
        table.add_row(r.case, str(d["trials"]), f"{d['p50_s']:.3f}", f"{d['p99_s']:.3f}",
                      f"{d['max_s']:.3f}")
    show_table(table)


#: The fewest messages of a smoke run of ``bench cluster``.
BATCH_MIN = 100


def parse_sizes(sizes: str, scale: float, repeat: int) -> list[int]:
    try:
        values = [int(s) for s in sizes.split(",") if s.strip()]
    except ValueError:
        raise ConfigError(f"--sizes must be integers separated by commas, got {sizes!r}") from None
    if not values or min(values) < 0 or scale <= 0 or repeat < 1:
        raise ConfigError("--sizes must be non-negative, --scale positive, --repeat >= 1")
    return values


def show(results: list[Any], json_out: bool, title: str, columns: tuple[str, ...],
          row: Callable[[Any], list[str]], console: Any = None) -> None:
    """JSON lines on stdout, or one rich table (``case`` and ``baseline`` left-aligned,
    folded onto more lines where the terminal is narrow; the figures are never cut)."""
    if json_out:
        for r in results:
            print(json.dumps(r.to_dict()))
        return
    rows = [row(r) for r in results]
    table = Table(title=title)
    for i, col in enumerate(columns):
        named = col in ("case", "baseline")
        # a figure's column is never narrower than its widest figure (its title may wrap)
        widest = max([1, *(Text.from_markup(cells[i]).cell_len for cells in rows)])
        table.add_column(col, justify="left" if named else "right", overflow="fold",
                         min_width=8 if named else widest)
    for cells in rows:
        table.add_row(*cells)
    show_table(table, console)
