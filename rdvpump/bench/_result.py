"""One throughput (or round-trip) figure against one baseline, as a JSON line."""

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
