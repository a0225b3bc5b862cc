"""The public surface of each package is what its __all__ says, and nothing private leaks."""

from __future__ import annotations

import importlib

import pytest

PACKAGES = {
    "pump": {"Pump", "ListSink", "TraceEvent", "TraceSink", "Timer", "Owner", "SCHEMA_VERSION",
             "FIELDS", "FORMATS", "JsonlWriter", "ParquetWriter", "TraceRecorder", "open_trace",
             "DEFAULT_SERVE_BATCH"},
    "channels": {"RingBuffer", "Channel", "ChannelManager", "MessageQueue", "AsyncMessageQueue",
                 "QueueListener", "QueueFullError", "MessageTooLargeError", "ProtocolError"},
    "rdv": {"Rendezvous", "RdvNode", "AcceptListener", "ConnectListener", "RefusedError",
            "RdvUsageError", "TRANSITIONS", "state_diagram"},
    "brokermgr": {"Broker", "BrokerManager", "open_universe"},
    "brokermgr.tracking": {"TrackNode", "RouteClient", "RouteTable", "ServerInfo", "TrackerInfo",
                           "TopicInfo", "ConsumeGroupInfo", "ServerAddress", "VersionCounter",
                           "RoundRobin", "all_servers", "by_key_hash", "Producer", "Consumer"},
}


@pytest.mark.parametrize("name", sorted(PACKAGES))
def test_public_names(name: str) -> None:
    module = importlib.import_module(name)
    exported = set(module.__all__)
    assert PACKAGES[name] <= exported
    for symbol in exported:
        assert not symbol.startswith("_")
        assert getattr(module, symbol) is not None


def test_imports_only_go_down() -> None:
    """pump knows nothing of channels or brokers; channels nothing of rdv or brokers."""
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1]
    forbidden = {"pump": ("channels", "rdv", "brokermgr"), "channels": ("rdv", "brokermgr"),
                 "rdv": ("brokermgr",)}
    for package, banned in forbidden.items():
        for path in (root / package).glob("*.py"):
            text = path.read_text()
            for other in banned:
                assert f"from {other}" not in text and f"import {other}" not in text, (
                    f"{path.name} imports {other}")
