"""The ``produce`` command of an MQ server: one message, or several cut from one body,
stored as the durability policy says and replied once stored (and, under ``sync``
replication, once enough replicas hold them).

A retry (the same producer and sequence) of messages the topic holds whole is answered
with their original offsets and stored no second time (:mod:`mq.topics._dedupe`).  No topic is
created by a produce.  The hot path of the server: one call per produce request.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

from brokermgr import Call, Deferred, SendReply, ServiceError, Status

from ..cluster._relay import Relay
from ..replication._member import GroupRole
from ..replication._shipper import Shipper
from ..storage._files import VIEW_BODY
from ..storage._record import Entry, Produced
from ..topics._catalogue import Catalogue, TopicState
from ..topics._commit import GroupCommit
from ..topics._dedupe import Recent
from ..topics._delivery import FRAME_ROOM, Links
from ..topics._requests import Produce

__all__ = ["ProduceCommand"]


class ProduceCommand:
    """``produce`` on ``catalogue``'s topics; ``dispatch(state)`` pushes what a topic's
    groups may have now; bodies over ``max_body`` are refused (413); a reply held (for the
    group commit, for replicas) goes out through ``send``."""

    def __init__(self, catalogue: Catalogue, links: Links, commit: GroupCommit,
                 shipper: Shipper, role: GroupRole, counts: dict[str, int],
                 dispatch: Callable[[TopicState], None], *, send: SendReply, max_body: int,
                 address: str) -> None:
        self.catalogue = catalogue
        self.links = links
        self.commit = commit
        self.shipper = shipper
        self.role = role
        self.counts = counts
        self.dispatch = dispatch
        self.send = send
        self.max_body = max_body
        self.address = address
        #: A cluster's server: a shared topic's produce goes to the root (:mod:`mq.cluster._relay`).
        self.relay: Relay | None = None

    def __call__(self, request: Produce, call: Call) -> dict[str, Any] | None:
        """A produce: refused, answered as a retry, or stored, then replied now or once
        the commit (and the replicas) have it.  One function although long: the hot path
        of every publish, its checks, dedupe and append read straight through."""
        queue = call.queue
        if self.relay is not None and self.relay.takes(request.topic):
            self.relay.produce(request, call)
            return None  # answered with the root's reply
        try:
            self.role.not_a_slave("publish")
        except ServiceError:
            if queue is not None and self.role.unconfirmed_master:  # told once confirmed
                self.shipper.refused(request.topic, self.links.of(queue))
            raise
        state = self.catalogue.get(request.topic)
        body, sequence, tag = request.body, request.sequence, request.tag
        producer = request.producer
        if producer is None:
            producer = request.origin or ("" if queue is None else queue.remote_id)
        if "rpc" in state.flags:
            # a request: replies are routed back to this link by (caller id, request id)
            if queue is None:
                raise ServiceError(Status.BAD_REQUEST, "an RPC request needs a link to answer")
            producer = self.links.of(queue).caller_id
        sizes = request.sizes
        messages: Sequence[Entry] | Produced
        if sizes is None:
            messages = [(tag, producer, sequence, body)]
        elif max(sizes) < VIEW_BODY:  # small ones: stored by one C call, cut if kept
            messages = Produced(tag, producer, sequence, body, sizes)
        else:
            messages = [(tag, producer, sequence + i, one)
                        for i, one in enumerate(cut_bodies(body, sizes))]
        if len(body) > self.max_body and (len(body) if sizes is None else max(sizes)) > (
                self.max_body):
            raise ServiceError(Status.TOO_LARGE,
                               f"a message over {self.max_body} bytes: this server's links "
                               f"carry frames of at most {self.max_body + FRAME_ROOM} bytes, "
                               f"a delivery's header included")
        sync = self.shipper.mode == "sync"
        if sync and (refused := self.shipper.refusal(state.topic.name)) is not None:
            if queue is not None:  # told when there are enough
                self.shipper.refused(state.topic.name, self.links.of(queue))
            raise refused  # too few replicas in sync to acknowledge it: nothing stored
        recent = self._recent(state) if request.producer is not None else None
        first = None if recent is None else recent.original(producer, sequence, len(messages))
        reply = {"cmd": "stored", "topic": state.topic.name, "offset": first,
                 "count": len(messages), "server": self.address}
        if self.role.group is not None:  # the epoch a replicated group's master stored it in
            reply["epoch"] = self.role.group.epoch
        elif self.relay is not None and state.topic.name in self.relay.cluster.state.topics:
            reply["root_epoch"] = self.relay.cluster.epoch  # a shared topic's, at its root
        if first is not None:  # a retry of messages stored: answered as they were
            reply["duplicate"] = True
            self.counts["duplicates"] += len(messages)
        elif request.immediate and not self._taken_now(state, tag):
            self.counts["returned"] += len(messages)
            raise ServiceError(Status.GONE, f"returned: no consumer of topic "
                               f"{state.topic.name!r} on {self.address} takes it now; not "
                               f"stored", returned=len(messages))
        else:
            reply["offset"] = first = state.topic.publish(messages)
            self.counts["stored"] += len(messages)
            if recent is not None:
                recent.add(producer, sequence, first, len(messages))
        if self.commit.waits(state.topic.log):  # replied and delivered after the commit
            self.commit.written(state.topic.name, state.topic.log,
                                Deferred(call, self.send, reply, topic=state.topic.name))
            if self.shipper.followers:
                # shipped now, so that the replicas' fsyncs run beside this one (what is
                # delivered still waits for it: Catalogue.visible)
                self.dispatch(state)
            return None
        self.dispatch(state)
        if sync and self.shipper.hold(Deferred(call, self.send, reply,
                                               topic=state.topic.name)):
            return None  # replied once enough replicas stored it
        return reply

    @staticmethod
    def _taken_now(state: TopicState, tag: str | None) -> bool:
        """A consumer of one of the topic's groups, whose filter passes ``tag``, is there
        (a cluster's server with consumers of a shared topic is one at the root)."""
        return any(group.consumers and (group.filter is None or group.filter.matches(tag))
                   for group in state.topic.groups.values())

    @staticmethod
    def _recent(state: TopicState) -> Recent | None:
        """The topic's recent publishes, built from its log the first time (None for an
        RPC topic: its requests are not retried by sequence)."""
        if "rpc" in state.flags:
            return None
        if state.recent is None:
            state.recent = Recent.of(state.topic.log)
        return state.recent


def cut_bodies(body: bytes | memoryview, sizes: Sequence[int]) -> Sequence[memoryview]:
    """The messages of a produce request's body, whose sizes are ``sizes`` (one at least
    :data:`~mq.storage._files.VIEW_BODY` bytes): views of the request, written and kept
    without a copy.  (Smaller ones go as a :class:`~mq.storage._record.Produced`.)"""
    view = memoryview(body)
    ends = itertools.accumulate(sizes)
    return [view[end - size:end] for size, end in zip(sizes, ends, strict=True)]
