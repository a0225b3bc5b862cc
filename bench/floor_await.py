"""The least one ``await`` per message can cost on trio, beside trio's memory channel.

``python bench/floor_await.py [MESSAGES] [ROUNDS]``: a queue that only appends,
pops and keeps trio's conventions (``send`` and ``receive`` each check for
cancellation and yield once; a parked receiver is rescheduled by the sender),
moving 64 B messages between two tasks, against the awaited trio memory channel
that ``rdvpump bench inproc`` compares with; and the same queue with each message
framed into a C ring and taken out of it at once by the codec the link uses
(``FrameEncoder`` / ``FrameDecoder``, no pump, no message queue): what a link's data
path adds at the least.  Figures in bench/RESULTS.md.
"""

from __future__ import annotations

import collections
import sys
import time

import trio

from channels import FrameDecoder, FrameEncoder, RingBuffer
from rdvpump.bench.inproc import trio_memory_channel

MSG = b"x" * 64


class Floor:
    """A deque with a checkpoint per await: what any conforming queue must at least do."""

    def __init__(self) -> None:
        self.items: collections.deque[bytes] = collections.deque()
        self.waiter: trio.lowlevel.Task | None = None
        self.done = False

    def _wake(self) -> None:
        if self.waiter is not None:
            task, self.waiter = self.waiter, None
            trio.lowlevel.reschedule(task)

    async def send(self, message: bytes) -> None:
        await trio.lowlevel.checkpoint_if_cancelled()
        self.items.append(message)
        self._wake()
        await trio.lowlevel.cancel_shielded_checkpoint()

    def end(self) -> None:
        self.done = True
        self._wake()

    async def receive(self) -> bytes:
        await trio.lowlevel.checkpoint_if_cancelled()
        while not self.items:
            if self.done:
                raise trio.EndOfChannel
            self.waiter = trio.lowlevel.current_task()
            await trio.lowlevel.wait_task_rescheduled(
                lambda _: trio.lowlevel.Abort.SUCCEEDED)
        message = self.items.popleft()
        await trio.lowlevel.cancel_shielded_checkpoint()
        return message


class RingFloor(Floor):
    """The floor queue with each message through a C ring on its way: framed in by the
    encoder, taken out by the decoder, as one message of a link at a time."""

    def __init__(self) -> None:
        super().__init__()
        ring = RingBuffer(1 << 18)
        self.encoder = FrameEncoder(ring)
        self.decoder = FrameDecoder(ring, max_message_size=1 << 20)

    async def send(self, message: bytes) -> None:
        await trio.lowlevel.checkpoint_if_cancelled()
        self.encoder.write([message], 0)
        frames = self.decoder.next_frames()
        assert frames is not None
        self.items.extend(frames[0])
        self._wake()
        await trio.lowlevel.cancel_shielded_checkpoint()


async def floor(count: int, kind: type[Floor] = Floor) -> float:
    queue = kind()

    async def produce() -> None:
        for _ in range(count):
            await queue.send(MSG)
        queue.end()

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(produce)
        try:
            while True:
                await queue.receive()
        except trio.EndOfChannel:
            pass
    return time.perf_counter() - start


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    for _ in range(rounds):
        channel = trio_memory_channel(len(MSG), count)
        least = trio.run(floor, count)
        ring = trio.run(floor, count, RingFloor)
        print(f"trio memory channel {count / channel:,.0f}/s  floor {count / least:,.0f}/s "
              f"({channel / least:.2f}x)  through a ring {count / ring:,.0f}/s "
              f"({channel / ring:.2f}x)", flush=True)


if __name__ == "__main__":
    main()
