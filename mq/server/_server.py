"""The MQ server role: topics and consume groups served on a broker's tracking port.

Commands (JSON, a binary body behind a NUL byte where there is one; every
request may carry a ``seq`` that its reply echoes):

* ``declare {topic, flags?, group?, filter?, start?, shared?}`` -- a topic (flags:
  ``memory``, ``rpc``, ``exclusive``, ``delete-on-exit``) and a group; the
  topic's default group is its name.  ``shared``: a topic of the server's cluster
  (:meth:`MqServer.join_cluster`), declared through its root on every server of it and
  answered once the root has it.
* ``produce {topic, producer, sequence, tag?, sizes?}`` + body -- one
  message, or ``len(sizes)`` messages cut from the body; the reply
  ``stored {offset, count, server}`` comes once they are stored as the
  durability policy says.  No topic is created by a produce (zbus).
* ``consume {topic, group?, window?}`` -- this link becomes a consumer of the
  group, with ``window`` credits; messages come while credits last, as
  ``messages {topic, group, offsets, sizes, tags, producers, sequences,
  deliveries, timestamps}`` + their bodies back to back, one frame for what
  one dispatch sends the link.  Each field is a column: a list with one entry
  a message, or one value for all of them (offsets and sequences: the first
  of consecutive values; :mod:`mq.topics._wire`).  ``unconsume`` ends it.
* ``ack {topic, group, offsets}`` -- any number of offsets at once: a list,
  or ``offsets`` the first of ``count`` consecutive ones.
* ``query {topic?}``, ``remove {topic, group?}``, ``empty {topic}``.
* ``follow {topic, start, window?}`` and ``copied {topic, next}`` -- a replica follows a
  topic's records from ``start`` on: :mod:`mq.replication._shipper`.
* RPC replies (``route``) and pushes (``receive``, ``push``): :mod:`._push`.
* A cluster's shared topics on a server that is not the root: :mod:`mq.cluster._relay` (its
  clients are told ``redirect {server}`` when the server stops).

Every request is parsed whole first (:mod:`mq.topics._requests`): a bad field is a 400
naming it and changes nothing.  Every error is replied, with a status and the
reason (404 for an unknown topic or group, 409 for an ack of offsets the
consumer does not hold), never dropped: a request without a ``seq`` (an ack)
gets its error all the same, with ``for`` (its command), its topic and its
group, so the client can tell whose it is.  A message that is not JSON closes
only its own link.  A failure inside one topic's work (dispatch, commit,
cursor save) is that topic's (or group's) error state, shown by ``query`` and
logged once; the broker and the other topics go on.  Every declare, remove,
first and last consumer updates the broker's ServerInfo, so trackers and
route tables follow.

This module holds the command table, the links, dead letters and the timers; the topics'
lifecycle (declare, query, remove, empty) is in :mod:`._topics`, ``produce`` in
:mod:`._produce`, the consumers' commands in :mod:`._consumers`.  The topics (on disk,
their groups and positions, their error states) are in :mod:`mq.topics._catalogue`; durability
and the group commit in :mod:`mq.topics._commit`; the links and the frames sent on them in
:mod:`mq.topics._delivery`; RPC replies and pushes in :mod:`._push`; records shipped to replicas
in :mod:`mq.replication._shipper`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from brokermgr import (
    QUIET,
    Call,
    Command,
    CommandTable,
    Deferred,
    GroupMember,
    GroupProgress,
    ServiceError,
    Status,
    encode,
    request_seq,
    require,
)
from brokermgr.tracking import TrackNode
from channels import MessageQueue
from pump import ConfigError, Repeating
from rdv import Right

from ..cluster._node import ClusterNode
from ..cluster._relay import Relay
from ..cluster._shared import declare_shared
from ..replication._follower import DEFAULT_RESCAN, Follower
from ..replication._member import GroupRole
from ..replication._shipper import DEFAULT_INSYNC_LAG, Shipper
from ..storage._files import lock_directory
from ..storage._log import DEFAULT_SEGMENT_BYTES, TopicLog
from ..storage._names import dead_letter_topic
from ..storage._record import Record
from ..topics._catalogue import FLAGS, Catalogue, TopicState
from ..topics._commit import Durability, GroupCommit
from ..topics._delivery import FRAME_ROOM, Links
from ..topics._requests import (
    AUDITED,
    MAX_ACK_RANGE,
    MAX_WINDOW,
    PARSERS,
    RIGHTS,
    Copied,
    Declare,
    Follow,
    error_names,
    translated,
)
from ..topics._topic import (
    DEFAULT_ACK_TIMEOUT,
    DEFAULT_MAX_DELIVERIES,
)
from ._consumers import ConsumerCommands
from ._produce import ProduceCommand
from ._push import Router
from ._topics import TopicCommands

log = logging.getLogger("rdvpump.mq")

COMMANDS = frozenset(PARSERS)
#: Commands answered only when the request asks (has a ``seq``); their errors always are.
ANSWERED_IF_ASKED = frozenset({"ack", "route", "push", "copied"})
#: Seconds between ack-timeout scans, cursor saves and ServerInfo depth updates.
TICK = 1.0
#: Topics a tick visits at once; more are spread over :data:`SLICES` calls a tick apart
#: by a tenth (about 1.6 us a topic: 10,000 stopped the pump for 16 ms each second).
TICK_TOPICS, SLICES = 1000, 10
#: Seconds between a master's shipments of its consume groups' positions to its replicas
#: (those of the topics whose positions moved; every topic's once a second besides):
#: after a failover, what a group acknowledged on the old master within about this long
#: before it died may be delivered again.
POSITIONS_EVERY = 0.1
__all__ = ["FLAGS", "MAX_ACK_RANGE", "MAX_WINDOW", "MqServer"]

class MqServer:
    """Topics of a server-role :class:`~brokermgr.tracking.TrackNode`, on its port.

    ``directory`` holds one folder per topic (None: memory only, every topic
    is a bounded ring).
    """

    commands = COMMANDS

    def __init__(self, node: TrackNode, directory: str | os.PathLike[str] | None, *,
                 durability: str | Durability = "sync",
                 ack_timeout: float = DEFAULT_ACK_TIMEOUT,
                 max_deliveries: int = DEFAULT_MAX_DELIVERIES,
                 segment_bytes: int = DEFAULT_SEGMENT_BYTES,
                 fsync_thread: bool = True, retain_bytes: int | None = None,
                 retain_age: float | None = None, replication: str = "async",
                 min_insync: int = 1, insync_lag: float = DEFAULT_INSYNC_LAG,
                 group_beat: float = DEFAULT_RESCAN, group_silence: float = QUIET) -> None:
        if node.server is None:
            raise ConfigError(f"{node.address} has no server role: an MQ server needs one")
        self.node = node
        self.pump = node.pump
        self.address = node.address.address
        self.directory = None if directory is None else Path(directory)
        self.durability = (durability if isinstance(durability, Durability)
                           else Durability.parse(durability))
        self.ack_timeout = ack_timeout
        self.max_deliveries = max_deliveries
        #: Largest body a produce may carry: what a delivery of it can carry.
        self.max_body = node.broker.manager.max_message_size - FRAME_ROOM
        self.segment_bytes = segment_bytes
        #: Retention per disk topic, checked every second: whole segments go past
        #: ``retain_bytes``, or older than ``retain_age`` s, read or not (as Kafka).
        self.retain_bytes = retain_bytes
        self.retain_age = retain_age
        self.links = Links()
        self._closed = False
        #: The cluster this server is one of (:meth:`join_cluster`), or None.
        self.cluster: ClusterNode | None = None
        #: Counters: stored, retries not stored again (:mod:`mq.topics._dedupe`), returned
        #: (``immediate`` with no consumer), delivered, acked, dead letters, errors replied.
        self.counts = {"stored": 0, "duplicates": 0, "returned": 0, "delivered": 0,
                       "acked": 0, "dead": 0, "errors": 0, "routed": 0, "unroutable": 0}
        #: The lock that keeps the directory this server's alone, before anything is read.
        self._lock = self._take_directory()
        self.commit = GroupCommit(self.pump, self.durability, owner=node.broker,
                                  release=self._committed, failed=self._commit_failed,
                                  committed=self._dispatch_durable, fsync_thread=fsync_thread)
        self.catalogue = Catalogue(node, self.directory, self.commit,
                                   segment_bytes=segment_bytes, ack_timeout=ack_timeout,
                                   max_deliveries=max_deliveries, dead=self._dead, tick=TICK)
        #: The replicas that follow this server's topics, and whether a produce waits for
        #: them (``replication``: async or sync; :mod:`mq.replication._shipper`).
        self.shipper = Shipper(self.catalogue, mode=replication, min_insync=min_insync,
                               insync_lag=insync_lag, dispatch=self._dispatch)
        #: Its place in a replicated group, and its side as a replica
        #: (:mod:`mq.replication._member`; ``group_beat``: its beat, ``group_silence``).
        self.role = GroupRole(node, self.catalogue, self.shipper, address=self.address,
                              dispatch=self._dispatch, beat=group_beat,
                              silence=group_silence)
        #: consume, unconsume, ack (:mod:`._consumers`); produce; declare, query, remove,
        #: empty (:mod:`._topics`)
        self.consumers, self.produce, self.topics = self._commands()
        #: Topics a produce wrote, dispatched after the turn's produces (:meth:`_dispatch_soon`).
        self._to_dispatch: dict[str, TopicState] = {}
        #: A cluster's shared topics' messages, relayed through its root (:mod:`mq.cluster._relay`).
        self.relay: Relay | None = None
        self.table = self._command_table(Router(self.links, self.counts, self.address))
        self._tick_timer, self._positions_timer = self._start()

    def _start(self) -> tuple[Repeating, Repeating]:
        """Its topics read from its directory, its commands on the node, its timers."""
        if self.directory is not None:
            try:
                self.catalogue.load()
            except BaseException:
                self._unlock()
                raise
        self.node.extend(self)
        self._round: list[TopicState] = []
        self._slice = 1  # the round starts at the tenth call: one tick in
        return (self.pump.call_every(TICK / SLICES, self._tick),
                self.pump.call_every(POSITIONS_EVERY, self._ship_positions))

    def _take_directory(self) -> int | None:
        if self.directory is None:
            return None
        self.directory.mkdir(parents=True, exist_ok=True)
        return lock_directory(self.directory)

    def _commands(self) -> tuple[ConsumerCommands, ProduceCommand, TopicCommands]:
        consumers = ConsumerCommands(self.node, self.catalogue, self.links, self.counts,
                                     self._dispatch, self.address)
        produce = ProduceCommand(
            self.catalogue, self.links, self.commit, self.shipper, self.role, self.counts,
            self._dispatch_soon, send=self.reply, max_body=self.max_body,
            address=self.address)
        topics = TopicCommands(self.node, self.catalogue, self.role, self.shipper, consumers,
                               address=self.address)
        return consumers, produce, topics

    def _command_table(self, router: Router) -> CommandTable:
        """Every command, parsed, checked for its right, audited if it is an admin
        action, and with the topics' errors as service errors."""
        handlers: dict[str, Callable[[Any, Call], dict[str, Any] | None]] = {
            "declare": self._declare, "produce": self.produce,
            "consume": self.consumers.consume, "unconsume": self.consumers.unconsume,
            "ack": self.consumers.ack, "query": self.topics.query,
            "remove": self.topics.remove, "empty": self.topics.empty, "route": router.route,
            "receive": router.receive, "push": router.push, "follow": self._follow,
            "copied": self._copied}
        return CommandTable("mq", {cmd: Command(PARSERS[cmd], translated(handler),
                                                right=RIGHTS.get(cmd), audit=AUDITED.get(cmd))
                                   for cmd, handler in handlers.items()}, names=error_names)

    # -- requests ----------------------------------------------------------------------

    def handle(self, queue: MessageQueue, obj: dict[str, Any]) -> None:
        """A request from a link, through the command table: parsed and checked whole
        first (a refused one changes nothing), then handled; every error is replied on
        the caller's link with the request's ``seq`` when it has one, else with ``for``
        (its command), its topic and group, so that a client can tell whose it is."""
        seq = request_seq(obj)
        cmd = obj.get("cmd")
        if self._closed:
            reply: dict[str, Any] | None = self.table.refusal(
                obj, ServiceError(Status.UNAVAILABLE, f"{self.address}: the MQ server is "
                                                      f"closed"),
                cmd if cmd in COMMANDS else None)
        else:
            reply = self.table.answer(obj, queue)
        if reply is not None and (seq is not None or reply["cmd"] == "error"
                                  or cmd not in ANSWERED_IF_ASKED):
            self.reply(queue, seq, reply)

    def handle_local(self, obj: dict[str, Any]) -> dict[str, Any]:
        """A request from this process (declare at start, say): the reply, or
        :class:`~brokermgr.ServiceError` with its status and reason."""
        cmd, command = self.table.command(obj)
        if cmd not in ("declare", "query", "remove", "empty"):
            raise ValueError(f"{cmd!r} is not a local request")
        reply = command.handle(self.table.parse(obj), Call(None, None, cmd))
        assert reply is not None
        return reply

    def defer(self, call: Call, reply: dict[str, Any] | None = None, **named: Any
              ) -> Deferred:
        """``call``'s reply, sent later by this server (:class:`~brokermgr.Deferred`);
        a refusal names ``named`` (the topic, the group) besides its reason."""
        return Deferred(call, self.reply, reply, **named)

    def reply(self, queue: MessageQueue | None, seq: int | None, reply: dict[str, Any]
              ) -> None:
        """Send ``reply`` on ``queue`` (with ``seq`` when there is one); errors counted."""
        if reply.get("cmd") == "error":
            self.counts["errors"] += 1
        if queue is None:
            return
        if seq is not None:
            reply["seq"] = seq
        self.links.of(queue).send(encode(reply))

    def join_cluster(self, cluster: ClusterNode) -> None:
        """This server is ``cluster``'s: a ``shared`` declare goes through its root, and
        the shared topics' messages too (:mod:`mq.cluster._relay`)."""
        self.cluster = cluster
        self.relay = self.produce.relay = self.consumers.relay = self.topics.relay = Relay(
            self, cluster)

    def _declare(self, request: Declare, call: Call) -> dict[str, Any] | None:
        if request.shared:
            declare_shared(self, request, call)
            return None  # answered once the cluster's root has it
        return self.topics.declare(request, call)

    def _committed(self, reply: Deferred) -> None:
        """A produce's reply after the group commit: now, or once replicas have it."""
        if self.shipper.mode != "sync" or not self.shipper.hold(reply):
            reply.answer()

    def _commit_failed(self, name: str, reason: str) -> None:
        state = self.catalogue.topics.get(name)
        if state is not None:
            self.catalogue.failed(state, "commit", reason)

    def _dispatch_durable(self, names: list[str]) -> None:
        """A group commit made these topics' writes durable: what it opens goes out."""
        topics = self.catalogue.topics
        for name in names:
            state = topics.get(name)
            if state is not None:
                self._dispatch(state)

    def _dispatch_soon(self, state: TopicState) -> None:
        """:meth:`_dispatch` once the produces being read now are answered: a producer
        has its reply before the messages go out (it sends its next batch while they do),
        and the produces of one read are dispatched at once."""
        if not self._to_dispatch:
            # posted from a task posted now: after the write of the reply, which the
            # produce's handler queues once it returns
            self.pump.post("mq dispatch", self._post_dispatch, owner=self.node.broker)
        self._to_dispatch[state.topic.name] = state

    def _post_dispatch(self) -> None:
        self.pump.post("mq dispatch", self._dispatch_produced, owner=self.node.broker)

    def _dispatch_produced(self) -> None:
        states, self._to_dispatch = self._to_dispatch, {}
        for name, state in states.items():
            if self.catalogue.topics.get(name) is state:  # (not removed meanwhile)
                self._dispatch(state)

    def _dispatch(self, state: TopicState) -> None:
        """Push what a topic's groups may have now; a failure stays with the topic (its
        error state, logged once), and the broker and the other topics go on."""
        try:
            sent = state.topic.dispatch(self.catalogue.visible(state))
        except Exception as exc:  # noqa: BLE001 - one topic's failure is that topic's
            self.catalogue.failed(state, "dispatch", f"{type(exc).__name__}: {exc}", exc)
            sent = 0
            self.links.clear_batches()
        else:
            if state.error is not None:
                self.catalogue.works_again(state)
        if sent:
            self.counts["delivered"] += sent
            self.links.flush()
        if self.shipper.followers:
            self.shipper.ship(state)

    # -- its replicated group: mq.replication._member -----------------------------------

    @property
    def group(self) -> GroupMember | None:
        """This server's place in a replicated group (its ServerInfo's), or None."""
        return self.role.group

    @property
    def follower(self) -> Follower | None:
        return self.role.follower

    def progress(self) -> GroupProgress:
        return self.role.progress()

    def confirm(self) -> None:
        self.role.confirm()

    def promote(self, epoch: int) -> None:
        self.role.promote(epoch)

    def demote(self, epoch: int) -> None:
        self.role.demote(epoch)

    def follow(self, master: str, **options: Any) -> Follower:
        return self.role.follow(master, **options)

    def replica_logs(self) -> dict[str, TopicLog]:
        return self.role.replica_logs()

    def _follow(self, request: Follow, call: Call) -> dict[str, Any]:
        if call.queue is None:
            raise ServiceError(Status.BAD_REQUEST, "follow needs a link to ship records on")
        # only a member of the group copies its records (and counts as in sync)
        require(call.queue, Right.MEMBER, request.replica or call.queue.remote_id,
                cmd="follow")
        self.role.not_a_slave("follow")
        if (group := self.group) is not None:
            self.shipper.check_config(request, group)
        return self.shipper.follow(self.links.of(call.queue), request)

    def _copied(self, request: Copied, call: Call) -> dict[str, Any] | None:
        if call.queue is None:
            raise ServiceError(Status.BAD_REQUEST, "copied comes from a replica's link")
        self.shipper.copied(self.links.of(call.queue), request)
        return {"cmd": "noted", "topic": request.topic, "next": request.next}

    # -- links -------------------------------------------------------------------------

    def drained(self, queue: MessageQueue) -> None:
        link = None if self._closed else self.links.get(queue)
        if link is not None:
            link.drained()

    def closed(self, queue: MessageQueue, reason: str) -> None:
        """A link closed: its consumers' messages go to the others; topics it declared
        with delete-on-exit go."""
        if self._closed:
            return
        link = self.links.drop(queue)
        if link is not None:
            self.shipper.forget(link)
            self.consumers.gone(link, queue)
        if self.relay is not None:
            self.relay.gone(queue)
        self.commit.forget(queue)
        self.shipper.forget_queue(queue)
        for state in list(self.catalogue.topics.values()):
            if state.creator is queue and "delete-on-exit" in state.flags:
                self.topics.drop(state)

    def _dead(self, topic: str, group: str, record: Record, deliveries: int) -> None:
        """A message out of deliveries goes to ``<topic>.<group>.DLQ`` (shortened with a
        hash when that is too long a name: :func:`~mq.storage._names.dead_letter_topic`)."""
        self.counts["dead"] += 1
        name = dead_letter_topic(topic, group)
        state = self.catalogue.topics.get(name)
        if state is None:
            flags = self.catalogue.topics[topic].flags & {"memory"}
            state = self.catalogue.open(name, frozenset(flags))
            state.topic.declare_group(name, start="beginning")
            state.filters[name] = None
            self.catalogue.save_meta(state)
        state.topic.publish([(record.tag, record.producer, record.sequence, record.body)])
        if not self.commit.written(name, state.topic.log):
            self._dispatch(state)
        log.warning("%s: %s/%s: offset %d went to %s after %d deliveries", self.address,
                    topic, group, record.offset, name, deliveries)

    # -- timers ------------------------------------------------------------------------

    def _tick(self) -> None:
        """Every :data:`TICK` s, each topic's timers, over :data:`SLICES` calls when it
        has more than :data:`TICK_TOPICS` topics (all at the first otherwise)."""
        at, self._slice = self._slice, (self._slice + 1) % SLICES
        if at == 0:
            if self.group is not None and self.node.server is not None:
                self.node.server.set_held(self.role.held())  # routes: how far a slave is
            if self.retain_bytes is not None or self.retain_age is not None:
                self.catalogue.retain(self.retain_bytes, self.retain_age)
            self._round = list(self.catalogue.topics.values())
        n = len(self._round)
        part = (self._round if at == 0 else []) if n <= TICK_TOPICS else \
            self._round[at * n // SLICES:(at + 1) * n // SLICES]
        now = self.pump.now()
        topics = self.catalogue.topics
        for state in part:
            if topics.get(state.topic.name) is not state:
                continue  # deleted since the round began
            self.catalogue.forget_quiet(state, now)
            try:
                expired = state.topic.expire(now)
            except Exception as exc:  # noqa: BLE001 - one topic's failure is that topic's
                self.catalogue.failed(state, "ack timeout scan", f"{type(exc).__name__}: {exc}",
                                   exc)
                expired = 0
            if expired:
                self._dispatch(state)
            if self.shipper.waiting or self.shipper.followers:
                self.shipper.check(state.topic.name)  # the in-sync set moves with time
            if self.shipper.followers:
                self.shipper.ship_positions(state)  # whatever moved unmarked, a second late
            self.catalogue.save_positions(state, later=True)
        if at == 0 and self.relay is not None:
            self.relay.tick()

    def _ship_positions(self) -> None:
        """Every :data:`POSITIONS_EVERY` s, the positions of the topics that moved since
        (:attr:`Catalogue.moved`) to their followers; :meth:`_tick` goes over every topic
        once a second besides."""
        moved = self.catalogue.moved
        if not moved:
            return
        names = list(moved) if self.shipper.followers else []
        moved.clear()
        topics = self.catalogue.topics
        for name in names:
            state = topics.get(name)
            if state is not None:
                self.shipper.ship_positions(state)

    def sync_all(self) -> None:
        """fsync every topic now, on the pump."""
        self.commit.sync_all()

    def close(self) -> None:
        """Save every position, fsync every topic, close the files."""
        if self._closed:
            return
        self._closed = True
        self._tick_timer.cancel()
        self._positions_timer.cancel()
        try:
            if self.relay is not None:
                self.relay.redirect_clients()  # a cluster's server: its clients go elsewhere
                self.relay.close()
            self.role.close()
            self.commit.close()
            self.sync_all()
            self.catalogue.close()
        finally:
            self._unlock()

    def _unlock(self) -> None:
        """Let the directory go (closing its descriptor drops the lock)."""
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None
