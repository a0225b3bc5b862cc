"""An MQ server's place in a replicated group: its role (master or slave) and epoch as
its ServerInfo says, whether the name service confirmed it as master, the moves between
roles (confirm, promote, demote, follow), and its side as a replica: the
:class:`~._follower.Replica` its follower stores the master's records, epochs and consume
groups into."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import Any

from brokermgr import GroupMember, GroupProgress, ServiceError, Status
from brokermgr.tracking import TrackNode

from ._catalogue import FLAGS, Catalogue, TopicState
from ._follower import Follower
from ._log import TopicLog
from ._replication import Shipper
from ._topic import Start

log = logging.getLogger("rdvpump.mq")


class GroupRole:
    """The group role of the MQ server at ``address`` (its topics in ``catalogue``, its
    replicas in ``shipper``); ``dispatch`` delivers what a topic's consumers may have."""

    def __init__(self, node: TrackNode, catalogue: Catalogue, shipper: Shipper, *,
                 address: str, dispatch: Callable[[TopicState], None]) -> None:
        self.node = node
        self.catalogue = catalogue
        self.shipper = shipper
        self.address = address
        self.dispatch = dispatch
        #: Copying from a master, while this server is a replica (:meth:`follow`).
        self.follower: Follower | None = None
        #: A group's master takes writes only once the name service confirmed it at its
        #: epoch (a former master restarting must not take any: :meth:`confirm`).
        self.confirmed = False
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
        return GroupProgress(self.held(), tuple(self.shipper.insync_replicas()))

    def held(self) -> int:
        """The records this server holds over its topics on disk."""
        return sum(state.topic.log.next_offset for state in self.catalogue.topics.values()
                   if "memory" not in state.flags)

    def not_a_slave(self, what: str) -> None:
        """A 503 naming the master for ``what`` (a write) at a slave, or at a master the
        name service has not confirmed."""
        group = self.group
        if group is not None and group.role == "slave":
            raise ServiceError(Status.UNAVAILABLE,
                               f"{self.address} is a slave of group {group.group}: {what} "
                               f"at its master")
        if group is not None and not self.confirmed:
            raise ServiceError(Status.UNAVAILABLE,
                               f"{self.address} is not confirmed as the master of group "
                               f"{group.group} at epoch {group.epoch} by the name service "
                               f"(yet)")

    def confirm(self) -> None:
        """The name service holds this server as its group's master at its epoch: it
        takes writes."""
        self.confirmed = True
        self.begin_epoch()

    def begin_epoch(self) -> None:
        """As its group's master: its epoch writes every topic from its next offset on."""
        group = self.group
        if group is not None and group.role == "master":
            for topic_log in self.replica_logs().values():
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
        self.follower = Follower(self.node.broker, master, self, **options)
        return self.follower

    def close(self) -> None:
        if self.follower is not None:
            self.follower.close()

    # -- the Replica a follower stores into ------------------------------------------------

    def replica_logs(self) -> dict[str, TopicLog]:
        return {name: state.topic.log for name, state in self.catalogue.topics.items()
                if isinstance(state.topic.log, TopicLog)}

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
            self.catalogue.save_positions(state)

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

    def replica_stored(self, name: str) -> None:
        state = self.catalogue.topics.get(name)
        if state is not None:
            self.dispatch(state)
