"""A master's side of replication: the records of its topics shipped to the replicas that
follow them.

A replica (:class:`~._follower.Follower`) asks ``follow {topic, start, window}`` on a
link: from then on the master sends it that topic's records from ``start`` on, as they
are written, in ``copies {topic, first, count}`` frames whose body is the records as the
log stored them (checksums included: the replica checks each one and stores the bytes as
they are), never more than ``window`` bytes ahead of what the replica acknowledged
(``copied {topic, next}``).  The follow names the master epoch of the replica's last
record: if the replica's records up to ``start`` are not the master's (a former master's
tail, written after its successor's epoch began), the answer is ``diverged {topic, epoch,
end}`` and the replica cuts its copy back and asks again (the rule: :mod:`mq.storage._epochs`); the
answer that agrees (``following``) carries the master's epochs, which the replica keeps.
Every 0.1 s the master also sends each follower the positions of the topic's consume
groups that changed, with their filters (``positions {topic, groups: {name: [floor,
filter]}}``, a floor never past what was shipped to it): the replica declares the groups
it lacks and moves its own forward, so consumers that move to it after a failover are
given only what the master had not seen handled.
A replica with records of a newer epoch, or with more records of the master's own epoch
than the master, is refused with that reason (409): those are never cut.  A memory topic
is not replicated (400).  Members of a group compare their group's configuration (the
group, its cluster, the replication mode, ``min_insync``, ``insync_lag``, and a checksum
of them): a follow whose configuration differs from the master's is refused with both
(409) and logged once on each side.

What each replica acknowledged is kept.  A replica is *in sync* while it has
acknowledged everything written, or did so within the last ``insync_lag`` seconds
(:meth:`Shipper.in_sync`; ``query`` shows each replica's offset and whether it is).
Two modes: ``async`` acknowledges a produce once this server stored it; ``sync`` once
this server stored it and every replica in sync acknowledged it, at least
``min_insync`` of them (so any member in sync holds every acknowledged message: the
failover may promote any of them).  A replica that falls out of sync is waited for no
longer, and is no longer one the failover may choose.  Under
``sync`` with fewer replicas in sync than that, a produce is refused (503, the reason
says how many are in sync; nothing stored), and the produces waiting for replicas are
answered with that refusal (stored here, not acknowledged: they may or may not stay).
A link refused so is told once the topic has enough replicas in sync again (a
``writable {topic}`` push, no ``seq``): a producer tries again then, not at its next
pause (the member just promoted refuses until one of the others copies it).

Under ``sync`` the replicas waited for are also those the name service holds in sync
(:meth:`Shipper.confirm_insync`, from the group's answer): those are the ones a failover
may promote, and the name service learns that one fell out of sync only from this
master's next registration.  A master cut off from the name service therefore stops
acknowledging once such a replica falls behind, instead of going on without it while
the name service may still promote it (Kafka's rule: the in-sync set shrinks only once
the controller has it).

Under ``sync`` each topic also has a *committed* offset (Kafka's high watermark): the
records below it are stored by enough replicas by the same rule, so no failover cuts
them, and only those are delivered to consumers (:meth:`Catalogue.visible
<._catalogue.Catalogue.visible>`); otherwise a consumer could see a message that a
failover then cuts and another replaces at its offset.  The master moves it as its
replicas acknowledge and sends it to them with the records (``copies`` carries
``committed``) or, at the next tick, alone when no records carried it (``committed
{topic, offset}``);
a replica delivers to its own consumers only up to what its master said.  It lives in
memory: a restarted member delivers again once its replicas, or its master, confirm it.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from brokermgr import Deferred, GroupMember, ServiceError, Status, encode
from channels import MessageQueue
from pump import ConfigError

from ..storage._epochs import diverged
from ..storage._log import TopicLog
from ..storage._record import Record, encode_records
from ..topics._catalogue import Catalogue, TopicState
from ..topics._delivery import FRAME_BYTES, FRAME_MESSAGES, ClientLink
from ..topics._requests import Copied, Follow
from ..topics._topic import Log

_ANY_BODY = 1 << 62

log = logging.getLogger("rdvpump.mq")

@dataclass
class _Follower:
    link: ClientLink
    topic: str
    #: the next offset to ship, and the replica's next offset as it acknowledged
    next: int
    acked: int
    window: int
    #: bytes shipped and not acknowledged yet, by the first offset after them
    in_flight: list[tuple[int, int]]
    #: when it last had acknowledged everything written
    caught_up: float = 0.0
    #: the replica's broker id, if it said
    replica: str | None = None
    #: the consume groups' positions (and filters) it was last sent
    positions: dict[str, tuple[int, str | None]] = field(default_factory=dict)
    #: the committed offset it was last sent
    committed: int = 0


def _take(log: Log, offset: int, room: int, reach: int
          ) -> tuple[list[Any], int, int] | list[Record]:
    """What the next copies frame from ``offset`` holds: the pieces the log wrote,
    ``(chunks, count, bytes)`` (a follower that keeps up), or its records read back, to be
    encoded again as stored (the replica checks each body against its own maximum).
    About :data:`FRAME_BYTES` of records within ``room``; of large records, up to
    :data:`FRAME_MESSAGES` of them as far as ``reach`` (what the replica's end takes
    whole, as for deliveries) a record's worth short of it: a record is taken while fewer
    bytes came before it, so the last one ends within."""
    budget, wide = min(room, FRAME_BYTES), min(room, reach)
    written = log.written_since(offset, budget, 10_000)
    if written is not None:
        if written[1] < FRAME_MESSAGES and wide > budget:
            more = log.written_since(offset, wide - written[2] // written[1], FRAME_MESSAGES)
            if more is not None and more[1] > written[1]:
                return more
        return written
    records = log.read(offset, max_count=10_000, max_bytes=budget)
    if records and len(records) < FRAME_MESSAGES and wide > budget:
        each = sum(len(r.body) for r in records) // len(records)
        more_records = log.read(offset, max_count=FRAME_MESSAGES, max_bytes=wide - each)
        if len(more_records) > len(records):
            return more_records
    return records


#: The replication modes.
MODES = ("async", "sync")
#: Seconds a replica may stay behind and still count as in sync, by default.
DEFAULT_INSYNC_LAG = 10.0


@dataclass(slots=True)
class _WaitingReply:
    """A produce's reply waiting for replicas: sent once ``end`` is acknowledged by
    enough of them."""

    end: int
    reply: Deferred


class Shipper:
    """The followers of a server's topics, by link and topic."""

    def __init__(self, catalogue: Catalogue, *,
                 mode: str = "async", min_insync: int = 1,
                 insync_lag: float = DEFAULT_INSYNC_LAG,
                 dispatch: Callable[[TopicState], None] = lambda state: None) -> None:
        if mode not in MODES:
            raise ConfigError(f"replication is async or sync, not {mode!r}")
        if type(min_insync) is not int or min_insync < 1:
            raise ConfigError(f"min_insync is a positive integer, not {min_insync!r}")
        if not insync_lag > 0:
            raise ConfigError(f"insync_lag is a positive number of seconds, not "
                              f"{insync_lag!r}")
        self.catalogue = catalogue
        self.dispatch = dispatch
        self.now = catalogue.node.pump.now
        self.mode = mode
        catalogue.deliver_committed = mode == "sync"
        self.min_insync = min_insync
        self.insync_lag = insync_lag
        #: by the link's id and the topic
        self.followers: dict[tuple[str, str], _Follower] = {}
        #: the same, by topic and the link's id (what a produce looks at, whatever the
        #: other topics)
        self._of_topic: dict[str, dict[str, _Follower]] = {}
        #: produce replies waiting for replicas, by topic, in offset order
        self.waiting: dict[str, list[_WaitingReply]] = {}
        #: this master's epoch (each topic's log keeps where each epoch began)
        self.epoch = 0
        #: the replicas (broker ids) that the name service holds in sync with this master:
        #: the failover may promote any of them, so under ``sync`` each is waited for
        #: until the name service has dropped it (:meth:`confirm_insync`)
        self.confirmed: frozenset[str] = frozenset()
        #: the replicas refused for a configuration that differs (logged once each)
        self._config_refused: set[tuple[str | None, str]] = set()
        #: the links refused a produce for too few replicas in sync, or by a master not
        #: confirmed yet, by topic and queue: told (``writable``) once it takes them
        self._refused: dict[str, dict[MessageQueue, ClientLink]] = {}
        #: whether this server takes writes now (a replicated group's master, once the
        #: name service confirmed it): its :class:`~._member.GroupRole` says
        self.takes_writes: Callable[[], bool] = lambda: True
        #: Counters: frames and bytes shipped, replies held, refusals for too few in sync.
        self.counts = {"frames": 0, "bytes": 0, "held": 0, "refused": 0}

    def config(self, group: GroupMember) -> str:
        """A group's configuration as its members compare it: the group, its cluster and
        the replication settings (with a checksum of it all)."""
        text = (f"group={group.group} cluster={group.cluster} replication={self.mode} "
                f"min-insync={self.min_insync} insync-lag={self.insync_lag:g}")
        return f"{text} checksum={zlib.crc32(text.encode()):08x}"

    def check_config(self, request: Follow, group: GroupMember) -> None:
        """A replica whose group configuration differs from this master's is refused
        with both (409), and logged here once."""
        mine = self.config(group)
        if request.config is None or request.config == mine:
            return
        reason = (f"group {group.group}: this master's configuration is '{mine}', the "
                  f"replica's '{request.config}': members of a group must share one")
        if (request.replica, request.config) not in self._config_refused:
            self._config_refused.add((request.replica, request.config))
            log.error("%s refused: %s", request.replica or "a replica", reason)
        raise ServiceError(Status.CONFLICT, reason)

    def follow(self, link: ClientLink, request: Follow) -> dict[str, Any]:
        state = self.catalogue.get(request.topic)
        log = state.topic.log
        if not isinstance(log, TopicLog):
            raise ServiceError(Status.BAD_REQUEST,
                               f"topic {request.topic!r} is memory only: not replicated")
        try:
            answer = diverged(log.epochs, log.next_offset, self.epoch,
                              log.epochs.last if request.epoch is None else request.epoch,
                              request.start) if request.start > 0 else None
        except ValueError as exc:
            raise ServiceError(Status.CONFLICT, f"{request.topic}: {exc}") from None
        if answer is not None:
            return {"cmd": "diverged", "topic": request.topic, "epoch": answer[0],
                    "end": answer[1]}
        if request.start < log.start_offset:
            raise ServiceError(Status.CONFLICT,
                               f"{request.topic}: records before {log.start_offset} are gone "
                               f"(retention); the replica asked from {request.start}")
        self.followers[(link.caller_id, request.topic)] = self._of_topic.setdefault(
            request.topic, {})[link.caller_id] = _Follower(
            link, request.topic, request.start, request.start, request.window, [],
            self.now() if request.start == log.next_offset else -float("inf"),
            request.replica)
        self.ship(state)
        self._tell_writable(request.topic)  # a replica that starts at the end is in sync
        return {"cmd": "following", "topic": request.topic, "next": log.next_offset,
                "epoch": self.epoch, "epochs": log.epochs.to_json()}

    def copied(self, link: ClientLink, request: Copied) -> None:
        follower = self.followers.get((link.caller_id, request.topic))
        if follower is None:
            raise ServiceError(Status.CONFLICT,
                               f"this link does not follow {request.topic!r}")
        if not follower.acked <= request.next <= follower.next:
            raise ServiceError(Status.BAD_REQUEST,
                               f"{request.topic}: copied up to {request.next}, but "
                               f"{follower.acked}..{follower.next} was shipped")
        follower.acked = request.next
        follower.in_flight = [(end, n) for end, n in follower.in_flight if end > request.next]
        state = self.catalogue.topics.get(request.topic)
        if state is not None:
            if request.next >= state.topic.log.next_offset:
                follower.caught_up = self.now()
                self._tell_writable(request.topic)
            self._release(request.topic)
            self.ship(state)

    def ship(self, state: TopicState) -> None:
        """Send each follower of the topic what was written since, within its window."""
        name = state.topic.name
        log = state.topic.log
        # followers at one offset (the common case: each keeps up) are sent the same
        # frame: encoded once for all of them
        encoded: dict[tuple[int, int], tuple[Any, int]] = {}
        followers = list(self._of_topic.get(name, {}).values())
        if followers:
            log.want_written()  # what it writes next is sent as written
        for follower in followers:
            link = follower.link
            while follower.next < log.next_offset:
                room = follower.window - sum(n for _, n in follower.in_flight)
                if room <= 0:
                    break
                taken = _take(log, follower.next, room, link.frame_reach)
                if isinstance(taken, tuple):
                    chunks, count, size = taken
                else:
                    records = taken
                    if not records:
                        break
                    if records[0].offset != follower.next:
                        # damage in this log hides the records from next on: the replica
                        # cannot be given them (it keeps its offsets in line)
                        self.catalogue.failed(state, "replication",
                                              f"records from {follower.next} cannot be read")
                        break
                    if records[-1].offset != follower.next + len(records) - 1:
                        records = [r for i, r in enumerate(records)
                                   if r.offset == follower.next + i]
                    count = len(records)
                    chunks, size = None, 0
                key = (follower.next, count)
                if key not in encoded:
                    if chunks is None:
                        chunks, lengths = encode_records(records, _ANY_BODY)
                        size = sum(lengths)
                    encoded[key] = encode(
                        {"cmd": "copies", "topic": name, "first": follower.next,
                         "count": count, "committed": state.committed}, chunks), size
                frame, size = encoded[key]
                link.send(frame)
                follower.committed = state.committed
                follower.next += count
                follower.in_flight.append((follower.next, size))
                self.counts["frames"] += 1
                self.counts["bytes"] += size
        if followers:  # what every follower was sent is not kept as written for them
            log.release_written(min(follower.next for follower in followers))
            # a new follower's positions, those held back by what a follower had (see
            # ship_positions), and the committed offset it may be owed: at the next shipment
            self.catalogue.moved[name] = None

    def ship_positions(self, state: TopicState) -> None:
        """Send each follower of the topic its consume groups' positions that changed
        (each at most what was shipped to it), and their filters: a ``positions {topic,
        groups: {name: [floor, filter]}}`` frame; and the committed offset if no copies
        frame carried it since (called every 0.1 s for the topics that moved, and every
        second for every topic)."""
        name = state.topic.name
        groups = state.topic.groups
        for follower in self._of_topic.get(name, {}).values():
            changed = {}
            for group_name, group in groups.items():
                now = (min(group.floor, follower.next), state.filters.get(group_name))
                if follower.positions.get(group_name) != now:
                    changed[group_name] = now
            if changed:
                follower.positions.update(changed)
                follower.link.send(encode({"cmd": "positions", "topic": name, "groups": {
                    g: list(v) for g, v in changed.items()}}))
            if follower.committed != state.committed and self._replicated(name):
                # what no copies frame carried since (they carry it as they go)
                follower.committed = state.committed
                follower.link.send(encode({"cmd": "committed", "topic": name,
                                           "offset": state.committed}))

    def forget(self, link: ClientLink) -> None:
        topics = {k[1] for k in self.followers if k[0] == link.caller_id}
        for topic in topics:
            del self.followers[(link.caller_id, topic)]
            of_topic = self._of_topic[topic]
            del of_topic[link.caller_id]
            if not of_topic:
                del self._of_topic[topic]
        for topic in topics:
            self.check(topic)

    def forget_all(self) -> list[ClientLink]:
        """No followers any more (this server stepped down): their links, once each."""
        links = {id(f.link): f.link for f in self.followers.values()}
        self.followers.clear()
        self._of_topic.clear()
        self._refused.clear()  # no longer this server's writes: the route table says so
        for topic in list(self.waiting):
            self.check(topic)
        return list(links.values())

    # -- the in-sync set and sync acknowledgements ------------------------------------

    def in_sync(self, topic: str) -> list[str]:
        """The replicas of ``topic`` in sync, by their links' ids."""
        state = self.catalogue.topics.get(topic)
        if state is None or (isinstance(state.topic.log, TopicLog)
                             and not state.topic.log.segments):
            return []  # gone, or its log closed as the process stops (a last beat)
        written, now = state.topic.log.next_offset, self.now()
        return sorted(caller for caller, f in self._of_topic.get(topic, {}).items() if (
            f.acked >= written or now - f.caught_up <= self.insync_lag))

    def insync_replicas(self) -> list[str]:
        """The replicas (broker ids) in sync on every replicated topic of this server
        (as :meth:`in_sync` says of each; one pass over the topics, asked at every beat
        to the name service)."""
        left: dict[str, list[str]] = {}  # the replicas not found out of sync: their links
        for (caller, _), f in self.followers.items():
            if f.replica is not None and caller not in left.setdefault(f.replica, []):
                left[f.replica].append(caller)
        now, lag, of_topic = self.now(), self.insync_lag, self._of_topic
        replicas = list(left.items())
        for name, state in self.catalogue.topics.items():
            if not replicas:
                break
            if "memory" in state.flags:
                continue
            log = state.topic.log
            if isinstance(log, TopicLog) and not log.segments:
                return []  # its log closed as the process stops: none is in sync
            followers = of_topic.get(name)
            if followers is None:
                return []  # a topic no replica follows
            written = log.next_offset
            for replica, callers in replicas:
                for caller in callers:
                    g = followers.get(caller)
                    if g is not None and (g.acked >= written or now - g.caught_up <= lag):
                        break
                else:
                    del left[replica]
            if len(left) < len(replicas):
                replicas = list(left.items())
        return sorted(left)

    def describe(self, topic: str) -> dict[str, Any]:
        """Each replica's acknowledged next offset and whether it is in sync."""
        followers = self._of_topic.get(topic)
        if not followers:
            return {}
        sync = set(self.in_sync(topic))
        return {caller: {"next": f.acked, "inSync": caller in sync}
                for caller, f in sorted(followers.items())}

    def refusal(self, topic: str) -> ServiceError | None:
        """Under ``sync``, why a produce to ``topic`` cannot be acknowledged now (a memory
        topic is not replicated: never)."""
        if not self._replicated(topic) or self._enough_in_sync(topic):
            return None
        count = len(self.in_sync(topic))
        return ServiceError(Status.UNAVAILABLE,
                            f"{topic}: {count} replicas in sync, {self.min_insync} needed "
                            f"(replication sync)", topic=topic)

    def _enough_in_sync(self, topic: str) -> bool:
        """Whether at least ``min_insync`` replicas of ``topic`` are in sync: the count of
        :meth:`in_sync`, stopped once it is enough (the check of every produce)."""
        state = self.catalogue.topics.get(topic)
        log = None if state is None else state.topic.log
        if log is None or (isinstance(log, TopicLog) and not log.segments):
            return False
        written, need, now = log.next_offset, self.min_insync, None
        for f in self._of_topic.get(topic, {}).values():
            if f.acked < written:
                if now is None:
                    now = self.now()
                if now - f.caught_up > self.insync_lag:
                    continue
            need -= 1
            if need == 0:
                return True
        return False

    def refused(self, topic: str, link: ClientLink) -> None:
        """``link`` was refused a produce to ``topic`` (:meth:`refusal`, or this server is
        a master not confirmed yet): it is told once this server takes them, and under
        ``sync`` the topic has enough replicas in sync."""
        self._refused.setdefault(topic, {})[link.queue] = link

    def writable_again(self) -> None:
        """This server takes writes again (confirmed as its group's master): the links
        refused a produce are told, of each topic that takes them now."""
        for topic in list(self._refused):
            self._tell_writable(topic)

    def _tell_writable(self, topic: str) -> None:
        """The links refused a produce to ``topic`` are told (``writable {topic}``) if it
        takes them now."""
        if topic not in self._refused or not self.takes_writes() or (
                self.mode == "sync" and self.refusal(topic) is not None):
            return
        message = encode({"cmd": "writable", "topic": topic})
        for link in self._refused.pop(topic).values():
            link.send(message)

    def hold(self, deferred: Deferred) -> bool:
        """Under ``sync``, keep a produce's reply (``stored``) until enough replicas
        acknowledged it: True then (the caller does not reply)."""
        reply = deferred.reply
        if reply is None or reply.get("cmd") != "stored" or not self._replicated(
                reply["topic"]):
            return False
        topic, end = reply["topic"], reply["offset"] + reply["count"]
        for f in self._of_topic.get(topic, {}).values():
            if f.acked >= end:  # (a produce just written: no replica has it)
                if self._enough(topic, end):
                    return False
                break
        self.waiting.setdefault(topic, []).append(_WaitingReply(end, deferred))
        self.counts["held"] += 1
        return True

    def check(self, topic: str) -> None:
        """Release the replies held for ``topic`` that the replicas still in sync have
        all acknowledged, and answer the others with the refusal when too few replicas
        are in sync (called when a replica leaves, and every tick)."""
        if not self.waiting.get(topic):
            state = self.catalogue.topics.get(topic)
            if state is None or not self._replicated(topic) or (
                    state.committed >= state.topic.log.next_offset):
                return  # nothing held, nothing left to commit
        self._release(topic)
        held = self.waiting.get(topic)
        refused = self.refusal(topic) if held else None
        if held and refused is not None:
            del self.waiting[topic]
            error = ServiceError(Status.UNAVAILABLE,
                                 f"not acknowledged, stored here but it may or may not stay: "
                                 f"{refused.reason}", topic=topic)
            for waiting in held:
                self.counts["refused"] += 1
                waiting.reply.refuse(error)

    def _replicated(self, topic: str) -> bool:
        """Whether a produce to ``topic`` waits for replicas."""
        state = self.catalogue.topics.get(topic)
        return self.mode == "sync" and state is not None and "memory" not in state.flags

    def _enough(self, topic: str, end: int) -> bool:
        """Whether the replicas have ``topic`` up to ``end``: every one in sync (here, or
        as the name service holds it), and at least ``min_insync``."""
        return end <= self._stored_upto(topic)

    def _stored_upto(self, topic: str) -> int:
        """The offset below which enough replicas have ``topic`` (the rule of
        :meth:`_enough`); -1 while none counts (too few follow it, or one the name
        service holds in sync does not)."""
        acked = sorted((f.acked for f in self._of_topic.get(topic, {}).values()),
                       reverse=True)
        required = self._stored_by(topic)
        if len(acked) < self.min_insync or required is None:
            return -1
        return min([acked[self.min_insync - 1], *required])

    def confirm_insync(self, replicas: frozenset[str]) -> None:
        """The name service holds ``replicas`` in sync with this master (what a failover
        would choose from): waited for from now on, and no longer those it dropped."""
        if replicas != self.confirmed:
            self.confirmed = replicas
            for topic in list(self.catalogue.topics):
                self.check(topic)

    def _stored_by(self, topic: str) -> list[int] | None:
        """Under ``sync``, the next offsets of the replicas that must have a record before
        it counts as stored by enough of them: every replica in sync here, and every one
        the name service holds in sync (:attr:`confirmed`), which a failover may promote
        (so this master never acknowledges past one of those that it cannot reach: it
        waits until the name service dropped it).  None while one of those does not
        follow the topic."""
        insync = set(self.in_sync(topic))
        required = []
        named = set()
        for caller, f in self._of_topic.get(topic, {}).items():
            if caller in insync or f.replica in self.confirmed:
                required.append(f.acked)
                if f.replica is not None:
                    named.add(f.replica)
        if not self.confirmed <= named:
            return None
        return required

    def _commit(self, topic: str, upto: int) -> None:
        """Under ``sync``, move the topic's committed offset up to ``upto``, what enough
        replicas stored (:meth:`_stored_upto`), and deliver and tell the replicas what it
        opens."""
        state = self.catalogue.topics.get(topic)
        if state is None or not self._replicated(topic):
            return
        end = min(upto, state.topic.log.next_offset)
        if end > state.committed:
            state.committed = end
            self.catalogue.moved[topic] = None  # (if no copies frame carries it)
            self.dispatch(state)

    def _release(self, topic: str) -> None:
        """Commit what enough replicas stored, and answer the replies held up to it (in
        offset order)."""
        upto = self._stored_upto(topic)
        self._commit(topic, upto)
        held = self.waiting.get(topic)
        if not held:
            return
        answered = 0
        while answered < len(held) and held[answered].end <= upto:
            answered += 1
        released, held[:answered] = held[:answered], []
        if not held:
            del self.waiting[topic]
        for waiting in released:
            waiting.reply.answer()

    def forget_queue(self, queue: MessageQueue) -> None:
        """A client's link closed: its held replies are dropped, and it is told
        nothing."""
        for topic, held in list(self.waiting.items()):
            held[:] = [w for w in held if w.reply.queue is not queue]
            if not held:
                del self.waiting[topic]
        for topic, links in list(self._refused.items()):
            if links.pop(queue, None) is not None and not links:
                del self._refused[topic]
