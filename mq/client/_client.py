"""A broker's client of one MQ server, async (trio) face: declare, publish, consume, ack.

The link reconnects by itself (:class:`brokermgr.BrokerLink`); after a
reconnect every subscription consumes again, and what the server had
delivered on the old link and not seen acknowledged is delivered again
(at least once).  A publish that fails (no reply within the timeout, the
link lost) raises :class:`ServiceError`: the message may or may not be
stored, so publishing it again can store it twice; consumers that must not
see duplicates drop them by ``(producer, sequence)``.

Acks (and the consume a reconnect repeats) are sent without waiting for a
reply, but their errors are not lost: the server answers an error on the
same link, naming the request's command, topic and group, and the client
hands it to the subscription's ``on_error`` callback if it has one, or else
raises it (:class:`ServiceError`) from that subscription's next call
(``receive``, ``receive_many``, ``ack``).  An ack of an offset the consumer does
not hold is such an error (409): acknowledged twice, never delivered to it, or
redelivered elsewhere after the ack timeout.  Acks of messages that came on a
link that has since been lost are not sent: the server delivers those again.
Errors of other fire-and-forget requests go to :attr:`MqClient.on_error`, or
are logged.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import trio

from brokermgr import (
    DEFAULT_CLOSE_TIMEOUT,
    DEFAULT_RETRY,
    Body,
    Broker,
    BrokerLink,
    Fields,
    Push,
    PushTable,
    ReplyObject,
    ReplyOrError,
    Sent,
    ServiceError,
    Status,
    encode,
)
from brokermgr.tracking import ServerAddress
from channels import QueueFullError
from pump import ConfigError

from ..topics._group import DEFAULT_WINDOW
from ..topics._wire import lazy_column, unpack_offsets, unpack_sizes
from ._subscription import Message, MessageBatch, Pushed, Receiver, Subscription

#: Seconds a request waits for its reply by default.
DEFAULT_TIMEOUT = 10.0
#: Most servers a client keeps in its list (those it was given, and those redirects
#: named).
MAX_SERVERS = 64

log = logging.getLogger("rdvpump.mq")


class Stored(NamedTuple):
    """Where a published message is: the server and its offset in the topic there."""

    server: str
    offset: int


def _stored(reply: ReplyObject, count: int) -> list[Stored]:
    """Where ``count`` messages stored by one request went (consecutive offsets)."""
    server, first, new = str(reply["server"]), int(reply["offset"]), tuple.__new__
    return [new(Stored, (server, offset)) for offset in range(first, first + count)]


class _ServerLink(BrokerLink):
    """The client's link: to the first of its servers, and to the next one (round the
    list) each time a server refuses it or the link to it is lost."""

    def __init__(self, client: MqClient, broker: Broker, servers: list[ServerAddress],
                 retry: float) -> None:
        first = servers[0]
        super().__init__(broker, first.broker_id, first.port, name=f"mq {first.address}",
                         retry=retry)
        self._dial = self._dial_current
        self.client = client
        self.servers = servers
        self.at = 0
        #: The server a redirect named: the one dialled after this link is lost.
        self.redirected: int | None = None
        #: What a server sends unasked; a push this client does not know is ignored.
        self.pushes = PushTable(f"mq server {first.address}", {
            "redirect": Push(lambda f: f.raw("server"), self.redirect),
            "pushed": Push(_parse_pushed, self._pushed_to),
            "reply": Push.raw(self._rpc_reply),
            "messages": Push.raw(self._messages),
            "writable": Push(lambda f: f.string("topic"), self._writable),
        }, refused=client.failed, unknown="ignore")

    @property
    def server(self) -> ServerAddress:
        return self.servers[self.at]

    def _dial_current(self, link: Any) -> None:
        server = self.server
        self.name = f"mq {server.address}"
        self.broker.connect(server.broker_id, server.port, self)

    def _next(self) -> None:
        if self.redirected is not None:
            self.at, self.redirected = self.redirected, None
        elif len(self.servers) > 1:
            self.at = (self.at + 1) % len(self.servers)

    def redirect(self, server: object) -> None:
        """The server said where to go when it goes: that one is dialled next (added to
        the list, up to :data:`MAX_SERVERS`)."""
        try:
            target = ServerAddress(str(server))
        except ValueError:
            log.warning("%s: a redirect to %r, not BROKER:PORT: ignored", self.name, server)
            return
        known = next((i for i, s in enumerate(self.servers) if s.address == target.address),
                     None)
        if known is None:
            if len(self.servers) >= MAX_SERVERS:
                return
            self.servers.append(target)
            known = len(self.servers) - 1
        self.redirected = known

    def refused(self, reason: str) -> None:
        self._next()
        super().refused(reason)

    def lost(self, reason: str) -> None:
        self._next()

    def opened(self) -> None:
        for subscription in self.client.subscriptions.values():
            subscription.link_lost()  # what came on the lost link comes again
            if subscription.active:  # one still being set up sends its own consume
                subscription.resume()
        for name in self.client.receivers:
            self.send({"cmd": "receive", "name": name})

    def room_again(self) -> None:
        if self.client.on_drained is not None:
            self.client.on_drained()

    def send_with_body(self, obj: dict[str, Any], body: bytes) -> Sent:
        """One message with a binary body, fire and forget."""
        return self.send(encode(obj, body))

    def _writable(self, topic: str) -> None:
        if self.client.on_writable is not None:
            self.client.on_writable(topic)

    def _pushed_to(self, pushed: Pushed) -> None:
        receiver = self.client.receivers.get(pushed.to)
        if receiver is not None:
            receiver.inbox.send_nowait(pushed)

    def _rpc_reply(self, obj: dict[str, Any]) -> None:
        waiting = self.client.calls.pop(obj.get("id"), None)  # type: ignore[arg-type]
        if waiting is not None:
            waiting(obj)  # (a reply after its call timed out: dropped)

    def _messages(self, obj: dict[str, Any]) -> None:
        key = (obj.get("topic"), obj.get("group"))
        subscription = self.client.subscriptions.get(key)  # type: ignore[arg-type]
        if subscription is None:
            return  # unsubscribed meanwhile: the server delivers them again to others
        try:
            body = obj.get("body", b"")
            count = obj["count"]
            if type(count) is not int or count < 1:
                raise ValueError(f"count {count!r}")
            offsets = unpack_offsets(obj["offsets"], count)
            sizes = unpack_sizes(obj["sizes"], count, body)
            columns = [lazy_column(obj[name], count, counting=counting)
                       for name, counting in _COLUMNS[2:]]
        except (KeyError, ValueError, TypeError) as exc:
            self.protocol_error(f"a bad messages frame: {exc}")
            return
        batch = MessageBatch(subscription, offsets, *columns, parts=[(body, sizes)])
        held = subscription.held
        held.add(offsets, None)
        if subscription.no_local:
            me = self.client.producer
            producers = batch.producers
            if me in producers:  # this client's own messages: acknowledged, not handed out
                ack = subscription.ack_request(
                    [o for o, p in zip(offsets, producers, strict=True) if p == me])
                if ack is not None:
                    self.send(ack)  # (past the high-water mark: delivered again, skipped)
                batch = MessageBatch.of(subscription, [m for m in batch if m.producer != me])
                if not batch:
                    return
        if len(held) > subscription.max_held:  # never acknowledged: forget the oldest
            held.trim(subscription.max_held)
        if subscription.on_message is None:
            subscription.inbox.send_nowait(batch)
        else:
            for message in batch:
                subscription.on_message(message)


def _parse_pushed(fields: Fields) -> Pushed:
    """A ``pushed`` message: for a receiver name of this client, from a link's id."""
    return Pushed(fields.string("to"), str(fields.raw("from")), bytes(fields.body()))


#: The columns of a ``messages`` frame, in Message's order, and which of them count.
_COLUMNS = (("offsets", True), ("sizes", False), ("tags", False), ("producers", False),
            ("sequences", True), ("deliveries", False), ("timestamps", False))


def unique_producer(broker_id: str) -> str:
    """A producer id no other client has: ``broker_id`` and a random suffix (a client
    started again on the same broker numbers its messages from 1 again)."""
    return f"{broker_id}~{secrets.token_hex(4)}"


class MqClient:
    """``broker``'s client of the MQ server at ``server`` (``"broker:port"``, as in route
    tables), or of the first of several that answers (a cluster's servers, say: when its
    server goes or refuses it, the client moves on to the next, round the list, and
    consumes again there; :attr:`server` is the one it is on).  ``producer`` names this
    client's messages (default: the broker id and a random suffix, this client's own):
    the server does not store again a publish retried with the same producer and
    sequence (:mod:`mq.topics._dedupe`), so a producer given here must not be another live
    client's."""

    def __init__(self, broker: Broker, server: str | Sequence[str], *,
                 producer: str | None = None, timeout: float = DEFAULT_TIMEOUT,
                 retry: float = DEFAULT_RETRY) -> None:
        servers = [ServerAddress(s) for s in ([server] if isinstance(server, str) else server)]
        if not servers:
            raise ConfigError("an MQ client needs at least one server")
        self.producer = producer or unique_producer(broker.id)
        self.timeout = timeout
        self.sequence = 0
        self.subscriptions: dict[tuple[str, str], Subscription] = {}
        #: RPC calls waiting for their reply, by request id
        self.calls: dict[int, Callable[[ReplyObject], object]] = {}
        #: receiver names this client answers to (push)
        self.receivers: dict[str, Receiver] = {}
        #: The listener face: called when the link takes messages again after a
        #: :class:`~channels.QueueFullError`.
        self.on_drained: Callable[[], object] | None = None
        #: Called with the error of a fire-and-forget request that no subscription owns
        #: (a route or push sent without waiting); without it such errors are logged.
        self.on_error: Callable[[ServiceError], object] | None = None
        #: Called with a topic whose publish the server refused for too few replicas in
        #: sync (503), once it has enough again (a replicated group's master tells the
        #: links it refused so): :class:`~mq.Producer` tries again then.
        self.on_writable: Callable[[str], object] | None = None
        self.link = _ServerLink(self, broker, servers, retry)
        self.link.connect()

    @property
    def server(self) -> ServerAddress:
        """The server this client is on (or dials next)."""
        return self.link.server

    def failed(self, error: ServiceError) -> None:
        """An error reply that no request waits for: to the subscription whose topic and
        group it names (its ack or consume), else :attr:`on_error`, else the log."""
        named = error.detail
        topic, group = named.get("topic"), named.get("group") or named.get("topic")
        subscription = self.subscriptions.get((topic, group))  # type: ignore[arg-type]
        if subscription is not None and named.get("for") in ("ack", "consume"):
            subscription.failed(error)
        elif self.on_error is not None:
            self.on_error(error)
        else:
            log.warning("%s: an error reply to %s: %s", self.server.address,
                        named.get("for", "a request"), error)

    async def connected(self) -> None:
        """Wait until the link to the server is up; :class:`~brokermgr.ServiceError`
        (status 0) if the client is closed."""
        with trio.fail_after(self.timeout):
            await self.link.up.wait()
        if self.link.closing:
            raise ServiceError(Status.NO_REPLY, f"{self.server.address}: the client is "
                                                f"closed")

    async def request(self, obj: dict[str, Any], body: Body | None = None) -> ReplyObject:
        """One request and its reply (:meth:`~brokermgr.ReconnectingLink.call`, within
        :attr:`timeout`); :class:`~brokermgr.ServiceError` for an error reply, or status 0
        for none."""
        return await self.link.call(obj, timeout=self.timeout, body=body)

    async def declare(self, topic: str, *, flags: Sequence[str] = (), group: str | None = None,
                      filter: str | None = None, start: str | None = None,
                      shared: bool = False) -> ReplyObject:
        """Declare a topic (and a group); ``shared``: a topic of the server's cluster,
        declared through its root on every server of it."""
        obj: dict[str, Any] = {"cmd": "declare", "topic": topic, "flags": list(flags)}
        if shared:
            obj["shared"] = True
        for key, value in (("group", group), ("filter", filter), ("start", start)):
            if value is not None:
                obj[key] = value
        return await self.request(obj)

    async def publish(self, topic: str, body: bytes, *, tag: str | None = None,
                      immediate: bool = False) -> Stored:
        """Store one message; returns once the server has stored it as its durability
        policy says.  ``immediate``: only if a consumer of one of the topic's groups is
        there to take it (on a cluster: anywhere in it); else it is returned, not stored:
        :class:`ServiceError` with status 410 (``GONE``) and ``detail["returned"]``."""
        self.sequence += 1
        obj: dict[str, Any] = {"cmd": "produce", "topic": topic, "producer": self.producer,
                               "sequence": self.sequence}
        if tag is not None:
            obj["tag"] = tag
        if immediate:
            obj["immediate"] = True
        reply = await self.request(obj, bytes(body))
        return Stored(str(reply["server"]), int(reply["offset"]))

    async def publish_many(self, topic: str, bodies: Sequence[bytes], *,
                           tag: str | None = None, immediate: bool = False,
                           sequence: int | None = None) -> list[Stored]:
        """Store several messages in one request (one fsync under ``sync``);
        :class:`~channels.MessageTooLargeError` (nothing sent) if the request is larger
        than the link carries.  ``immediate`` as for :meth:`publish`: all are returned
        or none.  ``sequence``: the first message's number, for messages sent before
        with these numbers (a retry, on this server or another of the topic: a server
        that has them answers where they are and does not store them again); by default
        the next of this client's."""
        if not bodies:
            return []
        if sequence is None:
            first_sequence = self.sequence + 1
            self.sequence += len(bodies)
        else:
            first_sequence = sequence
            self.sequence = max(self.sequence, sequence + len(bodies) - 1)
        obj: dict[str, Any] = {"cmd": "produce", "topic": topic, "producer": self.producer,
                               "sequence": first_sequence, "sizes": [len(b) for b in bodies]}
        if tag is not None:
            obj["tag"] = tag
        if immediate:
            obj["immediate"] = True
        reply = await self.request(obj, list(bodies))
        return _stored(reply, len(bodies))

    async def subscribe(self, topic: str, *, group: str | None = None,
                        window: int = DEFAULT_WINDOW, no_local: bool = False
                        ) -> Subscription:
        """Consume ``topic`` in ``group`` (default: the topic's own group).  ``window``:
        the messages this subscription may hold unacknowledged; the server pushes while
        it has room.  The consumers of one group take turns in runs: each is handed its
        share of what there is to deliver, or an eighth of its window when that is more
        (a window below 16: one message at a time).  With ``no_local`` the messages this
        client published (its :attr:`producer`'s, through whichever server of a cluster)
        are acknowledged as they come and not handed out."""
        key = (topic, topic if group is None else group)
        if key in self.subscriptions:
            raise ConfigError(f"already subscribed to {key[0]}/{key[1]}")
        subscription = Subscription(self, key[0], key[1], window)
        subscription.no_local = no_local
        self.subscriptions[key] = subscription
        try:
            await self.request({"cmd": "consume", "topic": topic, "group": key[1],
                                "window": window})
        except BaseException:
            if self.subscriptions.get(key) is subscription:  # close() may have ended it
                del self.subscriptions[key]
            raise
        subscription.active = True
        return subscription

    async def receive_as(self, name: str) -> Receiver:
        """Answer to the receiver name ``name``: what is pushed to it comes here."""
        receiver = self.receivers.get(name)
        if receiver is None:
            receiver = self.receivers[name] = Receiver(name)
            try:
                await self.request({"cmd": "receive", "name": name})
            except BaseException:
                if self.receivers.get(name) is receiver:
                    del self.receivers[name]
                raise
        return receiver

    async def push(self, to: str, body: bytes) -> int:
        """Push ``body`` to every client answering to ``to`` (not stored); how many got
        it.  :class:`ServiceError` (404) if none does."""
        reply = await self.request({"cmd": "push", "to": to}, bytes(body))
        return int(reply["count"])

    # -- the listener face: no awaits, callbacks on the pump ----------------------------

    def publish_nowait(self, topic: str, bodies: Sequence[bytes], *, tag: str | None = None,
                       on_stored: Callable[[list[Stored] | ServiceError], object] | None
                       = None) -> None:
        """Publish ``bodies`` in one request without waiting; ``on_stored(stored)`` runs
        once they are stored (or with the :class:`ServiceError`).  Raises
        :class:`~channels.QueueFullError` when the link is past its high-water mark:
        nothing was sent; try again from :attr:`on_drained`; and
        :class:`~channels.MessageTooLargeError` (nothing sent) for a request larger than
        the link carries: publish fewer at a time."""
        obj: dict[str, Any] = {"cmd": "produce", "topic": topic, "producer": self.producer,
                               "sequence": self.sequence + 1,
                               "sizes": [len(b) for b in bodies]}
        if tag is not None:
            obj["tag"] = tag

        def answered(outcome: ReplyOrError) -> None:
            if on_stored is not None:
                on_stored(outcome if isinstance(outcome, ServiceError)
                          else _stored(outcome, len(bodies)))

        if not self.link.request(obj, answered, body=list(bodies)):
            if self.link.queue is None:
                raise ServiceError(Status.NO_REPLY, f"{self.server.address}: not connected")
            raise QueueFullError(f"{self.server.address}: the link is past its high-water "
                                 f"mark; publish again from on_drained")
        self.sequence += len(bodies)

    def subscribe_nowait(self, topic: str, on_message: Callable[[Message], object], *,
                         group: str | None = None, window: int = DEFAULT_WINDOW,
                         on_error: Callable[[ServiceError], object] | None = None
                         ) -> Subscription:
        """Consume with a callback: ``on_message(message)`` runs on the pump for each
        message; acknowledge with :meth:`Message.ack_nowait`."""
        key = (topic, topic if group is None else group)
        if key in self.subscriptions:
            raise ConfigError(f"already subscribed to {key[0]}/{key[1]}")
        subscription = Subscription(self, key[0], key[1], window, on_message=on_message)
        self.subscriptions[key] = subscription

        def answered(outcome: ReplyOrError) -> None:
            if not isinstance(outcome, ServiceError):
                subscription.active = True
                return
            if self.subscriptions.get(key) is subscription:  # close() may have ended it
                del self.subscriptions[key]
            if on_error is not None:
                on_error(outcome)

        if not self.link.request({"cmd": "consume", "topic": topic, "group": key[1],
                                  "window": window}, answered):
            self.subscriptions.pop(key, None)
            raise ServiceError(Status.NO_REPLY,
                               f"{self.server.address}: not connected or no room")
        return subscription

    async def query(self, topic: str | None = None) -> dict[str, Any]:
        """The topics (or one) as the server describes them, by name."""
        reply = await self.request({"cmd": "query", **({"topic": topic} if topic else {})})
        return dict(reply["topics"])

    async def query_all(self) -> dict[str, Any]:
        """The whole ``query`` reply: ``topics``, and ``unavailable`` (the topics found on
        the server's disk that it cannot open, by directory, with why) when there are."""
        return dict(await self.request({"cmd": "query"}))

    async def remove(self, topic: str, group: str | None = None) -> None:
        await self.request({"cmd": "remove", "topic": topic,
                            **({"group": group} if group else {})})

    async def empty(self, topic: str) -> None:
        await self.request({"cmd": "empty", "topic": topic})

    def close(self) -> None:
        self._end_subscriptions()
        self.link.close()

    async def aclose(self, timeout: float = DEFAULT_CLOSE_TIMEOUT) -> bool:
        """:meth:`close`, then wait until what was sent (acks too) has left this process,
        so that it may end; False if ``timeout`` passed first."""
        self._end_subscriptions()
        return await self.link.aclose(timeout)

    def _end_subscriptions(self) -> None:
        for subscription in list(self.subscriptions.values()):
            subscription.inbox.close()
        self.subscriptions.clear()
