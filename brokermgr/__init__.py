"""Brokers and universes (BrokerManager), the name service with its liveness table, and
zbus-style tracking (:mod:`brokermgr.tracking`)."""

from ._broker import Broker as Broker
from ._broker import BrokerManager as BrokerManager
from ._broker import echo as echo
from ._broker import open_universe as open_universe
from ._link import DEFAULT_RETRY as DEFAULT_RETRY
from ._link import ReconnectingLink as ReconnectingLink
from ._liveness import DEFAULT_SCAN_INTERVAL as DEFAULT_SCAN_INTERVAL
from ._liveness import Entry as Entry
from ._liveness import LivenessTable as LivenessTable
from ._names import DEFAULT_BROKER_EXPIRY as DEFAULT_BROKER_EXPIRY
from ._names import DEFAULT_HEARTBEAT as DEFAULT_HEARTBEAT
from ._names import DEFAULT_MANAGER_PORT as DEFAULT_MANAGER_PORT
from ._names import MANAGER_ID as MANAGER_ID
from ._names import BrokerRecord as BrokerRecord
from ._names import NameClient as NameClient
from ._names import NameService as NameService

__all__ = [
    "DEFAULT_BROKER_EXPIRY",
    "DEFAULT_HEARTBEAT",
    "DEFAULT_MANAGER_PORT",
    "DEFAULT_RETRY",
    "DEFAULT_SCAN_INTERVAL",
    "MANAGER_ID",
    "Broker",
    "BrokerManager",
    "BrokerRecord",
    "Entry",
    "LivenessTable",
    "NameClient",
    "NameService",
    "ReconnectingLink",
    "echo",
    "open_universe",
]
