"""Where a process listens: ``Address(host, port)``, and its one text form, ``HOST:PORT``."""

from __future__ import annotations

from typing import NamedTuple

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
                raise ValueError(f"address {text!r} must be HOST:PORT")
            host, port = text, str(default_port)
        if not host or not port.isdigit() or not 0 <= int(port) <= MAX_PORT:
            raise ValueError(f"address {text!r} must be HOST:PORT with a port within "
                             f"0..{MAX_PORT}")
        return cls(host, int(port))

    @classmethod
    def of(cls, value: object) -> Address:
        """From ``[host, port]`` as JSON carries it; ValueError otherwise."""
        if (not isinstance(value, (list, tuple)) or len(value) != 2
                or not isinstance(value[0], str) or not isinstance(value[1], int)
                or isinstance(value[1], bool)):
            raise ValueError("address must be [host, port]")
        return cls(value[0], value[1])

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"
