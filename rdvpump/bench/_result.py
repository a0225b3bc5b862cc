"""One throughput (or round-trip) figure against one baseline, as a JSON line; how many
messages a case moves."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Result:
    case: str
    size: int
    msgs_per_s: float
    mb_per_s: float
    baseline: str
    baseline_msgs_per_s: float
    ratio: float
    median_us: float | None = None
    p99_us: float | None = None
    baseline_median_us: float | None = None
    baseline_p99_us: float | None = None
    #: Where the processes ran (``split`` or ``same``); None in one process.
    placement: str | None = None

    def to_dict(self) -> dict[str, object]:
        d: dict[str, object] = {
            "case": self.case, "size": self.size, "msgs_per_s": round(self.msgs_per_s, 1),
            "mb_per_s": round(self.mb_per_s, 1), "baseline": self.baseline,
            "baseline_msgs_per_s": round(self.baseline_msgs_per_s, 1),
            "ratio": round(self.ratio, 3)}
        if self.placement is not None:
            d["placement"] = self.placement
        for key in ("median_us", "p99_us", "baseline_median_us", "baseline_p99_us"):
            value = getattr(self, key)
            if value is not None:
                d[key] = round(value, 1)
        return d


def messages_for(size: int, counts: dict[int, int], nbytes: int, scale: float) -> int:
    """How many messages of ``size`` bytes a case moves: ``counts[size]`` for a size it
    names, else about ``nbytes`` worth but never more than the most it names for any size
    (empty or one-byte messages would otherwise be hundreds of millions); times
    ``scale``, and at least 1,000."""
    count = counts.get(size)
    if count is None:
        count = min(max(counts.values()), nbytes // max(size, 1))
    return max(1000, int(count * scale))
