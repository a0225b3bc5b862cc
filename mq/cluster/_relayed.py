"""What a relay (:mod:`._relay`) asks of its MQ server, and its link to the cluster's root."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from brokermgr import BrokerLink, Call, Deferred, Push, PushTable
from brokermgr.tracking import TrackNode
from channels import MessageQueue
from pump import Pump

from ..topics._catalogue import Catalogue
from ..topics._delivery import Links
from ..topics._requests import Consume
from ..topics._stretch import Stretches

if TYPE_CHECKING:
    from ._relay_groups import RelayedFrame

__all__ = ["RelayedServer", "Upstream", "UpstreamOwner", "Waiting"]

log = logging.getLogger("rdvpump.mq.cluster")


class Consumes(Protocol):
    """A server's ``consume`` command (:class:`~mq.server._consumers.ConsumerCommands`)."""

    def consume(self, request: Consume, call: Call) -> dict[str, Any] | None: ...


class RelayedServer(Protocol):
    """What a relay asks of its MQ server (:class:`~mq.MqServer`): where it is, its
    topics and links, to answer a request later or handle one as its own."""

    @property
    def node(self) -> TrackNode: ...

    @property
    def pump(self) -> Pump: ...

    @property
    def address(self) -> str: ...

    @property
    def catalogue(self) -> Catalogue: ...

    @property
    def links(self) -> Links: ...

    @property
    def consumers(self) -> Consumes: ...


    def defer(self, call: Call, reply: dict[str, Any] | None = None, **named: Any
              ) -> Deferred: ...

    def handle(self, queue: MessageQueue, obj: dict[str, Any]) -> None: ...


class UpstreamOwner(Protocol):
    """What the link to the root tells its relay (:class:`~._relay.Relay`)."""

    @property
    def server(self) -> RelayedServer: ...

    @property
    def port(self) -> int: ...

    def take(self, upstream: Upstream, obj: dict[str, Any]) -> None: ...

    def upstream_up(self, upstream: Upstream) -> None: ...

    def upstream_lost(self, upstream: Upstream, reason: str) -> None: ...

    def run_waiting(self) -> None: ...


class Upstream(BrokerLink):
    """This server's link to its cluster's root, on the root's MQ port."""

    def __init__(self, relay: UpstreamOwner, root: str) -> None:
        super().__init__(relay.server.node.broker, root, relay.port,
                         name=f"cluster root {root}", retry=0.5)
        self.relay = relay
        self.root = root
        #: Each shared topic's last stretch of messages the root sent on this link with
        #: their bodies, by frame: what it then names without them (``cached``; see
        #: :mod:`mq.topics._stretch`).  The link's, gone when it closes.
        self.stretches: Stretches[RelayedFrame] = Stretches()
        #: What the root sends: its groups' messages; an error is an ack it no longer
        #: held (redelivered after its ack timeout): that message comes again.
        self.pushes = PushTable(f"root {root}", {
            "messages": Push.raw(lambda obj: relay.take(self, obj)),
        }, refused=lambda error: log.info("%s: root %s: %s", relay.server.address, root,
                                          error), unknown="ignore")

    def opened(self) -> None:
        self.stretches.clear()
        self.relay.upstream_up(self)

    def lost(self, reason: str) -> None:
        self.stretches.clear()
        self.relay.upstream_lost(self, reason)

    def room_again(self) -> None:
        self.relay.run_waiting()


@dataclass
class Waiting:
    """A request waiting for a root: run ``again`` when one is there, or refused through
    ``reply`` at ``deadline``."""

    deadline: float
    again: Callable[[], object]
    reply: Deferred
