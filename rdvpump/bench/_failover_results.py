"""What ``rdvpump bench failover`` reports (and ``bench partition`` with it): the times of
failovers, what a routed consumer got again after each, and throughputs against a
baseline; the sizes both of its systems are measured with."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

#: Bytes a message.
SIZE = 1024
#: Seconds any wait of the benchmark may take.
DEADLINE = 60.0
#: The batched figures publish this many times the awaited figures' messages.
BATCHED = 5


@dataclass
class FailoverResult:
    case: str
    trials: int
    seconds: list[float] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        s = sorted(self.seconds)
        return {"case": self.case, "trials": len(s),
                "p50_s": round(statistics.median(s), 4) if s else None,
                "p99_s": round(s[min(len(s) - 1, round(0.99 * (len(s) - 1)))], 4) if s
                else None,
                "max_s": round(s[-1], 4) if s else None,
                "seconds": [round(x, 4) for x in self.seconds]}  # in trial order


@dataclass
class RedeliveryResult:
    """What a routed consumer got again after each failover: the messages, and how long
    before the kill the oldest of them had first come."""

    case: str
    duplicates: list[int] = field(default_factory=list)
    span: list[float] = field(default_factory=list)
    deliveries: int = 0

    def to_dict(self) -> dict[str, Any]:
        d, s = sorted(self.duplicates), sorted(self.span)

        def p99(v: list[Any]) -> Any:
            return v[min(len(v) - 1, round(0.99 * (len(v) - 1)))] if v else None

        return {"case": self.case, "failovers": len(d),
                "duplicates_p50": statistics.median(d) if d else None,
                "duplicates_p99": p99(d), "duplicates_max": d[-1] if d else None,
                "first_delivered_before_kill_p50_s": round(statistics.median(s), 4) if s
                else None,
                "first_delivered_before_kill_max_s": round(s[-1], 4) if s else None,
                "deliveries": self.deliveries, "per_failover": self.duplicates,
                "first_delivered_before_kill_s": [round(x, 4) for x in self.span]}


@dataclass
class ThroughputResult:
    """Publishes per second of one system and way of publishing, against a baseline
    measured in the same run the same way."""

    case: str
    size: int
    msgs_per_s: float
    baseline: str
    baseline_msgs_per_s: float
    publish: str = "awaited"
    durability: str = "sync"

    def to_dict(self) -> dict[str, Any]:
        return {"case": self.case, "size": self.size, "publish": self.publish,
                "durability": self.durability, "msgs_per_s": round(self.msgs_per_s, 1),
                "baseline": self.baseline,
                "baseline_msgs_per_s": round(self.baseline_msgs_per_s, 1),
                "ratio": round(self.msgs_per_s / self.baseline_msgs_per_s, 3)}
