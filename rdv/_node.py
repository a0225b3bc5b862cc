"""The rendezvous on a pump: bind, listen, unbind and connect for one broker.

Wraps the sans-I/O core; the connect runs as a pump task, pairs the two sides
through the ChannelManager and posts ``accepted`` / ``connected`` tasks.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from channels import ChannelManager, MessageQueue
from pump import Owner, Pump

from ._core import UNKNOWN_BROKER, Action, RdvEvent, Rendezvous, check_port
from ._listeners import require

#: Keyword arguments a node passes to every MessageQueue it creates.
QueueOptions = dict[str, int]


class RdvNode:
    """The ports of one broker on a pump, and its connects to others.

    ``resolve(broker_id)`` finds another node of the same universe (or None);
    ``owner`` is the broker, failed by the pump if one of its tasks raises.
    """

    def __init__(self, pump: Pump, node_id: str, channels: ChannelManager,
                 resolve: Callable[[str], RdvNode | None], *, owner: Owner,
                 queue_options: QueueOptions | None = None) -> None:
        self.pump = pump
        self.id = node_id
        self.core = Rendezvous()
        self._channels = channels
        self._resolve = resolve
        self._owner = owner
        self._queue_options = dict(queue_options or {})
        self._acceptors: dict[int, Any] = {}
        self.queues: weakref.WeakSet[MessageQueue] = weakref.WeakSet()
        self.closed = False
        #: The process's NetNode when brokers of other processes are reachable over TCP.
        self.network: Any = None

    # -- ports -------------------------------------------------------------------------

    def bind(self, port: int, listener: Any) -> None:
        """Wait on ``port`` for one connect; ``listener.accepted(queue)`` when it comes."""
        require(listener, "accept", "accepted")
        self.core.handle(RdvEvent.BIND, port)
        self._acceptors[port] = listener
        self.pump.emit("bind", broker=self.id, port=port)

    def listen(self, port: int, listener: Any) -> None:
        """Like ``bind``, re-armed after every accept: many connects, one after another."""
        require(listener, "accept", "accepted")
        self.core.handle(RdvEvent.LISTEN, port)
        self._acceptors[port] = listener
        self.pump.emit("listen", broker=self.id, port=port)

    def unbind(self, port: int) -> None:
        """End the wait on ``port``; later connects to it are refused ("not bound")."""
        self.core.handle(RdvEvent.UNBIND, port)
        self._acceptors.pop(port, None)
        self.pump.emit("unbind", broker=self.id, port=port)

    # -- connect -----------------------------------------------------------------------

    def connect(self, broker_id: str, port: int, listener: Any) -> None:
        """Post a connect to ``(broker_id, port)``; the listener hears how it ended."""
        if not isinstance(broker_id, str):
            raise TypeError(f"broker id must be a str, not {type(broker_id).__name__}")
        check_port(port)
        require(listener, "connect", "connected", "refused")
        self.pump.emit("connect", broker=self.id, peer=broker_id, port=port)
        self.pump.post("connect", self._run_connect, broker_id, port, listener, owner=self._owner)

    def _run_connect(self, broker_id: str, port: int, listener: Any) -> None:
        if self.closed:
            self._refuse(broker_id, port, listener, "closed")
            return
        target = self._resolve(broker_id)
        if target is None and self.network is not None and self.network.can_reach(broker_id):
            self.network.dial(self, broker_id, port, listener)
            return
        if target is None or target.closed:
            self._refuse(broker_id, port, listener, UNKNOWN_BROKER)
            return
        transition = target.core.handle(RdvEvent.CONNECT, port)
        if transition.action is Action.REFUSE:
            self._refuse(broker_id, port, listener, transition.reason or "refused")
            return
        acceptor = target._acceptors[port]
        ours, theirs = self._channels.open_pair(self.id, target.id, port)
        q_ours = MessageQueue(ours, **self._queue_options)
        q_theirs = MessageQueue(theirs, **target._queue_options)
        self.queues.add(q_ours)
        target.queues.add(q_theirs)
        self.pump.emit("accept", broker=target.id, peer=self.id, port=port, link=ours.trace_link)
        self.pump.post("accept", acceptor.accepted, q_theirs, owner=q_theirs)
        self.pump.post("connected", listener.connected, q_ours, owner=q_ours)

    def _refuse(self, broker_id: str, port: int, listener: Any, reason: str) -> None:
        self.pump.emit("refuse", broker=self.id, peer=broker_id, port=port, reason=reason)
        self.pump.post("refuse", listener.refused, reason, owner=self._owner)

    # -- shutdown ----------------------------------------------------------------------

    def close(self, reason: str) -> None:
        """Unbind every port and abort every link of this node."""
        if self.closed:
            return
        self.closed = True
        for port in self.core.bound_ports():
            self.unbind(port)
        for queue in list(self.queues):
            queue.abort(reason)
