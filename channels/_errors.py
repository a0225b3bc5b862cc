"""The few errors of the channel layer, built on trio's where trio has one.

``ClosedResourceError`` (you closed it) and ``BrokenResourceError`` (the peer or
the link broke it) are trio's own and are raised as they are.
"""

from __future__ import annotations

import trio


class QueueFullError(trio.WouldBlock):
    """``send`` would take the bytes queued for sending past the high-water mark.

    Nothing was queued.  Wait for the listener's ``drained()`` (or use the async
    API, whose ``send`` waits) and send again.
    """


class MessageTooLargeError(ValueError):
    """A message is longer than the queue's ``max_message_size``; nothing was queued."""


class ProtocolError(Exception):
    """The peer sent bytes that are not a valid frame stream; the link is closed."""
