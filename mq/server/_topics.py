"""The commands of a topic's lifecycle on an MQ server: ``declare``, ``query``,
``remove`` and ``empty`` (a ``shared`` declare goes through the cluster's root first:
:mod:`mq.cluster._shared`)."""

from __future__ import annotations

from typing import Any

from brokermgr import Call, ServiceError, Status
from brokermgr.tracking import TrackNode

from ..cluster._relay import Relay
from ..replication._member import GroupRole
from ..replication._shipper import Shipper
from ..storage._names import disk_name
from ..storage._record import StoreError
from ..topics._catalogue import Catalogue, TopicState
from ..topics._requests import Declare, Empty, Query, Remove
from ._consumers import ConsumerCommands

__all__ = ["TopicCommands"]


class TopicCommands:
    """``declare``, ``query``, ``remove`` and ``empty`` on ``catalogue``'s topics; a
    declare or a removal is told to ``node`` (the server's ServerInfo, which trackers
    and route tables follow)."""

    def __init__(self, node: TrackNode, catalogue: Catalogue, role: GroupRole,
                 shipper: Shipper, consumers: ConsumerCommands, *, address: str) -> None:
        self.node = node
        self.catalogue = catalogue
        self.role = role
        self.shipper = shipper
        self.consumers = consumers
        self.address = address
        #: A cluster's server: ``query`` describes its shared topics too.
        self.relay: Relay | None = None

    def declare(self, request: Declare, call: Call) -> dict[str, Any]:
        """A topic (and a group of it) of this server: created, or a group added, or a
        group's filter changed; declaring what exists changes nothing.  What a failed
        write of its metadata changed is undone."""
        name = request.topic
        group = request.group or name
        state = self.catalogue.topics.get(name)
        if state is None and disk_name(name) in self.catalogue.unavailable:
            raise ServiceError(Status.UNAVAILABLE, f"topic {name!r} cannot be opened: "
                               f"{self.catalogue.unavailable[disk_name(name)]}")
        if state is None or group not in state.topic.groups or request.filter is not None:
            self.role.not_a_slave("declare")  # what it would change comes from the master
        start = request.start
        if start is not None and start.kind == "copy" and (
                state is None or start.value not in state.topic.groups):
            raise ServiceError(Status.NOT_FOUND,
                               f"topic {name!r} has no consume group {start.value!r} to copy")
        created = state is None
        if state is None:
            state = self.catalogue.open(name, request.flags)
            state.creator = call.queue
            state.topic.declare_group(name, start="beginning")
            state.filters[name] = None
            self.role.begin_epoch(name)
        new_group = group not in state.topic.groups
        old_filter = state.filters.get(group)
        if new_group or request.filter is not None:
            # a new group, or a new filter; declaring an existing group again keeps it
            state.topic.declare_group(group, filter=request.filter, start=start)
            state.filters[group] = request.filter
        try:
            self.catalogue.save_meta(state)
            self.catalogue.save_positions(state)  # a new group's start holds across a crash
        except OSError as exc:
            # not declared after all: what this request changed is undone
            if created:
                self.drop(state)
            elif new_group:
                state.topic.remove_group(group)
                state.filters.pop(group, None)
            else:
                state.topic.declare_group(group, filter=old_filter)
                state.filters[group] = old_filter
            raise StoreError(f"{name}: not declared: {exc.strerror or exc}") from exc
        if new_group or request.filter is not None:
            self.node.declare_group(name, group, filter=request.filter)
        return {"cmd": "declared", "topic": name, "group": group, "created": created,
                "group_created": new_group}

    def query(self, request: Query, call: Call) -> dict[str, Any]:
        generation = self.catalogue.generation
        if request.since == generation and not request.topic:
            # a replica's beat, and it has seen every topic: an answer of a few bytes, not
            # every topic described again (ten times a second)
            return self._group({"cmd": "topics", "server": self.address,
                                "generation": generation, "unchanged": True})
        names = [self.catalogue.get(request.topic).topic.name] if request.topic else sorted(
            self.catalogue.topics)
        reply: dict[str, Any] = {"cmd": "topics", "server": self.address,
                                 "topics": {n: self.catalogue.describe(n) for n in names}}
        if not request.topic:
            reply["generation"] = generation
        for name in names:
            if replicas := self.shipper.describe(name):
                reply["topics"][name]["replicas"] = replicas
        if self.catalogue.unavailable and not request.topic:
            reply["unavailable"] = dict(self.catalogue.unavailable)
        if self.relay is not None:
            self.relay.describe(reply["topics"])  # a cluster's shared topics
        return self._group(reply)

    def _group(self, reply: dict[str, Any]) -> dict[str, Any]:
        """``reply`` with this server's place in a replicated group, if it has one."""
        if (group := self.role.group) is not None:
            reply["group"] = {"name": group.group, "role": group.role, "epoch": group.epoch,
                              "confirmed": group.role == "master" and self.role.confirmed}
        return reply

    def remove(self, request: Remove, call: Call) -> dict[str, Any]:
        state = self.catalogue.get(request.topic)
        group = request.group
        if group:
            self.catalogue.remove_group(state, group)
            return {"cmd": "removed", "topic": state.topic.name, "group": group}
        self.drop(state)
        return {"cmd": "removed", "topic": state.topic.name}

    def drop(self, state: TopicState) -> None:
        """A topic goes: its consumers end (their links stay), then the topic and its
        files."""
        self.consumers.drop_topic(state.topic.name)
        self.catalogue.drop(state)

    def empty(self, request: Empty, call: Call) -> dict[str, Any]:
        state = self.catalogue.get(request.topic)
        state.topic.empty()
        return {"cmd": "emptied", "topic": state.topic.name}
