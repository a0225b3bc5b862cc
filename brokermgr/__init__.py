"""Brokers and universes (BrokerManager), their trio face, and the rdvpump CLI."""

from ._broker import Broker as Broker
from ._broker import BrokerManager as BrokerManager
from ._broker import open_universe as open_universe

__all__ = ["Broker", "BrokerManager", "open_universe"]
