"""The console's health column: ``ok``, or each thing wrong with a broker, from its
registration and its metrics page's last scrape."""

from __future__ import annotations

from typing import Any

from rdvpump.console import HEARTBEAT_LATE, _broker_row


def registered(since_heartbeat: float, metrics: str | None = "127.0.0.1:9100"
               ) -> dict[str, Any]:
    return {"id": "s1", "address": ["127.0.0.1", 5000], "age": 60.0,
            "since_heartbeat": since_heartbeat, "metrics": metrics}


def test_a_broker_is_ok_until_something_is_wrong_and_then_says_what() -> None:
    page = "127.0.0.1:9100"
    answered: dict[str, Any] = {page: {}}
    assert _broker_row(registered(0.5), answered, {})["health"] == "ok"
    assert _broker_row(registered(0.5, None), {}, {})["health"] == "ok"  # no page to ask
    assert _broker_row(registered(HEARTBEAT_LATE + 2), answered, {})["health"] == (
        "heartbeat 7 s ago")
    assert _broker_row(registered(0.5), {page: None}, {})["health"] == (
        "metrics page not answering")
    assert _broker_row(registered(0.5), answered, {page: ["orders", "audit"]})["health"] == (
        "topic in error: audit, orders")
