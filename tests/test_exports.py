"""The public surface of each package is what its __all__ says, and nothing private leaks."""

from __future__ import annotations

import importlib

import pytest

PACKAGES = {
    "pump": {"Pump", "ListSink", "TraceEvent", "TraceSink", "Timer", "Owner", "SCHEMA_VERSION",
             "FIELDS", "FORMATS", "JsonlWriter", "ParquetWriter", "TraceRecorder", "open_trace",
             "DEFAULT_SERVE_BATCH", "Future", "Repeating"},
    "channels": {"RingBuffer", "Channel", "ChannelManager", "MessageQueue", "AsyncMessageQueue",
                 "QueueListener", "QueueFullError", "MessageTooLargeError", "ProtocolError",
                 "FrameBudget"},
    "rdv": {"Rendezvous", "RdvNode", "AcceptListener", "ConnectListener", "RefusedError",
            "BrokerPort", "parse_located",
            "RdvUsageError", "TRANSITIONS", "state_diagram", "Address"},
    "brokermgr": {"Broker", "BrokerManager", "open_universe", "echo", "NameService", "NameClient",
                  "LivenessTable", "DEFAULT_MANAGER_PORT", "DEFAULT_HEARTBEAT",
                  "DEFAULT_BROKER_EXPIRY", "DEFAULT_SCAN_INTERVAL", "DEFAULT_RETRY",
                  "ServiceError", "Status", "CommandTable", "Command", "Fields", "Call",
                  "ServiceSession"},
    "brokermgr.tracking": {"TrackNode", "RouteClient", "RouteTable", "ServerInfo", "TrackerInfo",
                           "TopicInfo", "ConsumeGroupInfo", "ServerAddress", "VersionCounter",
                           "RoundRobin", "all_servers", "by_key_hash", "ProducerRoute",
                           "ConsumerRoute",
                           "DEFAULT_SERVER_EXPIRY", "DEFAULT_TRACK_PORT", "TRACKER_ALIAS"},
    "mq": {"TopicLog", "CursorStore", "TagFilter", "Record", "StoreError", "FormatError",
           "FilterError", "Corruption", "FORMAT_VERSION", "MAX_NAME_BYTES", "check_name",
           "disk_name", "ServiceError", "Status", "verify"},
    "rdvpump.cli": {"app", "main"},
}


@pytest.mark.parametrize("name", sorted(PACKAGES))
def test_public_names(name: str) -> None:
    module = importlib.import_module(name)
    exported = set(module.__all__)
    assert PACKAGES[name] <= exported
    for symbol in exported:
        assert not symbol.startswith("_")
        assert getattr(module, symbol) is not None


def test_every_exception_rdvpump_defines_shares_one_base() -> None:
    import inspect
    import pkgutil

    from pump import RdvpumpError

    defined = []
    for package in ("pump", "channels", "rdv", "brokermgr", "mq", "replay", "rdvpump"):
        root = importlib.import_module(package)
        names = [package] + [m.name for m in pkgutil.walk_packages(root.__path__, package + ".")
                             if not m.name.endswith("__main__")]
        for name in names:
            module = importlib.import_module(name)
            defined += [obj for _, obj in inspect.getmembers(module, inspect.isclass)
                        if issubclass(obj, BaseException) and obj.__module__ == name]
    assert len(defined) >= 10
    assert [e.__qualname__ for e in defined if not issubclass(e, RdvpumpError)] == []
