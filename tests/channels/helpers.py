"""Small listeners recording what a test should see."""

from __future__ import annotations

from channels import MessageQueue, QueueListener


class Recorder(QueueListener):
    """Records every message and the close reason of one queue."""

    def __init__(self) -> None:
        self.messages: list[bytes] = []
        self.reasons: list[str] = []
        self.drains = 0

    def received(self, message: bytes) -> None:
        self.messages.append(message)

    def drained(self) -> None:
        self.drains += 1

    def closed(self, reason: str) -> None:
        self.reasons.append(reason)


class ChanRecorder:
    def __init__(self) -> None:
        self.events: list[str] = []

    def readable(self) -> None:
        self.events.append("readable")

    def writable(self) -> None:
        self.events.append("writable")

    def closed(self, reason: str) -> None:
        self.events.append(f"closed: {reason}")


def queue_pair(pump: object, capacity: int, **options: int) -> tuple[MessageQueue, MessageQueue]:
    from channels import ChannelManager

    cm = ChannelManager(pump, capacity=capacity)  # type: ignore[arg-type]
    a, b = cm.open_pair("a", "b", 80)
    return MessageQueue(a, **options), MessageQueue(b, **options)
