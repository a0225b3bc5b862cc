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

    def next_ready(self, start: int) -> int:
        """The index of the first consumer in turn from ``start`` on (round to the start)
        with credits, or -1 when none has: a group's batch is handed out in runs, one
        consumer after another, without a list of every consumer made per batch."""
        consumers = self.consumers
        for i in range(start, len(consumers)):
            if consumers[i].credits > 0:
                return i
        for i in range(min(start, len(consumers))):
            if consumers[i].credits > 0:
                return i
        return -1
