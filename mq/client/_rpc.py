"""RPC over MQ (zbus's produce + route): :class:`Caller` and :class:`Service`.

A request is a message on a topic with the ``rpc`` flag; the server stamps it
with the caller link's id.  A :class:`Service` consumes the topic,
runs its handler and routes the answer back to that link.  Requests and
replies are as durable as the topic (declare it ``memory`` too for plain
RPC); a reply to a caller that has left, or one that comes after the call
timed out, is dropped (the server counts the first kind).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio

from brokermgr import ReplyObject, ServiceError, Status
from pump import Future

from ._client import MqClient
from ._subscription import Subscription


class RpcTimeout(ServiceError):
    """No reply within the call's timeout (status 0)."""


class Caller:
    """Calls services through ``client``'s server."""

    def __init__(self, client: MqClient) -> None:
        self.client = client
        self._next = 0

    async def call(self, topic: str, body: bytes, *, timeout: float = 10.0) -> bytes:
        """Send a request to ``topic`` and return the reply's body; :class:`RpcTimeout`
        if none comes within ``timeout`` seconds, :class:`~brokermgr.ServiceError` if the
        service answered with an error status."""
        self._next += 1
        request_id = self._next
        answer: Future[ReplyObject] = Future()
        self.client.calls[request_id] = answer.set
        try:
            with trio.move_on_after(timeout):
                await self.client.request({"cmd": "produce", "topic": topic,
                                           "producer": self.client.producer,
                                           "sequence": request_id}, bytes(body))
                await answer.wait()
        finally:
            self.client.calls.pop(request_id, None)
        if not answer.done():
            raise RpcTimeout(Status.NO_REPLY, f"no reply from {topic!r} within {timeout} s")
        reply = answer.result()
        status = reply.get("status", Status.OK)
        if status != Status.OK:
            raise ServiceError(status if type(status) is int else Status.INTERNAL,
                               bytes(reply.get("body", b"")).decode(errors="replace"))
        return bytes(reply.get("body", b""))


class Service:
    """Answers requests on ``topic`` with ``handler(body) -> reply body``, one at a time
    (run several services on one topic to answer in parallel: they share its group); a
    handler that raises answers status 500 with the error's text.  Run :meth:`serve` in
    a nursery."""

    def __init__(self, client: MqClient, topic: str,
                 handler: Callable[[bytes], Awaitable[bytes]], *, window: int = 100) -> None:
        self.client = client
        self.topic = topic
        self.handler = handler
        self.window = window
        #: Requests answered.
        self.answered = 0

    async def serve(self, *, task_status: trio.TaskStatus[Subscription] =
                    trio.TASK_STATUS_IGNORED) -> None:
        subscription = await self.client.subscribe(self.topic, window=self.window)
        task_status.started(subscription)
        async for message in subscription:
            try:
                answer, status = await self.handler(message.body), 200
            except Exception as exc:  # the caller hears why, the service goes on
                answer, status = f"{type(exc).__name__}: {exc}".encode(), 500
            self.client.link.send_with_body(
                {"cmd": "route", "topic": self.topic, "recver": message.producer,
                 "id": message.sequence, "status": status}, answer)
            await message.ack()
            self.answered += 1
