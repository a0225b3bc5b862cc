"""Listener base classes of the rendezvous and the refusal error of its async face.

Base methods do nothing; any object with the named methods works too.
"""

from __future__ import annotations

from typing import Protocol

from channels import CloseCause, MessageQueue
from pump import RdvpumpError

from ._core import Refusal, RefusalReason


class Accepting(Protocol):
    """What a listener of a bound port must have (:class:`AcceptListener` is one)."""

    def accepted(self, queue: MessageQueue) -> None: ...


class Connecting(Protocol):
    """What a connect's listener must have (:class:`ConnectListener` is one)."""

    def connected(self, queue: MessageQueue) -> None: ...

    def refused(self, reason: str) -> None: ...


class AcceptListener:
    """Told of connections accepted on a bound port.

    Grammar: ``accepted`` once for ``bind``; ``accepted*`` for ``listen``.
    """

    def accepted(self, queue: MessageQueue) -> None:
        """A connect was paired with this port; ``queue`` is our end of the new link."""


class ConnectListener:
    """Told how a connect ended.  Grammar: ``connected | refused``."""

    def connected(self, queue: MessageQueue) -> None:
        """The rendezvous paired us; ``queue`` is our end of the new link."""

    def refused(self, reason: str) -> None:
        """No link: ``"unknown broker"``, ``"not bound"``, ``"busy"``, ``"unauthorized"`` or
        ``"unreachable: ..."``; ``reason.refusal`` is the :class:`Refusal` (a
        :class:`RefusalReason`)."""


class RefusedError(RdvpumpError, ConnectionRefusedError):
    """A connect was refused: ``reason`` is the text, :attr:`refusal` its kind."""

    cause = CloseCause.REFUSED

    def __init__(self, reason: str, broker_id: str, port: int) -> None:
        refusal = (reason.refusal if isinstance(reason, RefusalReason)
                   else RefusalReason.parse(reason).refusal)
        # the refusal an embedding program meets first: say what it means
        hint = (f" (nothing was bound on port {port} of {broker_id!r} when the connect "
                f"ran, and a connect is never queued: bind first; accept_queue binds when "
                f"it is called, serve_queues once nursery.start returns)"
                if refusal == Refusal.NOT_BOUND else "")
        super().__init__(f"connect to {broker_id!r} port {port} refused: {reason}{hint}")
        self.reason = reason
        self.refusal: Refusal = refusal
        self.broker_id = broker_id
        self.port = port


def require(listener: object, role: str, *methods: str) -> None:
    """Raise TypeError unless ``listener`` has every one of ``methods``."""
    missing = [m for m in methods if not callable(getattr(listener, m, None))]
    if missing:
        raise TypeError(f"{role} listener {listener!r} lacks {', '.join(m + '()' for m in missing)}"
                        f"; subclass rdv.{role.capitalize()}Listener")
