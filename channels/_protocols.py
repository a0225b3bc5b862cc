"""What a channel talks to: its listener, the other end of its link, and the observer
that records what happens on it (the pump's trace)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ._cause import CloseCause


class ChannelListener(Protocol):
    """Notifications of a channel.  Grammar: ``(readable | writable)* closed``.

    ``readable()``: bytes arrived.  Edge-triggered: read until ``read()`` returns
    ``b""``, or you are not told again until more bytes arrive.
    ``writable()``: room freed after a write that could not take everything.
    ``closed(reason)``: the channel is done; on the peer of a disconnect this
    comes only after every byte written before the disconnect was read.
    """

    def readable(self) -> None: ...

    def writable(self) -> None: ...

    def closed(self, reason: str) -> None: ...


class LinkPeer(Protocol):
    """The other end of a channel's link, as the channel sees it."""

    def data_arrived(self) -> None:
        """Bytes went into the ring this peer reads."""

    def room_freed(self) -> None:
        """Bytes left the ring this peer writes."""

    def peer_ended(self, reason: str, cause: CloseCause) -> None:
        """The other side disconnected."""


class LinkObserver(Protocol):
    """What happens on one end of a link, told to whoever records it (the pump's trace).

    ``moved`` is bytes through a ring (``"write"`` on this end's way out,
    ``"read"`` on its way in); ``sent`` and ``delivered`` are whole messages.
    """

    def moved(self, kind: str, size: int, partial: bool) -> None: ...

    def sent(self, size: int) -> None: ...

    def delivered(self, sizes: Sequence[int]) -> None: ...

    def protocol_error(self, reason: str) -> None: ...

    def disconnected(self, reason: str, cause: str) -> None: ...

    def closed(self, reason: str) -> None: ...
