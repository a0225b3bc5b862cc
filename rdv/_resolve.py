"""Where brokers of other processes listen: a static directory, a cache, and name sources.

A universe's :class:`Resolver` is given to its NetNode.  Name sources (the
name service's clients) plug into it with :meth:`Resolver.add_source`; what
they answer is cached until a connect to it fails.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from ._address import Address


class NameSource(Protocol):
    """Something that can be asked where a broker lives (a name-service client)."""

    async def lookup(self, broker_id: str) -> Address | None: ...


class Resolver:
    """Broker id -> address: the static ``directory`` first, then the cache of what
    sources answered, then each source in turn."""

    def __init__(self, directory: Mapping[str, tuple[str, int]] | None = None) -> None:
        self.directory: dict[str, Address] = {
            broker_id: Address(*where) for broker_id, where in (directory or {}).items()}
        self.cache: dict[str, Address] = {}
        self.sources: list[NameSource] = []

    def add_source(self, source: NameSource) -> None:
        self.sources.append(source)

    def known(self, broker_id: str) -> Address | None:
        """The address held now, without asking anyone."""
        return self.directory.get(broker_id) or self.cache.get(broker_id)

    def can_reach(self, broker_id: str) -> bool:
        """Whether ``broker_id`` might live in another process."""
        return bool(self.sources) or self.known(broker_id) is not None

    async def resolve(self, broker_id: str, *, fresh: bool = False) -> Address | None:
        """The broker's address; ``fresh`` forgets a cached one and asks the sources again."""
        if fresh:
            self.cache.pop(broker_id, None)
            address = self.directory.get(broker_id)
        else:
            address = self.known(broker_id)
        if address is not None:
            return address
        for source in self.sources:
            address = await source.lookup(broker_id)
            if address is not None:
                self.cache[broker_id] = address
                return address
        return None
