"""The replay job's plots, drawn with matplotlib's Agg canvas (no display, no pyplot state).

Each function takes what the job already computed (small: bins of the run, buckets of a
histogram) and writes one PNG.  Times are seconds from the start of the run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

#: Brokers drawn one by one in the throughput plot; the rest are summed as "others".
TOP_BROKERS = 8
#: Links drawn in the timeline (the first to be accepted).
TIMELINE_LINKS = 20


#: Inches of a figure's margins, as (left, right, bottom, top), before the room a plot
#: adds for its labels: the tick labels and axis titles of the default font fit.
MARGINS = (0.85, 0.25, 0.6, 0.45)
#: Inches per character of a label in the default font (10 pt DejaVu Sans, a little
#: more than its widest common letters), to make room for the labels beside the axes.
CHAR_INCHES = 0.085


def _figure(height: float = 4.5, *, left: float = 0.0, right: float = 0.0,
            top: float = 0.0) -> tuple[Any, Any]:
    """A figure 10 inches wide and its axes, inside fixed margins widened by ``left``,
    ``right`` and ``top`` inches: computed from the labels' lengths rather than by a
    layout engine, which draws every figure twice to measure it."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    width = 10.0
    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    m_left, m_right, m_bottom, m_top = MARGINS
    fig.subplots_adjust(left=(m_left + left) / width, right=1 - (m_right + right) / width,
                        bottom=m_bottom / height, top=1 - (m_top + top) / height)
    return fig, fig.add_subplot()


def _text_inches(labels: Sequence[str], size: float = 1.0) -> float:
    """About how wide the longest of ``labels`` is drawn, in inches."""
    return max((len(label) for label in labels), default=0) * CHAR_INCHES * size


#: Said of a run whose events all share one time (a simulated run where no virtual time
#: passed): rates per second and times along the run mean nothing there.
AT_ONE_INSTANT = "no time passed on the run's clock"


def _time_unit(duration: float) -> tuple[str, float]:
    """Seconds, or milliseconds for runs under two seconds."""
    return ("ms", 1e3) if duration < 2 else ("s", 1.0)


def throughput(path: Path, per_broker: Mapping[str, Mapping[int, int]], *, width: float,
               bins: int, duration: float, title: str) -> Any:
    """Messages delivered per second into each broker, over the run, in bins of ``width``;
    for a run of no duration (``duration`` 0), the messages delivered into each broker.
    Returns the figure, saved."""
    unit, scale = _time_unit(bins * width)
    totals = sorted(per_broker, key=lambda b: (-sum(per_broker[b].values()), b))
    # the legend sits right of the axes: room for its longest name (small font), its
    # line and its title
    names = [*totals[:TOP_BROKERS + 1], "receiving broker", f"{len(totals)} others"]
    fig, ax = _figure(right=0.0 if duration <= 0 else 0.55 + _text_inches(names, 0.85))
    if duration <= 0 and totals:
        counts = [sum(per_broker[b].values()) for b in totals]
        ax.bar(range(len(totals)), counts, color="#4c72b0")
        ax.set_xticks(range(len(totals)), totals)
        ax.set_xlabel("receiving broker")
        ax.set_ylabel("messages delivered")
        ax.set_title(f"Delivered messages per broker, {title}: all at one instant "
                     f"({AT_ONE_INSTANT})")
        ax.grid(alpha=0.3, axis="y")
        fig.savefig(path)
        return fig
    shown = totals if len(totals) <= TOP_BROKERS + 1 else totals[:TOP_BROKERS]
    series = {b: per_broker[b] for b in shown}
    rest = [b for b in totals if b not in series]
    if rest:
        others: dict[int, int] = {}
        for b in rest:
            for k, n in per_broker[b].items():
                others[k] = others.get(k, 0) + n
        series[f"{len(rest)} others"] = others
    xs = [i * width * scale for i in range(bins + 1)]
    for name, cells in series.items():
        ys = [cells.get(i, 0) / width for i in range(bins)] + [0.0]
        ax.step(xs, ys, where="post", label=name, linewidth=1.4)
    ax.set_xlim(0, bins * width * scale)
    ax.set_ylim(bottom=0)
    ax.set_xlabel(f"time since the start of the run ({unit})")
    ax.set_ylabel("messages delivered per second")
    ax.set_title(f"Delivered messages per broker, {title} (bins of {_seconds(width)})")
    if series:
        ax.legend(title="receiving broker", fontsize="small", loc="upper left",
                  bbox_to_anchor=(1.01, 1.0))
    else:
        ax.text(0.5, 0.5, "no message was delivered", ha="center", transform=ax.transAxes)
    ax.grid(alpha=0.3)
    fig.savefig(path)
    return fig


def latency(path: Path, buckets: Sequence[Mapping[str, Any]],
            quantiles: Mapping[str, float] | None, *, least: float, title: str) -> Any:
    """A histogram of delivery latency on a log axis, with p50, p90 and p99 marked, and
    the lowest bucket, starting at ``least`` seconds (where every smaller latency, zero
    included, is counted), labelled as such.  Returns the figure, saved."""
    fig, ax = _figure()
    lows = [b["low_s"] * 1e6 for b in buckets]
    highs = [b["high_s"] * 1e6 for b in buckets]
    counts = [b["messages"] for b in buckets]
    if buckets:
        ax.bar(lows, counts, width=[h - lo for lo, h in zip(lows, highs, strict=True)],
               align="edge", color="#4c72b0", edgecolor="white", linewidth=0.3)
        ax.set_xscale("log")
        ax.set_xlim(min(lows) / 1.5, max(highs) * 1.5)
        if buckets[0]["low_s"] <= least * 1.001:
            ax.annotate(f"{counts[0]:,} below {highs[0] * 1e3:.2f} ns (zero included)",
                        xy=(lows[0], counts[0]), xytext=(0, 4), textcoords="offset points",
                        ha="left", va="bottom", fontsize="small")
            ax.set_ylim(top=max(counts) * 1.12)
    else:
        ax.text(0.5, 0.5, "no message was delivered", ha="center", transform=ax.transAxes)
    marked = False
    for (name, color) in (("p50", "#2ca02c"), ("p90", "#ff7f0e"), ("p99", "#d62728")):
        if quantiles and quantiles.get(name) is not None and quantiles[name] > 0:
            value = quantiles[name] * 1e6
            ax.axvline(value, color=color, linestyle="--", linewidth=1.2,
                       label=f"{name} {_micros(value)}")
            marked = True
    ax.set_xlabel("latency, send to delivery (µs, log scale)")
    ax.set_ylabel("messages")
    ax.set_title(f"Delivery latency, {title}")
    if marked:
        ax.legend(loc="upper right")
    ax.grid(alpha=0.3, which="both")
    fig.savefig(path)
    return fig


def timeline(path: Path, links: Sequence[Mapping[str, Any]], *, width: float,
             duration: float, title: str) -> Any:
    """The life of the first links: connect (o), accepted (>), messages delivered (shaded
    by count per bin), ended (X).  Returns the figure, saved."""
    from matplotlib import colormaps, colors

    chosen = sorted(links, key=lambda x: (x["start"] is None, x["start"] or 0.0,
                                          x["link"]))[:TIMELINE_LINKS]
    height = max(2.5, 0.9 + 0.35 * len(chosen))
    fig, ax = _figure(height, left=_text_inches([x["link"] for x in chosen]), top=0.45)
    unit, scale = _time_unit(duration)
    top = max((n for x in chosen for n in x["bins"].values()), default=1)
    shade = colors.LogNorm(vmin=1, vmax=max(top, 2))
    cmap = colormaps["Blues"]
    for row, x in enumerate(chosen):
        start = x["start"] if x["start"] is not None else min(
            (k * width for k in x["bins"]), default=0.0)
        end = x["end"] if x["end"] is not None else duration
        ax.hlines(row, start * scale, end * scale, color="#999999", linewidth=1)
        cells = sorted(x["bins"].items())
        if cells:
            ax.broken_barh([(k * width * scale, width * scale) for k, _ in cells],
                           (row - 0.2, 0.4),
                           facecolors=[cmap(0.25 + 0.75 * shade(n)) for _, n in cells])
        if x.get("connect") is not None:
            ax.hlines(row, x["connect"] * scale, (x["start"] or x["connect"]) * scale,
                      color="#2ca02c", linewidth=2, zorder=2)
            ax.plot(x["connect"] * scale, row, marker="o", color="#2ca02c", markersize=6,
                    fillstyle="none", zorder=3)
        if x["start"] is not None:
            ax.plot(x["start"] * scale, row, marker=">", color="#2ca02c", markersize=9,
                    zorder=3)
        if x["end"] is not None:
            ax.plot(x["end"] * scale, row, marker="X", color="#d62728", markersize=9,
                    zorder=3)
    ax.set_yticks(range(len(chosen)), [x["link"] for x in chosen])
    ax.invert_yaxis()
    span = max(duration, width) * scale
    ax.set_xlim(-0.01 * span, 1.01 * span)  # room for the markers at both ends
    ax.set_xlabel(f"time since the start of the run ({unit})")
    more = f", first {len(chosen)} of {len(links)}" if len(links) > len(chosen) else ""
    instant = f"\nall at one instant: {AT_ONE_INSTANT}" if duration <= 0 else ""
    ax.set_title(f"Links over time, {title}{more}\nconnect (o), accepted (>), messages "
                 f"delivered (darker: more per {_seconds(width)}), ended (X){instant}",
                 fontsize="medium")
    if not chosen:
        ax.text(0.5, 0.5, "no link", ha="center", transform=ax.transAxes)
    ax.grid(alpha=0.3, axis="x")
    fig.savefig(path)
    return fig


def _seconds(width: float) -> str:
    if width >= 1:
        return f"{width:g} s"
    if width >= 1e-3:
        return f"{width * 1e3:g} ms"
    return f"{width * 1e6:g} µs"


def _micros(value: float) -> str:
    return f"{value / 1e3:,.2f} ms" if value >= 1e4 else f"{value:,.1f} µs"
