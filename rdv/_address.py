"""Addresses and their one parser each: where a process listens, ``Address(host, port)``
(``HOST:PORT``); where a broker's port is in its universe, ``BrokerPort(broker_id, port)``
(``BROKER:PORT``, resolved like any link); and both at once on a command line,
``BROKER@HOST:PORT`` (:func:`parse_located`).  One rule for every port: 0..65535."""

from __future__ import annotations

from typing import NamedTuple

from pump import ConfigError

from ._core import MAX_PORT


class Address(NamedTuple):
    """A TCP address.  A tuple, so ``trio.open_tcp_stream(*address)`` works."""

    host: str
    port: int

    @classmethod
    def parse(cls, text: str, *, default_port: int | None = None) -> Address:
        """``HOST:PORT`` (or ``HOST`` when a default port is given); ValueError otherwise."""
        host, sep, port = text.rpartition(":")
        if not sep:
            if default_port is None:
                raise ConfigError(f"address {text!r} must be HOST:PORT")
            host, port = text, str(default_port)
        if not host or not port.isdigit() or not 0 <= int(port) <= MAX_PORT:
            raise ConfigError(f"address {text!r} must be HOST:PORT with a port within "
                             f"0..{MAX_PORT}")
        return cls(host, int(port))

    @classmethod
    def of(cls, value: object) -> Address:
        """From ``[host, port]`` as JSON carries it; ValueError otherwise."""
        if (not isinstance(value, (list, tuple)) or len(value) != 2
                or not isinstance(value[0], str) or not isinstance(value[1], int)
                or isinstance(value[1], bool)):
            raise ConfigError("address must be [host, port]")
        return cls(value[0], value[1])

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def _port(text: str) -> int | None:
    return int(text) if text.isdigit() and int(text) <= MAX_PORT else None


class BrokerPort(NamedTuple):
    """A rendezvous address: a broker of the universe and one of its ports."""

    broker_id: str
    port: int

    @classmethod
    def parse(cls, text: object) -> BrokerPort:
        """``BROKER:PORT``; ValueError saying what is wrong otherwise."""
        if not isinstance(text, str):
            raise ConfigError(f"an address must be a string 'broker:port', got {text!r}")
        broker_id, sep, port = text.rpartition(":")
        number = _port(port) if sep and broker_id else None
        if number is None:
            raise ConfigError(f"address {text!r} must be 'broker:port' with a port within "
                             f"0..{MAX_PORT}")
        return cls(broker_id, number)

    def __str__(self) -> str:
        return f"{self.broker_id}:{self.port}"


def parse_located(text: str) -> tuple[str | None, Address]:
    """``BROKER@HOST:PORT`` (a broker id and the address of the process it lives in) or
    ``HOST:PORT`` (no broker id: None); ValueError otherwise."""
    broker_id, sep, where = text.rpartition("@")
    if sep and not broker_id:
        raise ConfigError(f"{text!r}: empty broker id before '@'")
    return (broker_id if sep else None), Address.parse(where)
