"""What a cluster's server stored while it was root, sent to the root that followed.

A server that is not the root serves no group of a shared topic from its own copy (its
clients consume through the root: :mod:`._relay`), so what that copy holds beyond the
lowest position of its groups was stored while this server was root and may have reached
no group of the cluster yet.  Each second, while the server is linked to the root, it
takes the next :data:`DRAIN_BATCH` of those messages and sends the root the ones a group
here has not handled (not read yet, in flight, or given back to be delivered again;
those every group acknowledged here stay here), each stored there under its producer as
the origin (never checked for duplicates), and once the root stored all of them, every
group here moves past the batch.  A message may then reach a group twice (another group
here had not handled it, or it had reached this group here before): at least once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from brokermgr import Body, ReplyOrError, ServiceError, Status
from channels import MessageQueue

from ..storage._record import Record
from ..topics._catalogue import Catalogue, TopicState
from ._node import ClusterNode

__all__ = ["DRAIN_BATCH", "Drain"]

log = logging.getLogger("rdvpump.mq.cluster")

#: Messages of a drain sent to the root at once.
DRAIN_BATCH = 256


class RootLink(Protocol):
    """The link to the cluster's root that a drain sends on (:class:`~._relayed.Upstream`)."""

    root: str
    queue: MessageQueue | None

    def request(self, obj: dict[str, Any], on_reply: Callable[[ReplyOrError], object], *,
                body: Body | None = None) -> bool: ...


class Drain:
    """The copies of shared topics in ``catalogue`` (of the MQ server at ``address``),
    sent to the root (see the module); ``counts["drained"]`` counts what went."""

    def __init__(self, catalogue: Catalogue, address: str, counts: dict[str, int]) -> None:
        self.catalogue = catalogue
        self.address = address
        self.counts = counts
        #: Topics with a batch on its way to the root.
        self.busy: set[str] = set()

    def run(self, upstream: RootLink | None, cluster: ClusterNode) -> None:
        """The next batch of each shared topic of ``cluster`` that has one, to the root
        over ``upstream`` (none while this server is the root)."""
        if upstream is None or upstream.queue is None or cluster.root == cluster.me.id:
            return
        for name in cluster.state.topics:
            state = self.catalogue.topics.get(name)
            if state is None or name in self.busy or not state.topic.groups:
                continue
            topic = state.topic
            floor = min(group.floor for group in topic.groups.values())
            if floor >= topic.log.next_offset:
                continue
            records = topic.log.read(floor, max_count=DRAIN_BATCH)
            if not records:
                continue
            groups = [(group.next_read, group.unhandled()) for group in topic.groups.values()]
            wanted = [r for r in records
                      if any(r.offset >= read or r.offset in held for read, held in groups)]
            if wanted:
                self._send(upstream, state, wanted, records[-1].offset + 1)
            else:  # every group here acknowledged them: nothing to send
                self._past(state, records[-1].offset + 1)

    def _past(self, state: TopicState, end: int) -> None:
        """Every group of the topic here moves past ``end`` (the root stored what of the
        messages below it a group had not handled)."""
        for group in list(state.topic.groups):
            state.topic.advance(group, end)
        self.catalogue.save_positions(state)

    def _send(self, upstream: RootLink, state: TopicState, records: list[Record],
              end: int) -> None:
        name = state.topic.name
        self.busy.add(name)
        left = [len(records)]
        failed: list[str] = []

        def stored(outcome: ReplyOrError) -> None:
            if isinstance(outcome, ServiceError):
                failed.append(outcome.reason)
            left[0] -= 1
            if left[0]:
                return
            self.busy.discard(name)
            if failed:
                log.warning("%s: drain of %s to root %s: %s (tried again)",
                            self.address, name, upstream.root, failed[0])
                return
            if self.catalogue.topics.get(name) is not state:
                return
            self._past(state, end)
            self.counts["drained"] += len(records)
            log.info("%s: %d messages of %s stored under an earlier root sent to root %s",
                     self.address, len(records), name, upstream.root)

        for record in records:
            obj: dict[str, Any] = {"cmd": "produce", "topic": name, "origin": record.producer,
                                   "sequence": record.sequence}
            if record.tag is not None:
                obj["tag"] = record.tag
            if not upstream.request(obj, stored, body=record.body):
                stored(ServiceError(Status.UNAVAILABLE, "the root's link is full or down"))
