"""A link this side dials and keeps: reconnects after a refusal or a loss, speaks the
service protocol (:mod:`._service`), and matches replies to requests.  The name client's
links to managers, tracking's links to trackers and servers, and MQ clients' links to
their servers are all this one class.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import trio

from channels import Gather, MessageQueue, MessageTooLargeError, ProtocolError, QueueListener
from pump import ConfigError, Future, Pump, Timer

from ._broker import DEFAULT_CLOSE_TIMEOUT, Broker, wait_all_sent
from ._rpc import Body, Sent, decode, encode, send
from ._service import PushTable, ReplyObject, ServiceError, Status

log = logging.getLogger("rdvpump.link")

#: The longest wait before dialling again after a refused or failed connect.
DEFAULT_RETRY = 1.0
#: The first wait after a refusal; each refusal in a row doubles it, up to ``retry``.
FIRST_RETRY = 0.02

#: What a request's callback gets: the reply, or the error it carried (the envelope made an
#: exception again), or :data:`Status.NO_REPLY` if the link closed first.
ReplyOrError = ReplyObject | ServiceError


class ReconnectingLink(QueueListener):
    """Dials with ``dial(self)`` (which must end in ``connected`` or ``refused``) and keeps
    the link until :meth:`close`: ``after_loss`` seconds (default: ``retry``) after an
    open link closed it dials again, and after a refusal it backs off: ``FIRST_RETRY``
    seconds, doubled after each refusal in a row up to ``retry``, each wait drawn
    between half and all of that from the pump's seeded generator (so that brokers
    that lost one manager together do not dial it again in step).

    Messages are JSON objects.  A reply carrying the ``seq`` of a request made with
    :meth:`request` or :meth:`call` goes to that request; any other message goes to
    :meth:`pushed`.  Subclasses override the hooks :meth:`opened`, :meth:`lost`,
    :meth:`goodbye`, :meth:`pushed` and :meth:`room_again`.
    """

    def __init__(self, pump: Pump, dial: Callable[[ReconnectingLink], None], *, name: str,
                 retry: float = DEFAULT_RETRY, after_loss: float | None = None) -> None:
        if not retry > 0:
            raise ConfigError(f"retry must be positive, got {retry!r}")
        self.pump = pump
        self.name = name
        self.retry = retry
        self.after_loss = retry if after_loss is None else after_loss
        self._refusals = 0  # in a row, since the last connect
        self._dial = dial
        self.queue: MessageQueue | None = None
        self.connects = 0
        self.last_refusal: str | None = None
        self._timer: Timer | None = None
        self._closing = False
        self._attempted = trio.Event()
        self._seq = 0
        self._waiting: dict[int, Callable[[ReplyOrError], object]] = {}
        #: the calls waiting for a reply: by ``seq``, the pump time their timeout ends,
        #: what they asked and their timeout; one pump timer for all of them
        self._deadlines: dict[int, tuple[float, str, float]] = {}
        self._expiry: Timer | None = None
        self._expiry_at = float("inf")
        #: Set while the link is up, and for good once it is closed (so that nothing
        #: waits on a link that will not come up again).
        self.up = trio.Event()
        #: Set (and renewed) each time the link takes messages again after its high-water
        #: mark, and when it closes.
        self.room = trio.Event()
        #: Set when the link is lost or closed, renewed when it is up again; with
        #: :attr:`lost_reason`, why.
        self.down = trio.Event()
        self.lost_reason: str | None = None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} to {self.name}>"

    # -- dialling ----------------------------------------------------------------------

    def connect(self) -> None:
        """Dial now (the first time, or again)."""
        self._timer = None
        if not self._closing:
            self._dial(self)

    def hurry(self) -> None:
        """Dial now if the link is down and waiting to dial again (its peer is known to
        be back, say: a route table lists it), instead of when the back-off ends."""
        if self.queue is None and self._timer is not None and not self._closing:
            self._timer.cancel()
            self.connect()

    def connected(self, queue: MessageQueue) -> None:
        if self._closing:
            queue.close()
            return
        self.queue = queue
        self.connects += 1
        self.last_refusal = None
        self._refusals = 0
        queue.set_listener(self)
        if self.down.is_set():
            self.down = trio.Event()
        self.up.set()
        self.opened()
        self._outcome()

    def refused(self, reason: str) -> None:
        self.last_refusal = reason
        self._outcome()
        backoff = min(self.retry, FIRST_RETRY * 2 ** min(self._refusals, 32))
        self._refusals += 1
        self._again(reason, backoff * (0.5 + 0.5 * self.pump.random.random()))

    def closed(self, reason: str) -> None:
        self.queue = None
        self.lost_reason = reason
        self.down.set()
        if not self._closing:
            self.up = trio.Event()
        waiting, self._waiting = self._waiting, {}
        for on_reply in waiting.values():
            on_reply(ServiceError(Status.NO_REPLY, f"{self.name}: the link closed before "
                                                   f"the reply ({reason})"))
        self.lost(reason)
        self.drained()
        self._again(reason, self.after_loss)

    def drained(self) -> None:
        self.room.set()
        self.room = trio.Event()
        self.room_again()

    def _again(self, reason: str, delay: float) -> None:
        if self._closing:
            return
        log.info("%s: %s; dialling again in %.3f s", self.name, reason, delay)
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.pump.call_later(delay, self.connect)

    def _outcome(self) -> None:
        self._attempted.set()
        self._attempted = trio.Event()

    async def attempted(self) -> None:
        """Wait for the outcome of the next connect attempt (connected or refused)."""
        await self._attempted.wait()

    def close(self) -> None:
        """Stop dialling; say :meth:`goodbye` on an open link, then close it (flushing)."""
        self._closing = True
        self.up.set()  # a caller waiting for the link to come up is told it is closed
        if self._timer is not None:
            self._timer.cancel()
        if self.queue is not None:
            self.goodbye()
            self.queue.close()

    async def aclose(self, timeout: float = DEFAULT_CLOSE_TIMEOUT) -> bool:
        """:meth:`close`, then wait until everything sent on the link (the goodbye too) has
        left this process, so that it may end; False if ``timeout`` passed first (a peer
        that stops reading holds the last bytes)."""
        queue = self.queue
        self.close()
        return await wait_all_sent([] if queue is None else [queue], timeout)

    @property
    def closing(self) -> bool:
        return self._closing

    # -- messages ----------------------------------------------------------------------

    def send(self, obj: dict[str, Any] | bytes | Gather) -> Sent:
        """One JSON message (or one already encoded); GONE while not connected."""
        if self.queue is None:
            return Sent.GONE
        return send(self.queue, obj, what=self.name)

    def request(self, obj: dict[str, Any], on_reply: Callable[[ReplyOrError], object], *,
                body: Body | None = None) -> bool:
        """Send ``obj`` (and ``body``, if any) with a fresh ``seq``; ``on_reply`` runs with
        the reply when it comes (a :class:`ServiceError` for an error reply, or status
        :data:`Status.NO_REPLY` if the link closes first).  False if it could not be sent
        (not connected, or past the high-water mark);
        :class:`~channels.MessageTooLargeError` (nothing sent) if it can never be."""
        self._seq += 1
        seq = self._seq
        message = {**obj, "seq": seq}
        data = encode(message, body)
        if self.queue is not None and len(data) > self.queue.max_message_size:
            # sent, it would close the link; refused here, nothing is lost
            raise MessageTooLargeError(
                f"{self.name}: a request of {len(data)} bytes exceeds the link's maximum "
                f"message size of {self.queue.max_message_size} bytes; nothing was sent")
        if self.send(data) is not Sent.SENT:
            return False
        self._waiting[seq] = on_reply
        return True

    async def call(self, obj: dict[str, Any], *, timeout: float, body: Body | None = None
                   ) -> ReplyObject:
        """One request and its reply, the one waiter of every service client: waits (all
        within ``timeout`` seconds) for the link to be up and to have room, then for the
        reply.  Raises the :class:`ServiceError` of an error reply, or status
        :data:`Status.NO_REPLY` if none came (then the request may or may not have been
        carried out); :class:`~channels.MessageTooLargeError` if it can never be sent.
        On a closed link (or one that closes while this waits for it to come up) it
        raises status :data:`Status.NO_REPLY` at once: nothing was sent.

        The wait for the reply ends with a pump timer, one for every call waiting on
        this link (a trio cancel scope per call cost a fifth of a request's work): like
        the reply itself, it comes only while the pump is driven (:attr:`Pump.driven
        <pump.PumpCore.driven>`)."""
        if not timeout >= 0:
            raise ConfigError(f"timeout must be a non-negative number of seconds, got "
                              f"{timeout!r}")
        reply: Future[ReplyOrError] = Future()
        what = obj.get("cmd", "the request")
        ends = self.pump.now() + timeout
        while self.queue is None or not self.request(obj, reply.set, body=body):
            # not up (nothing sent), or past the high-water mark: wait, within the timeout
            if self.queue is None and self._closing:
                raise ServiceError(Status.NO_REPLY, f"{self.name}: closed; {what} "
                                                    f"was not sent")
            with trio.move_on_after(max(0.0, ends - self.pump.now())) as waited:
                await (self.up if self.queue is None else self.room).wait()
            if waited.cancelled_caught:
                raise self._no_reply(what, timeout)
        seq = self._seq
        self._deadlines[seq] = (ends, what, timeout)
        if ends < self._expiry_at:
            self._arm(ends)
        try:
            outcome = await reply.wait()
        finally:
            self._waiting.pop(seq, None)
            self._deadlines.pop(seq, None)
        if isinstance(outcome, ServiceError):
            raise outcome
        return outcome

    def _no_reply(self, what: str, timeout: float) -> ServiceError:
        return ServiceError(Status.NO_REPLY,
                            f"{self.name}: no reply to {what} within {timeout} s "
                            f"({'not connected' if self.queue is None else 'no reply'}); "
                            f"it may or may not have been carried out")

    def _arm(self, when: float) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
        self._expiry_at = when
        self._expiry = self.pump.call_at(when, self._expire)

    def _expire(self) -> None:
        """The calls whose timeout ended are answered with :data:`Status.NO_REPLY`; the
        timer is armed again for the next one to end."""
        self._expiry, self._expiry_at = None, float("inf")
        now = self.pump.now()
        ended = [seq for seq, (ends, _, _) in self._deadlines.items() if ends <= now]
        for seq in ended:
            _, what, timeout = self._deadlines.pop(seq)
            on_reply = self._waiting.pop(seq, None)
            if on_reply is not None:
                on_reply(self._no_reply(what, timeout))
        if self._deadlines:
            self._arm(min(ends for ends, _, _ in self._deadlines.values()))

    def received(self, message: bytes) -> None:
        try:
            obj = decode(message)
        except ProtocolError as exc:
            self.protocol_error(f"bad message from {self.name}: {exc}")
            return
        seq = obj.get("seq")
        on_reply = self._waiting.pop(seq, None) if isinstance(seq, int) else None
        if on_reply is not None:
            on_reply(ServiceError.of(obj) or obj)
        else:
            self.pushed(obj)

    def abort(self, reason: str) -> None:
        """Close the link at once with ``reason`` (it is dialled again later)."""
        if self.queue is not None:
            self.queue.abort(reason)

    def protocol_error(self, what: str) -> None:
        """Close the link at once: the peer broke the protocol (cause
        ``PROTOCOL_ERROR``; it is dialled again later)."""
        if self.queue is not None:
            self.queue.protocol_error(what)

    # -- hooks for subclasses ----------------------------------------------------------

    def opened(self) -> None:
        """The link is up (again)."""

    def lost(self, reason: str) -> None:
        """The link closed; it is dialled again unless closing."""

    def goodbye(self) -> None:
        """Last words on a clean :meth:`close`, sent before the link closes."""

    #: What the link does with a message that is no reply (a subclass sets its own).
    pushes: PushTable | None = None

    def pushed(self, obj: dict[str, Any]) -> None:
        """A message that is not a reply to a request: through :attr:`pushes`."""
        if self.pushes is not None:
            self.pushes.take(obj, self.protocol_error)

    def room_again(self) -> None:
        """The link takes messages again (after its high-water mark, or closing)."""


class BrokerLink(ReconnectingLink):
    """A reconnecting link that ``broker`` dials to ``(broker_id, port)`` of its universe;
    it stops dialling once the broker is closed."""

    def __init__(self, broker: Broker, broker_id: str, port: int, *, name: str,
                 retry: float = DEFAULT_RETRY, after_loss: float | None = None) -> None:
        super().__init__(broker.pump, lambda link: broker.connect(broker_id, port, link),
                         name=name, retry=retry, after_loss=after_loss)
        self.broker = broker

    def connect(self) -> None:
        if not self.broker.closed:
            super().connect()
