"""The console's health column: ``ok``, or each thing wrong with a broker, from its
registration and its metrics page's last scrape."""

from __future__ import annotations

from typing import Any

from rdvpump.console import _broker_row


def registered(since_heartbeat: float, metrics: str | None = "127.0.0.1:9100",
               heartbeat: float | None = 1.0) -> dict[str, Any]:
    row = {"id": "s1", "address": ["127.0.0.1", 5000], "age": 60.0,
           "since_heartbeat": since_heartbeat, "metrics": metrics}
    return row if heartbeat is None else {**row, "heartbeat": heartbeat}


def test_a_broker_is_ok_until_something_is_wrong_and_then_says_what() -> None:
    page = "127.0.0.1:9100"
    answered: dict[str, Any] = {page: {}}
    assert _broker_row(registered(0.5), answered, {})["health"] == "ok"
    assert _broker_row(registered(0.5, None), {}, {})["health"] == "ok"  # no page to ask
    assert _broker_row(registered(7), answered, {})["health"] == "heartbeat 7 s ago"
    assert _broker_row(registered(0.5), {page: None}, {})["health"] == (
        "metrics page not answering")
    assert _broker_row(registered(0.5), answered, {page: ["orders", "audit"]})["health"] == (
        "topic in error: audit, orders")


def test_late_is_measured_by_each_broker_s_own_heartbeat_interval() -> None:
    """A broker beating every 30 s (``broker run``'s default) is not late 22 s after its
    last beat; it is once it missed one (more than two intervals); a registration that
    states no interval is held to the default's."""
    page = "127.0.0.1:9100"
    answered: dict[str, Any] = {page: {}}
    for since, heartbeat, late in ((22, 30.0, False), (59, 30.0, False), (61, 30.0, True),
                                   (1.9, 1.0, False), (2.1, 1.0, True),
                                   (22, None, False), (61, None, True)):
        row = _broker_row(registered(since, heartbeat=heartbeat), answered, {})
        assert row["late"] is late, (since, heartbeat)
        assert row["health"] == (f"heartbeat {since:.0f} s ago" if late else "ok")
