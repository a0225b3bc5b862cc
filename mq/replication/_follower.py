"""A replica's side of replication: a topic's records copied from its master, as the master
stored them.

A :class:`Follower` keeps a link to the master's MQ server (reconnecting by itself). On
every connect, and every ``rescan`` seconds, it asks the master which topics it has
(``query``; after the first answer, with ``since``: the master answers in a few bytes
while no topic was added or dropped); a topic it does not hold yet is added to the
replica (a memory topic is not replicated), and it asks ``follow`` for each new one from
its own log's next offset;
each ``copies`` frame is checked and stored whole
(:meth:`~mq.storage._log.TopicLog.append_copies`: every checksum, offsets in line), made
durable as the replica's own durability says (``sync``: one fsync, in the group commit's
thread, for every frame that came before it; ``interval:S`` and ``none``: written,
fsynced later), and then acknowledged with ``copied {topic, next}``, which opens the
master's window for more. A frame that is damaged or out of line stores nothing and
closes the link with the reason (a protocol error); the next connect asks again from
what is stored. Each follow names the master epoch of the copy's last record; a master
whose history parts from the copy answers where, and the copy is cut back there (logged,
counted in ``counts["cut records"]``) and asked again from there
(:mod:`mq.storage._epochs`). A refusal (a replica ahead of its master, a memory topic)
is kept per topic (:attr:`Follower.refused`) and logged once.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import trio

from brokermgr import (
    DEFAULT_RETRY,
    Broker,
    BrokerLink,
    Push,
    PushTable,
    ReplyOrError,
    ServiceError,
    Status,
    check_epoch,
)
from brokermgr.tracking import ServerAddress
from pump import Timer

from ..storage._epochs import Epochs, kept
from ..storage._log import TopicLog
from ..storage._names import check_name
from ..storage._record import StoreError
from ..topics._filter import FilterError, TagFilter
from ..topics._requests import DEFAULT_FOLLOW_WINDOW

#: Seconds between a follower's questions for the master's topics, by default: a live
#: master is heard at least that often, which is how its slaves find it silent (the name
#: service's :data:`~brokermgr.QUIET`).
DEFAULT_RESCAN = 0.1
#: Seconds before a follow refused as unavailable (a member promoted that has not taken
#: over yet) is asked again, instead of at the next rescan.
UNAVAILABLE_RETRY = 0.01

log = logging.getLogger("rdvpump.mq")


class Replica(Protocol):
    """Where a follower keeps its copies: a replica server's topics (or plain logs)."""

    def replica_logs(self) -> Mapping[str, TopicLog]:
        """The logs of the topics held, by name."""

    def replica_log(self, name: str) -> tuple[TopicLog, bool] | None:
        """``name``'s log, and whether a consumer reads the topic here (the copies it
        stores are then kept in memory for it as well); None if it is not held."""

    def add_replica_topic(self, name: str, flags: list[str]) -> TopicLog | None:
        """A topic the master has and the replica not yet: its new log (None: it is not
        to be replicated)."""

    def replica_durable(self, name: str, then: Callable[[], None]) -> None:
        """Call ``then`` once the records just written to ``name``'s log are stored as
        the replica's durability says (``sync``: after an fsync that the copies written
        meanwhile share; otherwise now); never if that fsync fails."""

    def replica_stored(self, name: str) -> None:
        """Records were stored in ``name``'s log (its consumers may have more now)."""

    def replica_cut(self, name: str, offset: int) -> None:
        """``name``'s log lost its records from ``offset`` on (a tail its master's
        history replaced)."""

    def replica_positions(self, name: str, groups: Mapping[str, tuple[int, str | None]]
                          ) -> None:
        """The master's consume groups of ``name``: each one's position (every offset
        below it handled there) and filter."""

    def replica_committed(self, name: str, offset: int) -> None:
        """The master says that ``name``'s records below ``offset`` are committed (stored
        by enough replicas, under ``sync``)."""


class Logs:
    """A :class:`Replica` of plain logs: the topics given, no others."""

    def __init__(self, logs: Mapping[str, TopicLog]) -> None:
        self.logs = dict(logs)

    def replica_logs(self) -> Mapping[str, TopicLog]:
        return self.logs

    def replica_log(self, name: str) -> tuple[TopicLog, bool] | None:
        held = self.logs.get(name)
        return None if held is None else (held, True)

    def add_replica_topic(self, name: str, flags: list[str]) -> TopicLog | None:
        return None

    def replica_durable(self, name: str, then: Callable[[], None]) -> None:
        self.logs[name].sync()  # on the spot, each frame
        then()

    def replica_stored(self, name: str) -> None:
        pass

    def replica_cut(self, name: str, offset: int) -> None:
        pass

    def replica_positions(self, name: str, groups: Mapping[str, tuple[int, str | None]]
                          ) -> None:
        pass

    def replica_committed(self, name: str, offset: int) -> None:
        pass


class _MasterLink(BrokerLink):
    def __init__(self, follower: Follower, broker: Broker, master: ServerAddress,
                 retry: float) -> None:
        super().__init__(broker, master.broker_id, master.port,
                         name=f"replica of {master.address}", retry=retry)
        self.follower = follower
        #: What the master sends: copies of records, the groups' positions, the committed
        #: offset (each checked against what this replica follows, by its handler).
        self.pushes = PushTable(f"master {master.address}", {
            "copies": Push.raw(lambda obj: follower.copies(self, obj)),
            "positions": Push.raw(lambda obj: follower.positions(self, obj)),
            "committed": Push.raw(lambda obj: follower.committed(self, obj.get("topic"),
                                                                 obj.get("offset"))),
        }, refused=lambda error: log.warning("%s: %s", self.name, error), unknown="ignore")

    def opened(self) -> None:
        self.follower.heard()
        self.follower.following.clear()
        self.follower.followed.clear()
        self.follower.generation = None
        self.follower.scan()

    def pushed(self, obj: dict[str, Any]) -> None:
        self.follower.heard()  # whatever it says: the master is alive
        super().pushed(obj)

    def lost(self, reason: str) -> None:
        super().lost(reason)
        self.follower.lost()


class Follower:
    """Copies of the topics of the MQ server at ``master`` (``"broker:port"``), kept in
    ``replica`` (a :class:`Replica`, or a mapping of topic names to logs: those topics
    only), over a link from ``broker``."""

    def __init__(self, broker: Broker, master: str,
                 replica: Replica | Mapping[str, TopicLog], *,
                 window: int = DEFAULT_FOLLOW_WINDOW, retry: float = DEFAULT_RETRY,
                 rescan: float = DEFAULT_RESCAN, config: str | None = None) -> None:
        self.replica: Replica = Logs(replica) if isinstance(replica, Mapping) else replica
        #: this replica's broker id, told to the master
        self.name = broker.id
        self.window = window
        #: its group's configuration, compared by the master (None: not said)
        self.config = config
        self.master = ServerAddress(master)
        #: Why the master refused a topic, until it follows again; the topics asked for on
        #: the current link, and those the master agreed to on it.
        self.refused: dict[str, str] = {}
        self.following: set[str] = set()
        self.followed: set[str] = set()
        #: The master's topic set's generation as of its last full answer, while every
        #: topic of it is asked for (or not to be followed): each beat asks what changed
        #: since, and a master with no new topic answers in a few bytes.  None: the next
        #: question asks for every topic.
        self.generation: int | None = None
        #: Records stored, frames refused (damaged or out of line), records cut (a
        #: former master's tail), consume-group positions taken.
        self.counts = {"records": 0, "frames": 0, "refused frames": 0, "cut records": 0,
                       "positions": 0}
        #: Set (and renewed) after each frame stored, and each answer to a follow.
        self.changed = trio.Event()
        #: Set (and renewed) when the link to the master closes: the master may be gone,
        #: and its member asks the name service at once (:func:`~._member.keep_role`);
        #: how many times it closed.
        self.master_lost = trio.Event()
        self.losses = 0
        #: When the master last said anything (a frame, an answer): it is asked for its
        #: topics every ``rescan`` seconds, so a live master is heard at least that often.
        self.now = broker.pump.now
        self.last_heard = self.now()
        self.link = _MasterLink(self, broker, self.master, retry)
        self.link.connect()
        self._rescan = broker.pump.call_every(rescan, self.scan)
        self.pump = broker.pump
        self._soon: Timer | None = None

    def _scan_soon(self) -> None:
        self._soon = None
        self.scan()

    def scan(self) -> None:
        """Ask the master for its topics; follow those not followed yet."""
        if self.link.queue is not None:
            ask: dict[str, Any] = {"cmd": "query"}
            if self.generation is not None:
                ask["since"] = self.generation
            self.link.request(ask, self._topics)

    def _topics(self, outcome: ReplyOrError) -> None:
        if not isinstance(outcome, ServiceError) or outcome.status:
            self.heard()  # an answer (a lost link is not one)
        if isinstance(outcome, ServiceError):
            if outcome.status:
                log.warning("%s: query: %s", self.link.name, outcome.reason)
            return
        if outcome.get("unchanged") is True and self.generation is not None:
            return  # no topic added or dropped since the last answer
        topics = outcome.get("topics")
        if not isinstance(topics, dict):
            self.link.protocol_error("a query reply without its topics")
            return
        generation = outcome.get("generation")
        # (set before the topics are asked for: one whose asking fails unsets it)
        self.generation = generation if type(generation) is int else None
        held = self.replica.replica_logs()
        for name, described in sorted(topics.items()):
            if name in self.following:
                continue
            topic_log = held.get(name)
            if topic_log is None:
                flags = described.get("flags", []) if isinstance(described, dict) else []
                topic_log = self.replica.add_replica_topic(name, list(flags))
            if topic_log is None:
                continue
            self._ask(name, topic_log)

    def _ask(self, name: str, topic_log: TopicLog) -> None:
        """Ask the master to ship ``name`` from this copy's next offset."""
        self.following.add(name)  # asked: an answer or the link's loss comes
        start = topic_log.next_offset
        ask: dict[str, Any] = {"cmd": "follow", "topic": name, "start": start,
                               "window": self.window, "replica": self.name}
        if start > 0:
            ask["epoch"] = topic_log.epochs.epoch_at(start - 1)
        if self.config is not None:
            ask["config"] = self.config
        if not self.link.request(ask, functools.partial(self.answered, name)):
            self._ask_again(name)  # not sent (past the high-water mark)

    def _ask_again(self, topic: str) -> None:
        """``topic`` is asked for again at the next scan (which asks for every topic)."""
        self.following.discard(topic)
        self.generation = None

    def answered(self, topic: str, outcome: ReplyOrError) -> None:
        if isinstance(outcome, ServiceError):
            self._ask_again(topic)
            if outcome.status:
                self._refuse(topic, outcome.reason)
            if outcome.status == Status.UNAVAILABLE and self._soon is None:
                # a member promoted that has not taken over yet: asked again shortly
                self._soon = self.pump.call_later(UNAVAILABLE_RETRY, self._scan_soon)
            return
        held = self.replica.replica_log(topic)  # (one topic's: not every topic's)
        if held is None:
            self._ask_again(topic)
            return
        topic_log = held[0]
        try:
            if outcome.get("cmd") == "diverged":
                self._cut(topic, topic_log, outcome)
                return
            if "epochs" in outcome:
                topic_log.adopt_epochs(Epochs.parse(outcome["epochs"], "the master's epochs"))
        except ValueError as exc:
            self.link.protocol_error(f"{topic}: {exc}")
            return
        except StoreError as exc:
            self._ask_again(topic)
            self._refuse(topic, str(exc))
            return
        self.refused.pop(topic, None)
        self.followed.add(topic)
        self._changed()

    def _refuse(self, topic: str, reason: str) -> None:
        if self.refused.get(topic) != reason:
            log.error("%s: %s: %s", self.link.name, topic, reason)
            self.refused[topic] = reason
            self._changed()

    def _cut(self, topic: str, topic_log: TopicLog, answer: dict[str, Any]) -> None:
        """The master's history parts from this copy: cut it back (:mod:`mq.storage._epochs`) and
        ask again from there."""
        epoch, end = answer.get("epoch"), answer.get("end")
        if epoch is not None:
            check_epoch(epoch, "a diverged answer's epoch")
        if type(end) is not int:
            raise ValueError(f"a diverged answer with epoch {epoch!r} and end {end!r}")
        last = topic_log.next_offset
        keep = kept(topic_log.epochs, last, epoch, end)
        if keep >= last:
            raise ValueError(f"a diverged answer (epoch {epoch}, end {end}) that cuts "
                             f"nothing from {last}")
        written = topic_log.epochs.epoch_at(last - 1)
        cut = topic_log.truncate(keep)
        self.replica.replica_cut(topic, keep)
        self.counts["cut records"] += cut
        log.warning("%s: %s: cut %d records, offsets %d to %d (the last written under "
                    "epoch %d): the master's history parts from them at %d", self.link.name,
                    topic, cut, keep, last - 1, written, keep)
        self._ask(topic, topic_log)
        self._changed()

    def copies(self, link: _MasterLink, obj: dict[str, Any]) -> None:
        topic, first, count = obj.get("topic"), obj.get("first"), obj.get("count")
        held = self.replica.replica_log(topic) if isinstance(topic, str) else None
        topic_log, read_here = held if held is not None else (None, False)
        try:
            if topic_log is None:
                raise StoreError(f"copies of {topic!r}, which this replica does not follow")
            if type(first) is not int or type(count) is not int or count < 1:
                raise StoreError(f"first {first!r} and count {count!r}")
            if first != topic_log.next_offset:
                raise StoreError(f"{topic}: copies from {first}, this replica's next offset "
                                 f"is {topic_log.next_offset}")
            stored = topic_log.append_copies(obj.get("body", b""), keep=read_here)
            if stored != count:
                raise StoreError(f"{topic}: {stored} records in a frame of {count}")
        except StoreError as exc:
            self.counts["refused frames"] += 1
            log.error("%s: a bad copies frame: %s", link.name, exc)
            link.protocol_error(f"a bad copies frame: {exc}")
            return
        if "committed" in obj:  # delivered only up to what is durable here too
            self.committed(link, topic, obj["committed"])
        queue, end = link.queue, first + count

        def durable() -> None:
            """Acknowledged once durable, unless the link closed or opened again since
            (the next follow asks from what is stored)."""
            if link.queue is not queue or queue is None:
                return
            self.replica.replica_stored(str(topic))
            self.counts["records"] += count
            self.counts["frames"] += 1
            link.send({"cmd": "copied", "topic": topic, "next": end})
            self._changed()

        self.replica.replica_durable(str(topic), durable)

    def committed(self, link: _MasterLink, topic: Any, offset: Any) -> None:
        """The master's committed offset of a topic (sent with copies, or alone when it
        moves without them): kept by the replica."""
        if not isinstance(topic, str) or self.replica.replica_log(topic) is None or \
                type(offset) is not int or offset < 0:
            log.error("%s: a bad committed offset %r of %r", link.name, offset, topic)
            link.protocol_error(f"a bad committed offset {offset!r} of {topic!r}")
            return
        self.replica.replica_committed(topic, offset)

    def positions(self, link: _MasterLink, obj: dict[str, Any]) -> None:
        """The master's consume groups of a topic: kept by the replica."""
        topic, groups = obj.get("topic"), obj.get("groups")
        try:
            if not isinstance(topic, str) or self.replica.replica_log(topic) is None:
                raise ValueError(f"positions of {topic!r}, which this replica does not follow")
            if not isinstance(groups, dict):
                raise ValueError(f"{topic}: positions {groups!r} are not a mapping")
            parsed: dict[str, tuple[int, str | None]] = {}
            for name, value in groups.items():
                check_name(name, "group")
                if not (isinstance(value, list) and len(value) == 2 and type(value[0]) is int
                        and value[0] >= 0 and isinstance(value[1], str | None)):
                    raise ValueError(f"{topic}/{name}: {value!r} is not [floor, filter]")
                TagFilter.parse(value[1])
                parsed[name] = (value[0], value[1])
        except (ValueError, FilterError) as exc:
            log.error("%s: bad positions: %s", link.name, exc)
            link.protocol_error(f"bad positions: {exc}")
            return
        self.replica.replica_positions(topic, parsed)
        self.counts["positions"] += 1
        self._changed()

    def heard(self) -> None:
        self.last_heard = self.now()

    def lost(self) -> None:
        """The link to the master closed."""
        self.losses += 1
        self.master_lost.set()
        self.master_lost = trio.Event()

    @property
    def quiet(self) -> float:
        """Seconds since the master last said anything."""
        return self.now() - self.last_heard

    def _changed(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    @property
    def copying(self) -> bool:
        """Whether the master is shipping records on a live link (it agreed to a
        follow since the link last opened)."""
        return self.link.queue is not None and bool(self.followed)

    def close(self) -> None:
        self._rescan.cancel()
        if self._soon is not None:
            self._soon.cancel()
        self.link.close()
