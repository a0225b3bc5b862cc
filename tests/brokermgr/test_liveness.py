"""The liveness table on a clock the test drives: registration, heartbeats, expiry, drops."""

from __future__ import annotations

import pytest

from brokermgr import LivenessTable

A = ("127.0.0.1", 1000)
B = ("127.0.0.1", 2000)


def test_heartbeats_keep_a_broker_and_silence_expires_it() -> None:
    table = LivenessTable(expiry=120)
    table.register("b1", A, now=0)
    for t in range(30, 300, 30):  # heartbeats every 30 s
        table.register("b1", A, now=t)
        assert table.scan(now=t + 10) == []
    assert table.scan(now=270 + 120) == []  # exactly at the expiry: still there
    assert table.scan(now=270 + 120.001) == ["b1"]
    assert table.lookup("b1") is None


def test_a_dropped_connection_removes_its_brokers_at_once() -> None:
    table = LivenessTable(expiry=120)
    conn1, conn2 = object(), object()
    table.register("b1", A, now=0, connection=conn1)
    table.register("b2", B, now=0, connection=conn1)
    table.register("b3", B, now=0, connection=conn2)
    assert sorted(table.connection_lost(conn1)) == ["b1", "b2"]
    assert [r.broker_id for r in table.records()] == ["b3"]


def test_registration_refreshes_and_a_move_re_registers() -> None:
    table = LivenessTable(expiry=120)
    conn = object()
    first = table.register("b1", A, now=0, version=1, topics=("t",), connection=conn)
    again = table.register("b1", A, now=5, version=2, connection=conn)
    assert again is first and first.last_heartbeat == 5 and first.registered_at == 0
    moved = table.register("b1", B, now=7, version=3, connection=object())
    assert moved.address == B and moved.registered_at == 7
    assert table.connection_lost(conn) == []  # the old connection no longer owns it


def test_a_stale_version_changes_nothing() -> None:
    table = LivenessTable(expiry=120)
    table.register("b1", A, now=0, version=5)
    table.register("b1", B, now=1, version=4)
    assert table.lookup("b1") == A


def test_unregister_and_bad_expiry() -> None:
    table = LivenessTable(expiry=120)
    table.register("b1", A, now=0)
    assert table.unregister("b1") and not table.unregister("b1")
    with pytest.raises(ValueError):
        LivenessTable(expiry=0)


def test_records_report_age_and_heartbeat() -> None:
    table = LivenessTable(expiry=120)
    table.register("b1", A, now=10, version=3, topics=("orders",))
    table.register("b1", A, now=40, version=3, topics=("orders",))
    (rec,) = table.records()
    assert rec.to_dict(now=45) == {"id": "b1", "address": ["127.0.0.1", 1000], "version": 3,
                                   "topics": ["orders"], "age": 35, "since_heartbeat": 5}
