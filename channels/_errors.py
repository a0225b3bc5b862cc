"""The few errors of the channel layer, built on trio's where trio has one.

``ClosedResourceError`` (you closed it) and ``BrokenResourceError`` (the peer or
the link broke it) are trio's own and are raised as they are.  The others
share rdvpump's base class, :class:`pump.RdvpumpError`.
"""

from __future__ import annotations

import trio

from pump import RdvpumpError


class QueueFullError(RdvpumpError, trio.WouldBlock):
    """``send`` would take the bytes queued for sending past the high-water mark.

    Nothing was queued.  Wait for the listener's ``drained()`` (or use the async
    API, whose ``send`` waits) and send again.
    """


class MessageTooLargeError(RdvpumpError, ValueError):
    """A message is longer than the queue's ``max_message_size``; nothing was queued."""


class ProtocolError(RdvpumpError):
    """The peer sent bytes that break the protocol (the remote's fault, not a misuse here).

    Raised by the sans-I/O cores (the frame codec, the handshake); the link
    that carried the bytes is closed with it as the reason.
    """
