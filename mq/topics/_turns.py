"""Consumers in turn: the one round robin of a consume group's deliveries, on the server
that holds the topic (:class:`~._topic.Group`) and on a cluster's server that relays a
shared topic's group from its root (:class:`~mq.cluster._relay_groups.RelayGroup`)."""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar

__all__ = ["InTurn"]


class HasCredits(Protocol):
    @property
    def credits(self) -> int: ...


C = TypeVar("C", bound=HasCredits)


class InTurn(Generic[C]):
    """A group whose ``consumers`` take deliveries in turn, from ``turn`` on (a mixin:
    the class that uses it declares both)."""

    consumers: list[C]
    #: where the round robin starts next: an index of ``consumers``
    turn: int

    def pick(self, need: int = 1) -> C | None:
        """The next consumer in turn with credits for ``need`` messages, or None.

        A hot path (once per frame handed out): one pass from the turn to the end, then
        from the start, with no modulo per step."""
        consumers = self.consumers
        n = len(consumers)
        turn = self.turn if self.turn < n else 0
        for i in range(turn, n):
            consumer = consumers[i]
            if consumer.credits >= need:
                self.turn = i + 1 if i + 1 < n else 0
                return consumer
        for i in range(turn):
            consumer = consumers[i]
            if consumer.credits >= need:
                self.turn = i + 1
                return consumer
        return None

    def ready(self) -> list[C]:
        """Every consumer with credits, in turn (a batch handed to them in runs, in one pass)."""
        consumers = self.consumers
        turn = self.turn if self.turn < len(consumers) else 0
        return [c for c in (*consumers[turn:], *consumers[:turn]) if c.credits > 0]

    def served(self, consumer: C) -> None:
        """``consumer`` was served last: the turn goes to the one after it."""
        self.turn = (self.consumers.index(consumer) + 1) % len(self.consumers)
