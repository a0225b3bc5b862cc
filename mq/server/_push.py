"""Routing without storing, on an MQ server's links: RPC replies and pushes.

* RPC (zbus's produce + route): a produce on an ``rpc`` topic is a request, stamped by
  the server with the caller link's id (as its producer; the request id is its
  sequence).  A service consumes it and answers ``route {recver: producer, id:
  sequence, status?}`` + body; the caller's link gets ``reply {id, status}`` + body.  A
  reply to a caller that has left is dropped and counted (``unroutable``).
* Push (zbus's consume + route, reduced to its routing): ``receive {name}`` makes a link
  answer to a receiver name; ``push {to}`` + body reaches every link answering to it at
  once, as ``pushed {to, from}`` + body -- not stored, a 404 if nobody answers to it.
"""

from __future__ import annotations

import logging
from typing import Any

from brokermgr import Call, ServiceError, Status, encode

from ..topics._delivery import Links
from ..topics._requests import Push, Receive, Route

__all__ = ["Router"]

log = logging.getLogger("rdvpump.mq")


class Router:
    """The ``route``, ``receive`` and ``push`` commands of a server at ``address``,
    counting what it routed and what it could not in ``counts``."""

    def __init__(self, links: Links, counts: dict[str, int], address: str) -> None:
        self.links = links
        self.counts = counts
        self.address = address

    def route(self, request: Route, call: Call) -> dict[str, Any] | None:
        """An RPC reply to the caller's link; a caller that has left is counted, and the
        replier told (a 410) only if it asked (``seq``): callers that time out and leave
        are normal."""
        link = self.links.by_caller.get(request.recver)
        if link is None:
            self.counts["unroutable"] += 1
            log.info("%s: a reply to %s (request %d) dropped: the caller has left",
                     self.address, request.recver, request.id)
            if call.seq is not None:
                raise ServiceError(Status.GONE,
                                   f"caller {request.recver} has left; the reply is dropped")
            return None
        self.counts["routed"] += 1
        link.send(encode({"cmd": "reply", "id": request.id, "status": request.status},
                         request.body))
        return {"cmd": "routed"}

    def receive(self, request: Receive, call: Call) -> dict[str, Any]:
        """This link answers to a receiver name: pushes to that name come here."""
        if call.queue is None:
            raise ServiceError(Status.BAD_REQUEST, "receive needs a link to deliver to")
        self.links.answer_to(self.links.of(call.queue), request.name)
        return {"cmd": "receiving", "name": request.name}

    def push(self, request: Push, call: Call) -> dict[str, Any] | None:
        """To every link that answers to the name, now (not stored); a 404 if none does."""
        targets = self.links.receivers.get(request.to)
        if not targets:
            self.counts["unroutable"] += 1
            raise ServiceError(Status.NOT_FOUND, f"no receiver {request.to!r} on {self.address}")
        sender = self.links.of(call.queue).caller_id if call.queue is not None else self.address
        message = encode({"cmd": "pushed", "to": request.to, "from": sender}, request.body)
        for link in targets:
            link.send(message)
        self.counts["routed"] += len(targets)
        return {"cmd": "pushed-to", "count": len(targets)}
