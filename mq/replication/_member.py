"""An MQ server's place in a replicated group: its role (master or slave) and epoch as
its ServerInfo says, whether the name service confirmed it as master, the moves between
roles (confirm, promote, demote, follow), and its side as a replica: the
:class:`~._follower.Replica` its follower stores the master's records, epochs and consume
groups into; :func:`keep_role`, the loop that keeps a server's role as the name service
holds it (``broker run --group`` runs it)."""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import trio

from brokermgr import (
    QUIET,
    EpochError,
    GroupMember,
    GroupProgress,
    NameClient,
    ServiceError,
    Status,
    next_epoch,
)
from brokermgr.tracking import TrackNode
from pump import ConfigError

from ..storage._log import TopicLog
from ..topics._catalogue import FLAGS, Catalogue, TopicState
from ..topics._group import Start
from ._follower import DEFAULT_RESCAN, Follower
from ._shipper import Shipper

log = logging.getLogger("rdvpump.mq")


class GroupRole:
    """The group role of the MQ server at ``address`` (its topics in ``catalogue``, its
    replicas in ``shipper``); ``dispatch`` delivers what a topic's consumers may have."""

    def __init__(self, node: TrackNode, catalogue: Catalogue, shipper: Shipper, *,
                 address: str, dispatch: Callable[[TopicState], None],
                 beat: float = DEFAULT_RESCAN, silence: float = QUIET) -> None:
        if not 0 < beat < float("inf") or not silence >= 2 * beat:
            raise ConfigError(f"a group member asks its master every {beat:g} s; its "
                              f"silence must be at least two of those, got {silence:g} s")
        self.node = node
        #: Seconds between this member's questions to its master, as a slave (its
        #: master's answers are the beats it hears), and the silence after which the
        #: master counts as gone to it: it says so to the name service at once, and, once
        #: promoted, takes over from a master quiet for as long, its link still open (hung
        #: or cut off: the name service found it so, its silence witnessed by this
        #: member).  Safe however short: a ``sync`` master acknowledges nothing that a
        #: member it reported in sync has not stored, and this member stores nothing from
        #: it once promoted.
        self.beat = beat
        self.silence = silence
        self.catalogue = catalogue
        self.shipper = shipper
        self.address = address
        self.dispatch = dispatch
        #: Copying from a master, while this server is a replica (:meth:`follow`).
        self.follower: Follower | None = None
        #: A group's master takes writes only once the name service confirmed it at its
        #: epoch (a former master restarting must not take any: :meth:`confirm`).
        self.confirmed = False
        #: The server closed its topics (its process stops): it takes no role from now on.
        self.closed = False
        shipper.takes_writes = self.takes_writes
        group = self.group
        if group is not None and group.role == "master":
            self.shipper.epoch = group.epoch

    @property
    def group(self) -> GroupMember | None:
        """This server's place in a replicated group (its ServerInfo's), or None."""
        return None if self.node.server is None else self.node.server.group

    def progress(self) -> GroupProgress:
        """How far this server's copy is, for the name service: the records it holds
        over its topics on disk, and (as a master) its replicas in sync."""
        group, follower = self.group, self.follower
        quiet = (round(follower.quiet, 3) if follower is not None and group is not None
                 and group.role == "slave" else None)
        return GroupProgress(self.held(), tuple(self.shipper.insync_replicas()), quiet,
                             None if self.silence == QUIET else self.silence)

    def held(self) -> int:
        """The records this server holds over its topics on disk (a topic whose log is
        closed, as the process stops and a last beat goes out, counts for none)."""
        return sum(log.next_offset for state in list(self.catalogue.topics.values())
                   if "memory" not in state.flags
                   and not (isinstance(log := state.topic.log, TopicLog) and not log.segments))

    def not_a_slave(self, what: str) -> None:
        """A 503 naming the master for ``what`` (a write) at a slave, or at a master the
        name service has not confirmed."""
        group = self.group
        if group is not None and group.role == "slave":
            follower = self.follower
            queue = None if follower is None else follower.link.queue
            where = None if queue is None else queue.peer_address
            master = ("its master (not known here yet)" if follower is None
                      else f"its master, {follower.master}"
                      + ("" if where is None else f" (at {where})"))
            raise ServiceError(Status.UNAVAILABLE,
                               f"{self.address} is a slave of group {group.group}: {what} "
                               f"at {master}",
                               **({} if follower is None else {"master": str(follower.master)}),
                               **({} if where is None else {"master_at": where}))
        if group is not None and not self.confirmed:
            raise ServiceError(Status.UNAVAILABLE,
                               f"{self.address} is not confirmed as the master of group "
                               f"{group.group} at epoch {group.epoch} by the name service "
                               f"(yet)")

    def takes_writes(self) -> bool:
        """Whether this server takes writes now: in no group, or its master confirmed."""
        group = self.group
        return group is None or (group.role == "master" and self.confirmed)

    @property
    def unconfirmed_master(self) -> bool:
        """Its group's master, not confirmed by the name service yet (a former master
        restarting, until the name service answers)."""
        group = self.group
        return group is not None and group.role == "master" and not self.confirmed

    def confirm(self) -> None:
        """The name service holds this server as its group's master at its epoch: it
        takes writes (and tells the links it refused)."""
        self.confirmed = True
        self.begin_epoch()
        self.shipper.writable_again()

    def begin_epoch(self, topic: str | None = None) -> None:
        """As its group's master: its epoch writes every topic (or ``topic``, one just
        created) from its next offset on."""
        group = self.group
        if group is not None and group.role == "master":
            if topic is None:
                logs = list(self.replica_logs().values())
            else:
                held = self.replica_log(topic)
                logs = [] if held is None else [held[0]]
            for topic_log in logs:
                topic_log.begin_epoch(group.epoch)

    def promote(self, epoch: int) -> None:
        """This slave is its group's master from ``epoch`` on: it stops copying, takes
        writes, and says so in its ServerInfo."""
        group = self.group
        assert group is not None and self.node.server is not None
        if self.follower is not None:
            self.follower.close()
            self.follower = None
        self.node.server.set_group(dataclasses.replace(group, role="master", epoch=epoch))
        self.confirmed = True
        self.shipper.epoch = epoch
        self.begin_epoch()
        for state in self.catalogue.topics.values():
            state.recent = None  # built again from the records copied
        self.shipper.writable_again()
        log.warning("%s: master of group %s at epoch %d", self.address, group.group, epoch)

    def demote(self, epoch: int) -> None:
        """Another member is the master at ``epoch``: this one takes no writes from now
        on (it copies the master once told where)."""
        group = self.group
        assert group is not None and self.node.server is not None
        if group.role == "master":
            log.warning("%s: no longer master of group %s: epoch %d is another's",
                        self.address, group.group, epoch)
        self.confirmed = False
        self.node.server.set_group(dataclasses.replace(group, role="slave", epoch=epoch))
        for link in self.shipper.forget_all():  # its replicas: free to take over
            link.queue.close(f"{self.address} is no longer the master of group "
                             f"{group.group}: epoch {epoch} is another's")

    def follow(self, master: str, **options: Any) -> Follower:
        """Copy the topics of the master at ``master`` (``"broker:port"``) into this
        server's (options: :class:`~._follower.Follower`'s); the follower it was copying
        from before, if any, stops."""
        if self.follower is not None:
            self.follower.close()
        group = self.group
        if group is not None:
            options.setdefault("config", self.shipper.config(group))
        options.setdefault("rescan", self.beat)
        self.follower = Follower(self.node.broker, master, self, **options)
        return self.follower

    def close(self) -> None:
        self.closed = True
        if self.follower is not None:
            self.follower.close()
            self.follower = None

    # -- the Replica a follower stores into ------------------------------------------------

    def replica_logs(self) -> dict[str, TopicLog]:
        return {name: state.topic.log for name, state in self.catalogue.topics.items()
                if isinstance(state.topic.log, TopicLog)}

    def replica_log(self, name: str) -> tuple[TopicLog, bool] | None:
        state = self.catalogue.topics.get(name)
        if state is None or not isinstance(state.topic.log, TopicLog):
            return None
        return state.topic.log, state.topic.attached > 0

    def add_replica_topic(self, name: str, flags: list[str]) -> TopicLog | None:
        if "memory" in flags or self.catalogue.directory is None:
            return None
        state = self.catalogue.open(name, frozenset(f for f in flags if f in FLAGS))
        state.topic.declare_group(name, start="beginning")
        state.filters[name] = None
        self.catalogue.save_meta(state)
        self.catalogue.save_positions(state)
        self.node.declare_group(name, name)
        assert isinstance(state.topic.log, TopicLog)
        return state.topic.log

    def replica_cut(self, name: str, offset: int) -> None:
        state = self.catalogue.topics.get(name)
        if state is not None:
            state.topic.cut(offset)
            state.recent = None
            state.committed = min(state.committed, offset)
            self.catalogue.save_positions(state)

    def replica_committed(self, name: str, offset: int) -> None:
        state = self.catalogue.topics.get(name)
        if state is not None and offset > state.committed:
            state.committed = offset
            self.dispatch(state)

    def replica_positions(self, name: str, groups: Mapping[str, tuple[int, str | None]]
                          ) -> None:
        state = self.catalogue.topics.get(name)
        if state is None:
            return
        declared = False
        for group, (floor, filter_) in groups.items():
            if group not in state.topic.groups or state.filters.get(group) != filter_:
                state.topic.declare_group(group, filter=filter_, start=Start("offset", floor))
                state.filters[group] = filter_
                self.node.declare_group(name, group, filter=filter_)
                declared = True
            state.topic.advance(group, floor)
        if declared:
            self.catalogue.save_meta(state)
        self.catalogue.save_positions(state)

    def replica_durable(self, name: str, then: Callable[[], None]) -> None:
        state = self.catalogue.topics.get(name)
        if state is not None:
            self.catalogue.commit.after(name, state.topic.log, then)

    def replica_stored(self, name: str) -> None:
        state = self.catalogue.topics.get(name)
        if state is not None:
            self.dispatch(state)


class HasRole(Protocol):
    """An MQ server that may be a replicated group's member (:class:`~mq.MqServer`)."""

    @property
    def role(self) -> GroupRole: ...


#: Seconds between a group member's questions to the name service about its group.
GROUP_POLL = 0.1
#: After a slave's link to its master closed (a master killed: the name service sees its
#: own link close at the same moment, and promotes), the member asks every
#: :data:`FAST_POLL` seconds for :data:`FAST_FOR` seconds, not every :data:`GROUP_POLL`.
FAST_POLL = 0.005
FAST_FOR = 0.5
#: Seconds (at random up to twice as long) that a member of a group whose several name
#: services name no master by a majority waits before it claims the next epoch itself.
CLAIM_AFTER = 2.0

def _decide(views: list[dict[str, Any]], managers: int, me: str
            ) -> tuple[str | None, int, bool, int, int, frozenset[str]]:
    """What the name services that answered say of a group: the master and epoch that
    most of them name, whether that is a majority of all ``managers`` (each names one
    master per epoch, so two members never both have a majority for one epoch), the
    newest epoch any names, the newest any names for another member or for none, and
    the members in sync as the views naming ``me`` master hold them (each of them may
    promote one)."""
    votes = Counter((v.get("master"), v.get("epoch") or 0) for v in views)
    (master, epoch), count = max(votes.items(), key=lambda kv: (kv[1], kv[0][1]),
                                 default=((None, 0), 0))
    newest = max((v.get("epoch") or 0 for v in views), default=0)
    others = max((v.get("epoch") or 0 for v in views if v.get("master") != me), default=0)
    insync = frozenset(m for v in views if v.get("master") == me
                       and (v.get("epoch") or 0) == epoch for m in v.get("insync") or ())
    return master, epoch, count > managers // 2, newest, others, insync - {me}


async def keep_role(server: HasRole, names: NameClient) -> None:
    """A group member's role, as the name services hold it (asked every
    :data:`GROUP_POLL` seconds; with several, what a majority of them say): a master
    takes writes once confirmed at its epoch; a member promoted takes over once the old
    master no longer ships it records (its link gone, or the old master stepped down: it
    closes its replicas' links and refuses to be followed, or it said nothing for the
    member's :attr:`GroupRole.silence`: hung, its link open); a member whose group has
    another master at its epoch or a newer one is a slave and copies that master; a master that any
    name service says the group left for a newer epoch steps down.  A master registers
    again as soon as its in-sync set changes, not at its next heartbeat.

    Several name services decide each on its own and may name different masters; when
    no majority names one for :data:`CLAIM_AFTER` seconds (jittered), a member claims
    the next epoch at each (:meth:`~brokermgr.NameClient.claim`): a name service grants
    one member per epoch, and only one that holds every acknowledged message as far as
    it knows, so the members granted by a majority are one, and it is safe.

    A server that closed (its process stopping: its topics closed while it unregisters)
    ends this loop, even with an answer under way that would change its role."""
    keeper = _RoleKeeper(server.role, names)
    while not keeper.role.closed:
        if not await keeper.step():
            await keeper.until_next()


class _RoleKeeper:
    """:func:`keep_role`'s state between two questions to the name services."""

    def __init__(self, role: GroupRole, names: NameClient) -> None:
        self.role = role
        self.names = names
        self.port = role.node.address.port
        self.me = role.node.broker.id
        self.random = role.node.broker.pump.random
        self.following: str | None = None
        self.insync = role.progress().insync
        self.claim_at: float | None = None
        self.witnessed = False  # this slave told the name service its master is quiet
        #: until when it asks every FAST_POLL (its link to its master closed)
        self.fast_until = -float("inf")
        #: the follower and its count of lost links when last looked at
        self.losses: tuple[Follower | None, int] = (None, 0)

    async def until_next(self) -> None:
        """Until the next question: :data:`GROUP_POLL` seconds, or at once when the link
        to its master closes (or closed while it asked), and then every
        :data:`FAST_POLL` for :data:`FAST_FOR`."""
        follower = self.role.follower
        now = (follower, 0 if follower is None else follower.losses)
        if now[0] is self.losses[0] and now[1] != self.losses[1]:
            self.fast_until = trio.current_time() + FAST_FOR  # lost during the question
        self.losses = now
        if trio.current_time() < self.fast_until:
            await trio.sleep(FAST_POLL)
            return
        with trio.move_on_after(GROUP_POLL):
            if follower is None:
                await trio.sleep_forever()
            await follower.master_lost.wait()
            self.losses = (follower, follower.losses)
            self.fast_until = trio.current_time() + FAST_FOR

    async def step(self) -> bool:
        """Ask the name services once and act on what they say: True to ask again at
        once (a claim granted, a promotion to confirm)."""
        role, names, me = self.role, self.names, self.me
        mine = role.group
        assert mine is not None
        self._say_changes(mine)
        views = await names.group_views(mine.group)
        if role.closed:
            return False  # closed while it asked: it takes no role now (its logs are shut)
        if not views:
            log.info("group %s: no answer from the name service", mine.group)
        master, epoch, decided, newest, others, named_insync = _decide(
            views, len(names.links), me)
        # no majority, or one that names this member at an epoch older than its own: the
        # name services saw different things; a claim of a newer epoch brings them to one
        stuck = not decided or (master == me and epoch < mine.epoch)
        if await self._claim(mine, stuck and len(names.links) > 1 and bool(views), newest):
            return True  # asked again at once: now a majority names it
        if role.closed:
            return False
        if decided and master == me and not stuck:
            # the members a failover would choose from: this master waits for each
            role.shipper.confirm_insync(named_insync)
            if self._lead(mine, epoch):
                return True  # confirmed by the next answer, asked at once
        elif mine.role == "master" and others > mine.epoch:
            role.demote(others)  # the group moved on without this master: fenced
            names.register_now()
        if decided and isinstance(master, str) and master != me:
            self._follow(mine, master, epoch)
        return False

    def _say_changes(self, mine: GroupMember) -> None:
        """Register at once, not at the next heartbeat, when a master's in-sync set
        changed (the failover's choice follows it) or a slave found its master quiet."""
        role = self.role
        if mine.role == "master" and (now := role.progress().insync) != self.insync:
            self.insync = now
            self.names.register_now()
        quiet = mine.role == "slave" and role.follower is not None and (
            role.follower.quiet >= role.silence)
        if quiet and not self.witnessed:
            self.names.register_now()  # its master's silence, witnessed: said at once
        self.witnessed = quiet

    async def _claim(self, mine: GroupMember, stuck: bool, newest: int) -> bool:
        """While the name services stay split for :data:`CLAIM_AFTER` seconds (jittered),
        claim the next epoch at each: True when a majority granted it."""
        if not stuck:
            self.claim_at = None
            return False
        now = trio.current_time()
        if self.claim_at is None:
            self.claim_at = now + CLAIM_AFTER * (1 + self.random.random())
            return False
        if now < self.claim_at:
            return False
        self.claim_at = None
        try:
            claimed = next_epoch(newest)
        except EpochError as exc:  # no epoch left to claim: the group stays as it is
            log.error("group %s: %s cannot claim an epoch: %s", mine.group, self.me, exc)
            return False
        links = len(self.names.links)
        granted = await self.names.claim(mine.group, self.me, claimed)
        if granted > links // 2:
            log.warning("group %s: %s claimed epoch %d; %d of %d name services granted it",
                        mine.group, self.me, claimed, granted, links)
            return True
        return False

    def _lead(self, mine: GroupMember, epoch: int) -> bool:
        """A majority names this member master at ``epoch``: a slave takes over once its
        old master no longer ships it records (True: asked again at once); a master at a
        newer epoch (a restart) is promoted, at its own epoch confirmed."""
        role = self.role
        if mine.role == "slave" and epoch > mine.epoch and (
                role.follower is None or not role.follower.copying
                or role.follower.quiet > role.silence):
            role.promote(epoch)
            self.following = None
            self.names.register_now()
            return True
        if mine.role == "master" and epoch > mine.epoch:
            role.promote(epoch)  # back as master at a newer epoch (a restart)
            self.names.register_now()
        elif mine.role == "master" and epoch == mine.epoch:
            role.confirm()
        return False

    def _follow(self, mine: GroupMember, master: str, epoch: int) -> None:
        """A majority names another master: this member is its slave, whatever epoch a
        minority may have seen since."""
        role = self.role
        if mine.role == "master" or epoch != mine.epoch:
            role.demote(epoch)
            self.names.register_now()
        if master != self.following:
            log.info("group %s: %s follows master %s", mine.group, self.me, master)
            role.follow(f"{master}:{self.port}")
            self.following = master
