"""Changes to a cluster's shared topics: made by the root, sent whole to every server,
acknowledged once a majority of the primaries hold them.

A change asked of a server that is not the root goes to the root (:meth:`Changes.soon`,
asked again every 0.1 s while there is none, refused 503 after the node's
``not_ready_wait``: the cluster is not ready).  On the root it is applied to a new
version of the state, which every peer is sent; its answer waits until a majority of the
primaries said they hold that version (:meth:`Changes.answer_confirmed`, as their
replies and beats come), and is refused (503, "may or may not be kept") when that does
not happen in time or the root changes first (:meth:`Changes.drop`).  A primary that
voted in a newer epoch takes no older root's state, so a change acknowledged is never
one a later root lacks.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from brokermgr import Broker, ReplyOrError, ServiceError, Status

from ._root import has_majority
from ._state import ClusterState, StateError

if TYPE_CHECKING:
    from ._file import ClusterConfig, ClusterServer
    from ._links import PeerLink

__all__ = ["Changes", "ChangingNode"]

log = logging.getLogger("rdvpump.mq.cluster")

#: Told the outcome of a change: the state's version that holds it, or the refusal.
Done = Callable[[int | ServiceError], object]


class ChangingNode(Protocol):
    """What the changes ask of their cluster server (:class:`~._node.ClusterNode`)."""

    config: ClusterConfig
    me: ClusterServer
    state: ClusterState
    epoch: int
    root: str | None
    versions: dict[str, tuple[int, int]]
    not_ready_wait: float
    broker: Broker

    @property
    def closed(self) -> bool: ...

    def take(self, state: ClusterState) -> None: ...

    def send_state(self) -> None: ...

    def root_link(self) -> PeerLink | None: ...


class Changes:
    """The changes of ``node``'s cluster state that wait for a majority."""

    def __init__(self, node: ChangingNode) -> None:
        self.node = node
        #: Changes this root made that wait for a majority of the primaries to hold
        #: them: (version, epoch, done).
        self.confirming: list[tuple[int, int, Done]] = []

    def apply(self, op: str, topic: str, group: str | None, filter_: str | None,
              done: Done, *, by: str | None = None) -> None:
        """On the root: a change applied and, if it changed anything, a new version sent
        to every peer; ``done(version)`` once a majority of the primaries (this root
        among them) hold that version, or ``done(ServiceError)`` (503) if that did not
        happen within the node's ``not_ready_wait`` seconds or the root changed first: the
        change may or may not be kept then.  A change acknowledged so is never one a
        later root lacks: a primary that voted in a newer epoch takes no older root's
        state.  A bad change raises its :class:`ServiceError` (400)."""
        node = self.node
        new = ClusterState.of(node.state.version, node.state.topics, node.epoch,
                              [list(r) for r in node.state.removed])
        try:
            changed = new.apply(op, topic, group, filter_)
        except (StateError, ValueError) as exc:
            raise ServiceError(Status.BAD_REQUEST, str(exc)) from None
        if changed:
            new.version += 1
            if op == "remove":  # the one change that deletes messages: on the record
                log.warning("cluster %s: %s removes shared %s at state v%d (asked through "
                            "%s): its messages go on every server", node.config.name,
                            node.me.id, topic if group is None else f"group {group} of "
                            f"{topic}", new.version, by or node.me.id)
            node.take(new)
            node.send_state()
        version, epoch = node.state.version, node.epoch
        if self.held_by_majority(version):
            done(version)
            return
        waiter = (version, epoch, done)
        self.confirming.append(waiter)

        def expire() -> None:
            if waiter in self.confirming:
                self.confirming.remove(waiter)
                done(ServiceError(Status.UNAVAILABLE, f"cluster {node.config.name}: the "
                                  f"change was not held by a majority of the primaries "
                                  f"within {node.not_ready_wait:g} s; it may or may not "
                                  f"be kept"))

        node.broker.pump.call_later(node.not_ready_wait, expire, owner=node.broker)

    def held_by_majority(self, version: int) -> bool:
        """Whether more than half of the primaries listed hold this root's state at
        ``version`` or later (this root does)."""
        node = self.node
        mark = (node.epoch, version)
        return has_majority(node.config, [node.me.id, *(
            p for p, said in node.versions.items() if said >= mark)])

    def answer_confirmed(self) -> None:
        node = self.node
        if not self.confirming or node.root != node.me.id:
            return
        ready = [w for w in self.confirming
                 if w[1] == node.epoch and self.held_by_majority(w[0])]
        for waiter in ready:
            self.confirming.remove(waiter)
            waiter[2](waiter[0])

    def drop(self, why: str) -> None:
        """This server is no longer the root it was when the changes waiting were made:
        each is answered 503 (``why``)."""
        node = self.node
        waiting, self.confirming = self.confirming, []
        for version, _epoch, done in waiting:
            done(ServiceError(Status.UNAVAILABLE, f"cluster {node.config.name}: {why} "
                              f"before a majority of the primaries held version {version}; "
                              f"the change may or may not be kept"))

    def soon(self, op: str, topic: str, group: str | None, filter_: str | None,
             done: Done) -> None:
        """Declare or remove a shared topic (or a group of it) through the root;
        ``done(version)`` once the root has it, or ``done(ServiceError)``: the root's
        refusal, or 503 ("cluster not ready") when no root answered within
        :attr:`not_ready_wait` seconds (asked again every 0.1 s meanwhile, on the
        pump)."""
        node = self.node
        pump = node.broker.pump
        deadline = pump.now() + node.not_ready_wait

        def attempt() -> None:
            if node.closed:
                done(ServiceError(Status.UNAVAILABLE, f"{node.me.id}: the cluster server "
                                                      f"is closed"))
            elif node.root == node.me.id:
                try:
                    self.apply(op, topic, group, filter_, done)
                except ServiceError as exc:
                    done(exc)
            elif (link := node.root_link()) is None or not link.request(
                    {"cmd": "change", **link.said(), "op": op, "topic": topic,
                     "group": group, "filter": filter_}, replied):
                again()  # no root, or its link is past its high-water mark: not sent

        def replied(outcome: ReplyOrError) -> None:
            if not isinstance(outcome, ServiceError):
                done(int(outcome["version"]))
            elif outcome.status in (Status.NO_REPLY, Status.UNAVAILABLE):
                again()  # the root went, or is not root any more: ask the next one
            else:
                done(outcome)

        def again() -> None:
            left = deadline - pump.now()
            if left <= 0:
                done(ServiceError(Status.UNAVAILABLE, f"cluster {node.config.name} not "
                                  f"ready: no root within {node.not_ready_wait:g} s"))
            else:
                pump.call_later(min(0.1, left), attempt, owner=node.broker)

        attempt()
