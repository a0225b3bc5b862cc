"""Messages of a cluster's shared topics: every server but the root relays them.

A shared topic's queue is the root's.  A server that is not the root

* forwards each ``produce`` of a shared topic to the root over one link of its own
  (:class:`~._relayed.Upstream`, to the root's MQ port) and answers the client with the root's
  reply once the root stored it (a producer that names itself keeps its name, so the
  root's duplicate check holds across servers; a message from one that does not is
  stored under its *origin*, ``<link>@<server>``);
* serves each consume group of a shared topic its local clients consume from one
  subscription at the root (:class:`RelayGroup`): the root sends each message once per
  server, whatever the number of consumers there, in one frame for all the groups
  here it hands the same messages at once (``groups``), and the server hands the messages
  out among its consumers (round robin, as far as each one's window goes) and passes
  their acks on.  A consumer that goes leaves its unacknowledged messages to the
  others here; the last one to go ends the subscription, and the root gives what the
  server held to the group's other servers;
* drains what its own copy of a shared topic holds from a time it was root to the root
  (:mod:`._drain`), so that no message stored under one root is stranded when another
  takes over.

While the cluster has no root (the cluster is not ready), a produce or consume of a
shared topic waits at most :data:`~._node.NOT_READY_WAIT` seconds for one, then is
refused (503).  When another server becomes the root, this one subscribes its groups
there and its consumers stay; when this server becomes the root, or stops being it,
every client link that consumes a shared topic here is closed with that reason: a client
consumes again as it reconnects, the new way.  A server that stops tells its clients
where to go first (``redirect {server}``: the root, or another server of the cluster).
The root serves its shared topics itself, as any topic.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from operator import itemgetter
from typing import Any

from brokermgr import (
    Call,
    ReplyOrError,
    ServiceError,
    Status,
    encode,
)
from channels import MessageQueue
from pump import ConfigError

from ..topics._delivery import FRAME_BYTES, FRAME_TAIL
from ..topics._requests import MAX_WINDOW, Ack, Consume, Produce, Unconsume, request_object
from ..topics._wire import pack_column
from ._drain import Drain
from ._node import ClusterNode
from ._relay_groups import LocalConsumer, Relayed, RelayedFrame, RelayGroup, take_frame
from ._relayed import RelayedServer, Upstream, Waiting

__all__ = ["RELAY_WINDOW", "Relay", "RelayGroup"]

log = logging.getLogger("rdvpump.mq.cluster")

#: Credits of a server's subscription to a group at the root: what it may hold of the
#: group's messages, not acknowledged yet by its consumers, at once.  Wide enough that a
#: server's groups seldom wait for credits: a group that waits is handed its messages
#: on its own when an ack frees them, no longer in the frame it shares with the server's
#: other groups.  The groups of a frame passed on whole share its bytes.
RELAY_WINDOW = 4096

_first = itemgetter(0)


class Relay:
    """The shared topics' messages on ``server``, a server of ``cluster`` (see the
    module)."""

    def __init__(self, server: RelayedServer, cluster: ClusterNode, *,
                 window: int = RELAY_WINDOW) -> None:
        if not 1 <= window <= MAX_WINDOW:
            # the root would refuse each consume, and the relay ask again each second
            raise ConfigError(f"a relay's window is 1 to {MAX_WINDOW} messages (what a root "
                              f"takes), not {window!r}")
        self.server = server
        self.cluster = cluster
        self.me = cluster.me.id
        self.pump = server.pump
        #: The MQ port of every server of the cluster: this server's own.
        self.port = server.node.address.port
        self.window = window
        self.upstream: Upstream | None = None
        self.groups: dict[tuple[str, str], RelayGroup] = {}
        self.waiting: list[Waiting] = []
        #: The root this server last acted on (its clients' consumes were made for it).
        self._root = cluster.root
        self.counts = {"forwarded": 0, "relayed": 0, "named": 0, "drained": 0}
        #: What this server stored while it was root, sent to the root (:mod:`._drain`).
        self.drain = Drain(server.catalogue, server.address, self.counts)
        cluster.watchers.append(self.root_changed)
        self.root_changed()

    # -- which way a request goes ------------------------------------------------------

    def takes(self, topic: str) -> bool:
        """Whether a request on ``topic`` goes through the root: a shared topic, and this
        server not the root (or no root known yet)."""
        return topic in self.cluster.state.topics and self.cluster.root != self.me

    def _hold(self, call: Call, again: Callable[[], object], what: str, topic: str,
              group: str | None = None) -> None:
        """Wait for a root (bounded), then ``again``; refused 503 after the wait (naming
        the topic and group, so that a client can tell whose refusal it is)."""
        reply = self.server.defer(call, topic=topic, group=group or topic)
        self.waiting.append(Waiting(self.pump.now() + self.cluster.not_ready_wait, again,
                                     reply))

    # -- produce -----------------------------------------------------------------------

    def produce(self, request: Produce, call: Call) -> None:
        """Forward a produce of a shared topic to the root; answered with its reply."""
        upstream = self.upstream
        if upstream is None or upstream.queue is None:
            self._hold(call, lambda: self._produce_again(request, call), "produce",
                       request.topic)
            return
        obj: dict[str, Any] = {"cmd": "produce", "topic": request.topic,
                               "sequence": request.sequence}
        if request.producer is not None:
            obj["producer"] = request.producer
        elif call.queue is not None:
            obj["origin"] = f"{call.queue.remote_id}@{self.me}"
        if request.tag is not None:
            obj["tag"] = request.tag
        if request.sizes is not None:
            obj["sizes"] = list(request.sizes)
        if request.immediate:
            obj["immediate"] = True  # a return comes back as the root's reply
        deferred = self.server.defer(call, topic=request.topic)

        def answered(outcome: ReplyOrError) -> None:
            if isinstance(outcome, ServiceError):
                if outcome.status == Status.NO_REPLY:
                    outcome = ServiceError(Status.UNAVAILABLE, f"{self.server.address}: the "
                                           f"link to the cluster's root closed before it "
                                           f"answered ({outcome.reason}); it may or may not "
                                           f"be stored")
                deferred.refuse(outcome)
                return
            self.counts["forwarded"] += 1
            reply = {k: v for k, v in outcome.items() if k != "seq"}
            reply["via"] = self.server.address
            deferred.answer(reply)

        if not upstream.request(obj, answered, body=request.body):
            self._hold(call, lambda: self._produce_again(request, call), "produce",
                       request.topic)

    def _produce_again(self, request: Produce, call: Call) -> None:
        if self.takes(request.topic):
            self.produce(request, call)
        elif call.queue is not None:  # this server became the root meanwhile: stored here
            self.server.handle(call.queue, request_object(request, call))

    # -- consume, unconsume, ack -------------------------------------------------------

    def consume(self, request: Consume, call: Call) -> dict[str, Any] | None:
        queue = call.queue
        if queue is None:
            raise ServiceError(Status.BAD_REQUEST, "consume needs a link to deliver to")
        if self.cluster.root is None:
            self._hold(call, lambda: self._consume_again(request, call), "consume",
                       request.topic, request.group)
            return None
        group = request.group or request.topic
        if group not in self.cluster.state.topics.get(request.topic, {}):
            raise ServiceError(Status.NOT_FOUND, f"topic {request.topic!r} has no consume "
                                                 f"group {group!r}")
        link = self.server.links.of(queue)
        relay_group = self.groups.get((request.topic, group))
        if relay_group is None:
            relay_group = self.groups[(request.topic, group)] = RelayGroup(request.topic,
                                                                           group)
        if any(c.link is link for c in relay_group.consumers):
            raise ServiceError(Status.CONFLICT,
                               f"this link already consumes {request.topic}/{group}")
        relay_group.consumers.append(LocalConsumer(link, request.window))
        if not relay_group.subscribed:
            self._subscribe(relay_group)
        self._dispatch(relay_group)
        return {"cmd": "consuming", "topic": request.topic, "group": group,
                "window": request.window, "via": self.cluster.root}

    def _consume_again(self, request: Consume, call: Call) -> None:
        if call.queue is None or call.queue.closed:
            return
        try:
            reply = (self.consume(request, call) if self.takes(request.topic)
                     else self.server.consumers.consume(request, call))
        except ServiceError as exc:
            self.server.defer(call, topic=request.topic,
                              group=request.group or request.topic).refuse(exc)
            return
        if reply is not None:
            self.server.defer(call).answer(reply)

    def unconsume(self, request: Unconsume, call: Call) -> dict[str, Any]:
        group = request.group or request.topic
        relay_group, consumer = self._consumer(call.queue, request.topic, group)
        if relay_group is None or consumer is None:
            raise ServiceError(Status.NOT_FOUND,
                               f"this link does not consume {request.topic}/{group}")
        self._drop(relay_group, consumer)
        return {"cmd": "unconsumed", "topic": request.topic, "group": group}

    def _consumer(self, queue: MessageQueue | None, topic: str, group: str
                  ) -> tuple[RelayGroup | None, LocalConsumer | None]:
        """The relayed group of ``topic`` and ``group``, and ``queue``'s consumer of it."""
        relay_group = self.groups.get((topic, group))
        if relay_group is None:
            return None, None
        return relay_group, next((c for c in relay_group.consumers if c.link.queue is queue),
                                 None)

    def consumes(self, queue: MessageQueue | None, topic: str, group: str) -> bool:
        return self._consumer(queue, topic, group)[1] is not None

    def ack(self, request: Ack, call: Call) -> dict[str, Any] | None:
        group = request.group or request.topic
        relay_group, consumer = self._consumer(call.queue, request.topic, group)
        if relay_group is None or consumer is None:
            raise ServiceError(Status.CONFLICT,
                               f"this link does not consume {request.topic}/{group}: its "
                               f"acks are not taken")
        held, offsets = consumer.held, request.offsets
        passed: Sequence[int]
        if (type(offsets) is range and held.take_run(offsets)  # frames as they went
                or held.take_each(offsets)):  # single offsets, each once, all held: in C
            passed, missed = offsets, list[int]()
        else:
            passed, missed = [], []
            for offset in offsets:
                if held.pop(offset) is not None:
                    passed.append(offset)
                elif offset in consumer.stale:
                    consumer.stale.discard(offset)  # the root delivers it again
                else:
                    missed.append(offset)
        if passed:
            self._ack_upstream(relay_group, passed)
            self._dispatch(relay_group)
        if missed:
            raise ServiceError(Status.CONFLICT,
                               f"{len(missed)} offsets of {request.topic}/{group} are not held "
                               f"by this consumer: {', '.join(map(str, missed[:5]))}; "
                               f"{len(passed)} acknowledged")
        return {"cmd": "acked", "topic": request.topic, "count": len(passed)}

    def gone(self, queue: MessageQueue) -> None:
        """A client link closed: its consumers' messages go to the group's others here."""
        for relay_group in list(self.groups.values()):
            for consumer in [c for c in relay_group.consumers if c.link.queue is queue]:
                self._drop(relay_group, consumer)

    def _drop(self, relay_group: RelayGroup, consumer: LocalConsumer) -> None:
        relay_group.consumers.remove(consumer)
        for offset, held in sorted(consumer.held.items(), key=_first, reverse=True):
            message = held if isinstance(held, Relayed) else held.message_at(offset)
            # a copy: a frame for several groups shares its messages
            relay_group.pending.appendleft(replace(message, deliveries=message.deliveries + 1))
        consumer.held.clear()
        if relay_group.consumers:
            self._dispatch(relay_group)
            return
        # the last consumer here: the root gives what this server held to the others
        del self.groups[(relay_group.topic, relay_group.group)]
        upstream = self.upstream
        if upstream is not None and relay_group.subscribed:
            upstream.send({"cmd": "unconsume", "topic": relay_group.topic,
                           "group": relay_group.group})

    # -- the root's side ---------------------------------------------------------------

    def _subscribe(self, relay_group: RelayGroup) -> None:
        upstream = self.upstream
        if upstream is None or upstream.queue is None:
            return  # when the link comes up
        key = (relay_group.topic, relay_group.group)

        def answered(outcome: ReplyOrError) -> None:
            current = self.groups.get(key)
            if isinstance(outcome, ServiceError):
                if current is relay_group and outcome.status != Status.NO_REPLY:
                    log.warning("%s: consume %s/%s at root %s refused: %s (tried again "
                                "each second)", self.server.address, *key, upstream.root,
                                outcome.reason)
                return
            if current is relay_group and upstream is self.upstream:
                relay_group.subscribed = True

        upstream.request({"cmd": "consume", "topic": relay_group.topic,
                          "group": relay_group.group, "window": self.window,
                          "shared_frames": True, "cached": True}, answered)

    def _ack_upstream(self, relay_group: RelayGroup, offsets: Sequence[int]) -> None:
        upstream = self.upstream
        if upstream is None or upstream.queue is None:
            return  # lost with the link: the root delivers them again
        request: dict[str, Any] = {"cmd": "ack", "topic": relay_group.topic,
                                   "group": relay_group.group}
        if type(offsets) is range:  # consecutive: the first and the count
            request.update(offsets=offsets.start, count=len(offsets))
        elif type(first := pack_column(listed := list(offsets), counting=True)) is int:
            request.update(offsets=first, count=len(listed))
        else:
            request["offsets"] = listed
        upstream.send(request)

    def take(self, upstream: Upstream, obj: dict[str, Any]) -> None:
        """A ``messages`` frame from the root (on the current link; one from a link
        replaced meanwhile is dropped)."""
        if upstream is not self.upstream:
            return
        try:
            self._take(upstream, obj)
        except (KeyError, TypeError, ValueError) as exc:
            upstream.protocol_error(f"a bad messages frame from the root: {exc}")

    def _take(self, upstream: Upstream, obj: dict[str, Any]) -> None:
        """A ``messages`` frame from the root, for one group or (``groups``) for several
        groups of its topic at once; with its messages, or naming them (``cached``: a
        stretch the root sent on this link before, :mod:`mq.topics._stretch`)."""
        topic = obj["topic"]
        groups = obj.get("groups", [obj["group"]])
        if type(groups) is not list or not all(type(g) is str for g in groups):
            raise ValueError(f"groups {groups!r}")
        stretches = upstream.stretches
        if obj.get("cached") is True:
            first, count = obj["offsets"], obj["count"]
            if type(first) is not int or type(count) is not int:
                raise ValueError(f"a cached run at {first!r} of {count!r}")
            frames = [frame.part(start, n)
                      for frame, start, n in stretches.pieces(topic, first, count)]
            self.counts["named"] += count
        else:
            frame = RelayedFrame.check(obj)
            if frame.extends():
                stretches.add(topic, frame.offsets[0], frame.count, frame.size, frame)
            frames = [frame]
        for group in groups:
            relay_group = self.groups.get((topic, group))
            if relay_group is None:
                # no consumer here any more: the root takes them back for the group's others
                upstream.send({"cmd": "unconsume", "topic": topic, "group": group})
                continue
            for frame in frames:
                self.counts["relayed"] += frame.count
                if not relay_group.pending and (
                        consumer := relay_group.pick(frame.count)) is not None:
                    # taken whole: passed on as it came (see :mod:`._relay_groups`)
                    consumer.held.add(frame.offsets, frame)
                    consumer.link.send(frame.forward(group))
                    continue
                relay_group.pending.append(frame)  # whole, until a consumer has room
                self._dispatch(relay_group)

    def _dispatch(self, relay_group: RelayGroup) -> None:
        """Hand out what waits, a frame per consumer turn, while consumers have credits: a
        frame from the root as it came, or as much of it as the consumer has room for
        (the rest waits), and messages taken apart in frames made here."""
        pending = relay_group.pending
        while pending:
            consumer = relay_group.pick()
            if consumer is None:
                return
            head = pending[0]
            if type(head) is RelayedFrame:
                room = consumer.credits
                if room >= head.count:
                    part = pending.popleft()
                else:
                    part = head.part(0, room)
                    pending[0] = head.part(room, head.count - room)
                assert type(part) is RelayedFrame
                consumer.held.add(part.offsets, part)
                consumer.link.send(part.forward(relay_group.group))
                continue
            frame = take_frame(pending, consumer.credits, FRAME_BYTES, FRAME_TAIL)
            for message in frame:
                consumer.held.put(message.offset, message)
            consumer.link.send(relay_group.frame(frame))

    def upstream_up(self, upstream: Upstream) -> None:
        if upstream is not self.upstream:
            return
        for relay_group in self.groups.values():
            relay_group.subscribed = False
            self._subscribe(relay_group)
        self.run_waiting()

    def upstream_lost(self, upstream: Upstream, reason: str) -> None:
        """The root's link closed: what it had delivered here and was not acknowledged
        is the root's to deliver again (after the link comes up, or elsewhere)."""
        if upstream is not self.upstream:
            return
        self._forget_deliveries()

    def _forget_deliveries(self) -> None:
        for relay_group in self.groups.values():
            relay_group.subscribed = False
            relay_group.pending.clear()
            for consumer in relay_group.consumers:
                consumer.stale.update(consumer.held)
                consumer.held.clear()
                if len(consumer.stale) > 4 * self.window:
                    consumer.stale.clear()

    # -- the root changes --------------------------------------------------------------

    def root_changed(self) -> None:
        """Follow the cluster's root: a link to a new one, waiting requests run, and
        consumers sent to consume again when this server becomes the root or stops being
        it (see the module)."""
        root = self.cluster.root
        was_root = self._root == self.me
        self._root = root
        if self.upstream is not None and self.upstream.root != root:
            self.upstream.close()
            self.upstream = None
            self._forget_deliveries()
        if root is not None and root != self.me and self.upstream is None:
            self.upstream = Upstream(self, root)
            self.upstream.connect()
        if root == self.me and not was_root and self.groups:
            self._send_away({c.link.queue for g in self.groups.values()
                             for c in g.consumers}, root)
            self.groups.clear()
        elif was_root and root != self.me:
            shared = self.cluster.state.topics
            self._send_away({link.queue for link in self.server.links
                             if any(topic in shared for topic, _ in link.consumers)}, root)
        self.run_waiting()

    @staticmethod
    def _send_away(queues: set[MessageQueue], root: str | None) -> None:
        """Close client links consuming a shared topic here: each consumes again, the way
        the new root says, once it reconnects."""
        for queue in queues:
            queue.close(f"the cluster's root is now {root or 'unknown'}: consume again")

    def run_waiting(self) -> None:
        if self.cluster.root is None or not self.waiting:
            return
        if self.cluster.root != self.me and (self.upstream is None
                                             or self.upstream.queue is None):
            return
        waiting, self.waiting = self.waiting, []
        for held in waiting:
            held.again()

    def tick(self) -> None:
        """Each second: refuse what waited too long for a root, subscribe groups the root
        refused (a group its state did not hold yet), drain."""
        now = self.pump.now()
        late = [w for w in self.waiting if w.deadline <= now]
        if late:
            self.waiting = [w for w in self.waiting if w.deadline > now]
            for held in late:
                held.reply.refuse(ServiceError(
                    Status.UNAVAILABLE, f"{self.server.address}: cluster "
                                        f"{self.cluster.config.name!r} is not ready: no root "
                                        f"within {self.cluster.not_ready_wait} s"))
        self.run_waiting()
        for relay_group in self.groups.values():
            if not relay_group.subscribed:
                self._subscribe(relay_group)
        self.drain.run(self.upstream, self.cluster)

    def describe(self, topics: dict[str, Any]) -> None:
        """What ``query`` shows of the shared topics among ``topics`` (as the catalogue
        describes them): the root, and on a server that relays them, each group's
        consumers here and the messages they hold, and where the group is served from
        (its lag is the root's, not shown here)."""
        root = self.cluster.root
        for name, described in topics.items():
            if name not in self.cluster.state.topics:
                continue
            described["shared"] = True
            described["root"] = root
            if not self.takes(name):
                continue
            # its queue (what is stored, the groups' lag and dead letters) is the root's:
            # the figures here are this server's empty copy, not the topic's
            described["relayed"] = True
            for group, shown in described["groups"].items():
                relay_group = self.groups.get((name, group))
                consumers = [] if relay_group is None else relay_group.consumers
                shown["consumers"] = len(consumers)
                shown["inFlight"] = sum(len(c.held) for c in consumers)
                shown["status"] = (f"served from root {root}" if root is not None
                                   else "waiting for a root")

    def redirect_clients(self) -> None:
        """This server is going: each client link is told where to go next (the root, or
        else another server of the cluster linked to this one), before it closes."""
        root = self.cluster.root
        target = root if root is not None and root != self.me else next(
            (p.server.id for p in self.cluster.peers.values()
             if p.outgoing is not None and p.outgoing.agreed), None)
        if target is None:
            return
        message = encode({"cmd": "redirect", "server": f"{target}:{self.port}"})
        for link in self.server.links:
            link.send(message)

    def close(self) -> None:
        if self.root_changed in self.cluster.watchers:
            self.cluster.watchers.remove(self.root_changed)
        if self.upstream is not None:
            self.upstream.close()
            self.upstream = None
