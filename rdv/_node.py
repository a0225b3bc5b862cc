"""The rendezvous on a pump: bind, listen, unbind and connect for one broker.

Wraps the sans-I/O core; the connect runs as a pump task.  :meth:`RdvNode.accept`
is *the* accept decision, the same for a connect from this process (through
memory) and from another (over the wire, :mod:`._net`).
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable
from typing import Any, Protocol

from channels import Channel, ChannelManager, MessageQueue
from pump import Owner, Pump
from pump.schema import Kind

from ._core import Action, RdvEvent, Refusal, RefusalReason, Rendezvous, check_port
from ._listeners import Accepting, Connecting, require

#: Keyword arguments a node passes to every MessageQueue it creates.
QueueOptions = dict[str, int]


class Network(Protocol):
    """How a node reaches brokers of other processes (a :class:`~rdv.NetNode`)."""

    def can_reach(self, dst: str) -> bool: ...

    def dial(self, node: RdvNode, dst: str, port: int, listener: Connecting) -> None: ...


class RdvNode:
    """The ports of one broker on a pump, and its connects to others.

    ``resolve(broker_id)`` finds another node of the same universe (or None);
    ``owner`` is the broker, failed by the pump if one of its tasks raises;
    ``network`` (optional) dials brokers that are not in this process.
    """

    def __init__(self, pump: Pump, node_id: str, channels: ChannelManager,
                 resolve: Callable[[str], RdvNode | None], *, owner: Owner,
                 queue_options: QueueOptions | None = None,
                 network: Network | None = None) -> None:
        self.pump = pump
        self.id = node_id
        self.core = Rendezvous()
        self.owner = owner
        self.network = network
        self._channels = channels
        self._resolve = resolve
        self._queue_options = dict(queue_options or {})
        self._acceptors: dict[int, Any] = {}
        #: This node's open queues, weakly held, in a dict: closing the node aborts them
        #: in the order they opened (a set would go by ``id()``, different every run).
        self.queues: weakref.WeakValueDictionary[int, MessageQueue] = (
            weakref.WeakValueDictionary())
        self._opened = itertools.count()  # not the link id: remote links number their own
        self.closed = False

    # -- ports -------------------------------------------------------------------------

    def bind(self, port: int, listener: Accepting) -> None:
        """Wait on ``port`` for one connect; ``listener.accepted(queue)`` when it comes."""
        require(listener, "accept", "accepted")
        self.core.handle(RdvEvent.BIND, port)
        self._acceptors[port] = listener
        self.pump.emit(Kind.BIND, broker=self.id, port=port)

    def listen(self, port: int, listener: Accepting) -> None:
        """Like ``bind``, re-armed after every accept: many connects, one after another."""
        require(listener, "accept", "accepted")
        self.core.handle(RdvEvent.LISTEN, port)
        self._acceptors[port] = listener
        self.pump.emit(Kind.LISTEN, broker=self.id, port=port)

    def unbind(self, port: int) -> None:
        """End the wait on ``port``; later connects to it are refused ("not bound")."""
        self.core.handle(RdvEvent.UNBIND, port)
        self._acceptors.pop(port, None)
        self.pump.emit(Kind.UNBIND, broker=self.id, port=port)

    # -- the accept decision -----------------------------------------------------------

    def accept(self, src: str, port: int, end: Callable[[], Channel]) -> MessageQueue | Refusal:
        """Decide a connect of ``src`` to our ``port`` (run as a pump task).

        Refused: the reason.  Accepted: ``end()`` makes our end of the new link,
        it becomes a queue, and the port's listener hears ``accepted`` (a task).
        """
        if self.closed:
            return Refusal.UNKNOWN_BROKER
        transition = self.core.handle(RdvEvent.CONNECT, port)
        if transition.action is Action.REFUSE:
            assert transition.reason is not None
            return transition.reason
        channel = end()
        queue = self.open_queue(channel)
        self.pump.emit(Kind.ACCEPT, broker=self.id, peer=src, port=port, link=channel.trace_link)
        self.pump.post("accept", self._acceptors[port].accepted, queue, owner=queue)
        return queue

    def open_queue(self, channel: Channel) -> MessageQueue:
        """Our end of a new link, as a message queue with this node's options."""
        queue = MessageQueue(channel, **self._queue_options)
        self.queues[next(self._opened)] = queue
        return queue

    # -- connect -----------------------------------------------------------------------

    def connect(self, broker_id: str, port: int, listener: Connecting) -> None:
        """Post a connect to ``(broker_id, port)``; the listener hears how it ended."""
        if not isinstance(broker_id, str):
            raise TypeError(f"broker id must be a str, not {type(broker_id).__name__}")
        check_port(port)
        require(listener, "connect", "connected", "refused")
        self.pump.emit(Kind.CONNECT, broker=self.id, peer=broker_id, port=port)
        self.pump.post("connect", self._run_connect, broker_id, port, listener, owner=self.owner)

    def _run_connect(self, broker_id: str, port: int, listener: Connecting) -> None:
        if self.closed:
            self.refuse(broker_id, port, listener, RefusalReason(Refusal.CLOSED))
            return
        gate = self._channels.gate
        why = None if gate is None else gate.refusal(self.id, broker_id)
        if why is not None:  # a simulation says so: a partition, a crashed broker
            self.refuse(broker_id, port, listener, RefusalReason(Refusal.UNREACHABLE, why))
            return
        target = self._resolve(broker_id)
        if target is None and self.network is not None and self.network.can_reach(broker_id):
            self.network.dial(self, broker_id, port, listener)
            return
        if target is None:
            self.refuse(broker_id, port, listener, RefusalReason(Refusal.UNKNOWN_BROKER))
            return
        ours: list[Channel] = []

        def end() -> Channel:
            mine, theirs = self._channels.open_pair(self.id, target.id, port)
            ours.append(mine)
            return theirs

        outcome = target.accept(self.id, port, end)
        if isinstance(outcome, Refusal):
            self.refuse(broker_id, port, listener, RefusalReason(outcome))
            return
        self.connected(ours[0], listener)

    def connected(self, channel: Channel, listener: Connecting) -> None:
        """Our end of an accepted connect: ``listener.connected(queue)`` as a task."""
        queue = self.open_queue(channel)
        self.pump.post("connected", listener.connected, queue, owner=queue)

    def refuse(self, broker_id: str, port: int, listener: Connecting,
               reason: RefusalReason) -> None:
        """A connect of ours was refused: ``listener.refused(reason)`` as a task."""
        self.pump.emit(Kind.REFUSE, broker=self.id, peer=broker_id, port=port, reason=str(reason))
        self.pump.post("refuse", listener.refused, reason, owner=self.owner)

    # -- shutdown ----------------------------------------------------------------------

    def close(self, reason: str) -> None:
        """Unbind every port and abort every link of this node."""
        if self.closed:
            return
        self.closed = True
        for port in self.core.bound_ports():
            self.unbind(port)
        for queue in list(self.queues.values()):
            queue.abort(reason)
