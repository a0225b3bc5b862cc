"""The consumers' commands of an MQ server: ``consume``, ``unconsume`` and ``ack``, and
what a closed link's consumers leave behind.

A link consumes a topic's group with a window of credits (:class:`~mq.topics._topic.Member`);
what it does not acknowledge in time, or leaves unacknowledged when it goes, goes to
the group's other consumers.  Each change of a group's consumers updates the broker's
ServerInfo, so trackers and route tables follow.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from brokermgr import Call, ServiceError, Status
from brokermgr.tracking import TrackNode
from channels import MessageQueue

from ..cluster._relay import Relay
from ..topics._catalogue import Catalogue, TopicState
from ..topics._delivery import ClientLink, Links
from ..topics._group import Member
from ..topics._requests import Ack, Consume, Unconsume

__all__ = ["ConsumerCommands"]

log = logging.getLogger("rdvpump.mq")


class ConsumerCommands:
    """``consume``, ``unconsume`` and ``ack`` on ``catalogue``'s topics, from ``links``;
    ``dispatch(state)`` pushes what a topic's groups may have now."""

    def __init__(self, node: TrackNode, catalogue: Catalogue, links: Links,
                 counts: dict[str, int], dispatch: Callable[[TopicState], None],
                 address: str) -> None:
        self.node = node
        self.catalogue = catalogue
        self.links = links
        self.counts = counts
        self.dispatch = dispatch
        self.address = address
        #: A cluster's server: a shared topic is consumed through the root
        #: (:mod:`mq.cluster._relay`).
        self.relay: Relay | None = None

    def consume(self, request: Consume, call: Call) -> dict[str, Any] | None:
        if self.relay is not None and self.relay.takes(request.topic):
            return self.relay.consume(request, call)
        queue = call.queue
        if queue is None:
            raise ServiceError(Status.BAD_REQUEST, "consume needs a link to deliver to")
        state = self.catalogue.get(request.topic)
        group = request.group or state.topic.name
        window = request.window
        topic_group = state.topic.group(group)
        link = self.links.of(queue)
        link.shared_frames |= request.shared_frames
        link.named_runs |= request.cached
        if (state.topic.name, group) in link.consumers:
            raise ServiceError(Status.CONFLICT,
                               f"this link already consumes {state.topic.name}/{group}")
        if "exclusive" in state.flags and topic_group.consumers:
            raise ServiceError(Status.CONFLICT,
                               f"topic {state.topic.name!r} is exclusive: group {group!r} "
                               f"has a consumer already")
        consumer = Member(f"{queue.remote_id}#{id(queue) % 100000}", group,
                          link.batch.append, window=window, deliver_run=link.batch.append)
        if request.shared_frames:  # a relaying server: runs of an eighth of its window
            consumer.min_room = max(1, window // 8)
        link.consumers[(state.topic.name, group)] = consumer
        state.topic.attach(consumer)
        self.changed(state, group)
        self.node.pump.post("mq dispatch", lambda: self.dispatch(state),
                            owner=self.node.broker)
        return {"cmd": "consuming", "topic": state.topic.name, "group": group,
                "window": window}

    def unconsume(self, request: Unconsume, call: Call) -> dict[str, Any]:
        queue = call.queue
        if self.relay is not None and self.relay.consumes(queue, request.topic,
                                                          request.group or request.topic):
            return self.relay.unconsume(request, call)
        state = self.catalogue.get(request.topic)
        group = request.group or state.topic.name
        consumer = None if queue is None else self.links.of(queue).consumers.pop(
            (state.topic.name, group), None)
        if consumer is None:
            raise ServiceError(Status.NOT_FOUND,
                               f"this link does not consume {state.topic.name}/{group}")
        state.topic.detach(consumer)
        self.changed(state, group)
        self.dispatch(state)
        return {"cmd": "unconsumed", "topic": state.topic.name, "group": group}

    def ack(self, request: Ack, call: Call) -> dict[str, Any] | None:
        """Acknowledge offsets this link's consumer of the group holds.  Offsets it does
        not hold (never delivered to it, acknowledged already, or gone to another
        consumer after its ack timeout) are a 409 naming them: the rest are acknowledged
        all the same."""
        queue = call.queue
        if self.relay is not None and self.relay.consumes(queue, request.topic,
                                                          request.group or request.topic):
            return self.relay.ack(request, call)
        state = self.catalogue.get(request.topic)
        group = request.group or state.topic.name
        state.topic.group(group)  # 404 for an unknown group
        consumer = None if queue is None else self.links.of(queue).consumers.get(
            (state.topic.name, group))
        if consumer is None:
            raise ServiceError(Status.CONFLICT,
                               f"this link does not consume {state.topic.name}/{group}: "
                               f"its acks are not taken")
        done, missed = state.topic.ack(group, request.offsets, consumer)
        self.counts["acked"] += done
        if done and state.topic.waiting(group):  # credits it was waiting for
            self.dispatch(state)
        if missed:
            raise ServiceError(Status.CONFLICT,
                               f"{len(missed)} offsets of {state.topic.name}/{group} are not "
                               f"held by this consumer (never delivered to it, acknowledged "
                               f"already or redelivered after the ack timeout): "
                               f"{_offsets(missed)}; {done} acknowledged")
        return {"cmd": "acked", "topic": state.topic.name, "count": done}

    def gone(self, link: ClientLink, queue: MessageQueue) -> None:
        """A closed link's consumers: their unacknowledged messages go to the groups'
        other consumers."""
        for (name, group), consumer in link.consumers.items():
            state = self.catalogue.topics.get(name)
            if state is not None:
                returned = state.topic.detach(consumer)
                if returned:
                    log.info("%s: %s/%s: %d unacknowledged messages of %s go to the "
                             "group's other consumers", self.address, name, group,
                             returned, queue.remote_id)
                self.changed(state, group)
                self.dispatch(state)

    def drop_topic(self, name: str) -> None:
        """A topic goes: its consumers end (their links stay)."""
        for link in self.links:
            for key in [k for k in link.consumers if k[0] == name]:
                del link.consumers[key]

    def changed(self, state: TopicState, group: str) -> None:
        """A group's consumers changed: the broker's ServerInfo says so."""
        topic_group = state.topic.groups.get(group)
        if topic_group is None:
            return
        names = [c.name for c in topic_group.consumers]
        self.node.update_group(state.topic.name, group, message_count=state.topic.lag(group),
                               consumers=names)


def _offsets(offsets: list[int]) -> str:
    """Offsets for a message: the first few, and how many more."""
    shown = ", ".join(map(str, offsets[:5]))
    return shown if len(offsets) <= 5 else f"{shown} and {len(offsets) - 5} more"
