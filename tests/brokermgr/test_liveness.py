"""The liveness table on a clock the test drives: reports, versions, expiry, drops, pins."""

from __future__ import annotations

import pytest

from brokermgr import BrokerRecord, LivenessTable
from brokermgr._liveness import PINNED
from brokermgr._names import record_dict
from rdv import Address

A = Address("127.0.0.1", 1000)
B = Address("127.0.0.1", 2000)


def test_reports_keep_an_entry_and_silence_expires_it() -> None:
    table: LivenessTable[Address] = LivenessTable(expiry=120)
    table.report("b1", A, now=0)
    for t in range(30, 300, 30):  # heartbeats every 30 s
        table.report("b1", A, now=t)
        assert table.scan(now=t + 10) == []
    assert table.scan(now=270 + 120) == []  # exactly at the expiry: still there
    assert table.scan(now=270 + 120.001) == ["b1"]
    assert table.get("b1") is None


def test_a_dropped_connection_removes_its_entries_at_once() -> None:
    table: LivenessTable[Address] = LivenessTable(expiry=120)
    conn1, conn2 = object(), object()
    table.report("b1", A, now=0, connection=conn1)
    table.report("b2", B, now=0, connection=conn1)
    table.report("b3", B, now=0, connection=conn2)
    assert sorted(table.connection_lost(conn1)) == ["b1", "b2"]
    assert [e.key for e in table.entries()] == ["b3"]


def test_a_report_refreshes_and_a_new_connection_starts_over() -> None:
    table: LivenessTable[Address] = LivenessTable(expiry=120)
    conn = object()
    assert table.report("b1", A, now=0, version=1, connection=conn)
    assert not table.report("b1", A, now=5, version=1, connection=conn)  # nothing new
    entry = table.get("b1")
    assert entry is not None and entry.last_seen == 5 and entry.since == 0
    assert table.report("b1", B, now=7, version=3, connection=object())
    assert entry.value == B and entry.since == 7 and entry.version == 3
    assert table.connection_lost(conn) == []  # the old connection no longer owns it


def test_a_stale_version_changes_nothing_not_even_liveness() -> None:
    table: LivenessTable[Address] = LivenessTable(expiry=120)
    table.report("b1", A, now=0, version=5)
    assert not table.report("b1", B, now=100, version=4)
    assert table.values() == {"b1": A}
    assert table.scan(now=121) == ["b1"]


def test_pinned_entries_never_expire_and_remove_forgets() -> None:
    table: LivenessTable[Address] = LivenessTable(expiry=120)
    table.report("own", A, now=0, connection=PINNED)
    table.report("b1", B, now=0)
    assert table.scan(now=1000) == ["b1"]
    assert "own" in table and len(table) == 1
    assert table.remove("own") and not table.remove("own")
    with pytest.raises(ValueError):
        LivenessTable(expiry=0)


def test_the_name_service_lists_age_and_heartbeat() -> None:
    table: LivenessTable[BrokerRecord] = LivenessTable(expiry=120)
    record = BrokerRecord("b1", A, ("orders",))
    table.report("b1", record, now=10, version=3)
    table.report("b1", record, now=40, version=3)
    (entry,) = table.entries()
    assert record_dict(entry, now=45) == {"id": "b1", "address": ["127.0.0.1", 1000],
                                          "version": 3, "topics": ["orders"], "age": 35,
                                          "since_heartbeat": 5}
