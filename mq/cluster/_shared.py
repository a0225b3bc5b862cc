"""Shared topics: the bridge between a server's MQ server and its cluster.

A client declares a shared topic on any server (``declare`` with ``shared``): the server
asks its cluster's root (:meth:`~._node.ClusterNode.change_soon`), declares it itself
once the root has it, and answers.  Every server declares what each new cluster state
holds, and removes what it dropped (:func:`declare_on`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from brokermgr import Call, Deferred, ServiceError, Status

from ..topics._requests import Declare
from ._node import ClusterNode
from ._state import ClusterState


class SharingServer(Protocol):
    """What declaring shared topics asks of an MQ server (:class:`~mq.MqServer`): its
    cluster, where it is, to handle a request of its own and to answer one later."""

    @property
    def cluster(self) -> ClusterNode | None: ...

    @property
    def address(self) -> str: ...

    def handle_local(self, obj: dict[str, Any]) -> dict[str, Any]: ...

    def defer(self, call: Call, reply: dict[str, Any] | None = None, **named: Any
              ) -> Deferred: ...

__all__ = ["declare_on", "declare_shared"]

log = logging.getLogger("rdvpump.mq.cluster")


def declare_shared(server: SharingServer, request: Declare, call: Call) -> None:
    """A topic of the cluster (and a group of it): asked of the root; once the root
    has it, declared here too (every other server declares it as the cluster's state
    reaches it), then answered."""
    cluster = server.cluster
    if cluster is None:
        raise ServiceError(Status.BAD_REQUEST, f"{server.address} is in no cluster: a "
                           f"shared topic needs one (broker run --cluster)")
    if call.queue is None:
        raise ServiceError(Status.BAD_REQUEST, "a shared declare is answered on a link")
    group = request.group or request.topic
    reply = server.defer(call, topic=request.topic, group=group)

    def done(outcome: int | ServiceError) -> None:
        if isinstance(outcome, int):
            try:
                local = {"cmd": "declare", "topic": request.topic, "group": group}
                if request.filter is not None:
                    local["filter"] = request.filter
                created = server.handle_local(local)["created"]
            except ServiceError as exc:
                outcome = exc
            else:
                reply.answer({"cmd": "declared", "topic": request.topic, "group": group,
                              "created": created, "shared": True, "version": outcome})
                return
        reply.refuse(outcome)

    cluster.change_soon("declare", request.topic, request.group, request.filter, done)
    return None


def declare_on(server: SharingServer) -> Callable[[ClusterState, ClusterState], None]:
    """An ``on_state`` for :class:`~mq.ClusterNode`: each new state declared on
    ``server`` (an :class:`~mq.MqServer`); a topic or group it holds that the new state
    says was removed is removed, with its messages.  One the new state leaves out
    without saying it was removed is kept, messages and all, as this server's own, and
    that is logged once: only an explicit removal deletes data.  A topic this server
    cannot declare is logged, and the others go on."""
    kept: set[tuple[str, str | None]] = set()

    def keep(topic: str, group: str | None, new: ClusterState) -> None:
        if (topic, group) not in kept:
            kept.add((topic, group))
            what = f"shared topic {topic}" if group is None else f"group {group} of {topic}"
            log.warning("cluster state v%d (epoch %d) leaves out %s without a removal: "
                        "kept on %s with its messages (remove it explicitly to delete "
                        "it)", new.version, new.epoch, what, server.address)

    def take(old: ClusterState, new: ClusterState) -> None:
        for topic, groups in new.topics.items():
            for group, filter_ in groups.items():
                if old.topics.get(topic, {}).get(group, "") == filter_:
                    continue
                request = {"cmd": "declare", "topic": topic, "group": group}
                if filter_ is not None:
                    request["filter"] = filter_
                _local(server, request)
        for topic, groups in old.topics.items():
            if topic not in new.topics:
                if new.was_removed(topic):
                    _local(server, {"cmd": "remove", "topic": topic})
                else:
                    keep(topic, None, new)
                continue
            for group in groups:
                if group in new.topics[topic]:
                    continue
                if new.was_removed(topic, group):
                    _local(server, {"cmd": "remove", "topic": topic, "group": group})
                else:
                    keep(topic, group, new)

    return take


def _local(server: SharingServer, request: dict[str, Any]) -> None:
    try:
        server.handle_local(request)
    except ServiceError as exc:  # that topic's refusal (a store error, say): logged
        log.error("cluster state: %s %s/%s on %s: %s", request["cmd"], request["topic"],
                  request.get("group", ""), server.address, exc)
