"""``rdvpump bench inproc``: a MessageQueue between two brokers on one pump, message by message.

Baselines measured in the same run: trio memory channels (awaited send and
receive) and pyzmq inproc PUSH/PULL.  Every figure is the best of ``repeat``
runs; ratios are rdvpump over the baseline.
"""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Callable, Iterator
from functools import partial

import trio

from brokermgr import BrokerManager
from channels import AsyncMessageQueue, MessageQueue, QueueFullError
from pump import ListSink, Pump, TraceRecorder, open_trace

from .._errors import RunError
from ._result import Result, messages_for

#: Messages per send_many call in the batched case.
BATCH = 256
#: Messages per run for each size (about 0.1-1 s each on a 2-core machine).
DEFAULT_COUNTS = {64: 2_000_000, 1024: 1_000_000, 65536: 60_000}


def rdvpump_inproc(size: int, count: int, *, ring: int = 1 << 18,
                   high_water: int = 1 << 20, trace: str | None = None, batch: int = 0) -> float:
    """Seconds to move ``count`` messages of ``size`` bytes through a MessageQueue.

    The producer calls ``send`` once per message, or ``send_many`` with lists of
    ``batch`` messages; the consumer's listener gets every message one by one.
    ``trace`` records a trace: ``"memory"`` (kept as objects), or ``"jsonl"`` /
    ``"parquet"`` written to a file in a temporary directory; the time then
    includes writing the whole file.
    """
    with tempfile.TemporaryDirectory(prefix="rdvpump-bench-") as tmp:
        recorder = (None if trace is None else ListSink() if trace == "memory"
                    else open_trace(tmp, pump="bench", format=trace))
        return _rdvpump_inproc(size, count, ring, high_water, recorder, batch)


class _Counting:
    """The consumer's side: takes every message, keeps nothing (the queue counts)."""

    def received(self, message: bytes) -> None:
        pass

    def closed(self, reason: str) -> None:
        pass


class _Accept:
    def __init__(self) -> None:
        self.queues: list[MessageQueue] = []

    def accepted(self, queue: MessageQueue) -> None:
        queue.set_listener(_Counting())
        self.queues.append(queue)


class _Flooder(_Counting):
    """The producer's side: sends ``count`` messages as fast as the queue takes them
    (one ``send`` each, or ``send_many`` of ``batch``), again each time it drains."""

    def __init__(self, msg: bytes, count: int, batch: int) -> None:
        self.msg = msg
        self.left = count
        self.batch = batch

    def connected(self, queue: MessageQueue) -> None:
        self.queue = queue
        queue.set_listener(self)
        self.drained()

    def refused(self, reason: str) -> None:
        raise RunError(reason)

    def drained(self) -> None:
        if self.batch:
            self.drained_batched()
            return
        send = self.queue.send
        msg = self.msg
        left = self.left
        sent = 0
        try:
            for sent in range(1, left + 1):  # noqa: B007
                send(msg)
        except QueueFullError:
            sent -= 1
        self.left = left - sent

    def drained_batched(self) -> None:
        send_many = self.queue.send_many
        batch = self.batch
        chunk = [self.msg] * batch
        left = self.left
        try:
            while left >= batch:
                n = send_many(chunk)
                left -= n
                if n < batch:
                    return
            if left:
                left -= send_many(chunk[:left])
        except QueueFullError:
            pass
        finally:
            self.left = left


def _rdvpump_inproc(size: int, count: int, ring: int, high_water: int,
                    recorder: TraceRecorder | None, batch: int) -> float:
    pump = Pump(trace=recorder)
    universe = BrokerManager("bench", pump=pump, ring_capacity=ring, high_water=high_water,
                             max_message_size=max(high_water, size))
    a, b = universe.add_broker("producer"), universe.add_broker("consumer")
    accept = _Accept()
    b.bind(1, accept)
    a.connect("consumer", 1, _Flooder(b"x" * size, count, batch))
    start = time.perf_counter()  # includes the rendezvous: a handful of pump steps
    pump.run_until_idle()
    pump.close_trace()
    elapsed = time.perf_counter() - start
    got = accept.queues[0].statistics().messages_received
    if got != count:
        raise RunError(f"rdvpump bench delivered {got} of {count} messages")
    return elapsed


def rdvpump_async(size: int, count: int, *, batch: int = 0) -> float:
    """Seconds to move ``count`` messages through the async face between two brokers of a
    universe served by trio: ``await send`` / ``async for`` per message, or with ``batch``
    ``await send_many`` of that many and ``await receive_many``."""
    from brokermgr import open_universe

    msg = b"x" * size

    async def main() -> float:
        async with open_universe("bench", ring_capacity=1 << 18, high_water=1 << 20,
                                 max_message_size=max(1 << 20, size)) as universe:
            producer, consumer = universe.add_broker("producer"), universe.add_broker("consumer")
            got = [0]
            done = trio.Event()

            async def drain(queue: AsyncMessageQueue) -> None:
                if batch:
                    while got[0] < count:
                        got[0] += len(await queue.receive_many())
                else:
                    async for _ in queue:
                        got[0] += 1
                        if got[0] == count:
                            break
                done.set()

            async with trio.open_nursery() as nursery:
                await nursery.start(consumer.serve_queues, 1, drain)
                queue = await producer.connect_queue("consumer", 1)
                start = time.perf_counter()
                if batch:
                    chunk = [msg] * batch
                    for _ in range(count // batch):
                        await queue.send_many(chunk)
                    await queue.send_many(chunk[:count % batch])
                else:
                    for _ in range(count):
                        await queue.send(msg)
                await done.wait()
                elapsed = time.perf_counter() - start
                nursery.cancel_scope.cancel()
        if got[0] != count:
            raise RunError(f"async face delivered {got[0]} of {count}")
        return elapsed

    return trio.run(main)


def trio_memory_channel(size: int, count: int) -> float:
    """Seconds to move ``count`` messages through a trio memory channel, awaited both ways."""
    msg = b"x" * size

    async def main() -> float:
        send, receive = trio.open_memory_channel[bytes](1024)

        async def produce() -> None:
            async with send:
                for _ in range(count):
                    await send.send(msg)

        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(produce)
            n = 0
            async for _ in receive:
                n += 1
        if n != count:
            raise RunError(f"trio memory channel delivered {n} of {count}")
        return time.perf_counter() - start

    return trio.run(main)


def pyzmq_inproc(size: int, count: int) -> float:
    """Seconds for pyzmq inproc PUSH/PULL in one thread (send until EAGAIN, then drain)."""
    import zmq

    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    pull = ctx.socket(zmq.PULL)
    push.setsockopt(zmq.SNDHWM, 10_000)
    pull.setsockopt(zmq.RCVHWM, 10_000)
    push.bind("inproc://bench")
    pull.connect("inproc://bench")
    msg = b"x" * size
    # Copying sends: they beat zero-copy even at 64 KiB in one thread (bench/RESULTS.md),
    # and zero-copy stalls with thousands in flight.
    copy = True
    send, recv, again = push.send, pull.recv, zmq.Again
    noblock = zmq.NOBLOCK
    start = time.perf_counter()
    sent = received = 0
    try:
        while received < count:
            try:
                while sent < count:
                    send(msg, noblock, copy=copy)
                    sent += 1
            except again:
                pass
            try:
                while received < sent:
                    recv(noblock)
                    received += 1
            except again:
                pass
        return time.perf_counter() - start
    finally:
        push.close(linger=0)
        pull.close(linger=0)
        ctx.term()


def run(sizes: list[int], *, scale: float = 1.0, repeat: int = 3,
        trace: str | None = None, progress: Callable[[str], None] | None = None
        ) -> Iterator[Result]:
    """Measure every size; yield one Result per (size, rdvpump case, baseline).

    The cases and baselines of one size run interleaved, ``repeat`` rounds, and
    each keeps its best round, so a noisy moment on the machine hits them alike.
    """
    try:
        import zmq  # noqa: F401
        have_zmq = True
    except ImportError:
        have_zmq = False
    for size in sizes:
        count = messages_for(size, DEFAULT_COUNTS, 2**27, scale)
        tcount = max(1000, count // 10)  # trio channels are slower: fewer messages suffice
        ours_case = "rdvpump-inproc" + (f"-traced-{trace}" if trace else "")
        runs: dict[str, tuple[int, Callable[[], float]]] = {
            ours_case: (count, partial(rdvpump_inproc, size, count, trace=trace)),
        }
        baselines: list[str] = []
        if trace:
            runs["rdvpump-inproc"] = (count, partial(rdvpump_inproc, size, count))
            baselines.append("rdvpump-inproc")
        else:
            runs["rdvpump-inproc-send-many"] = (
                count, partial(rdvpump_inproc, size, count, batch=BATCH))
            runs["rdvpump-async-await-each"] = (tcount, partial(rdvpump_async, size, tcount))
            runs["rdvpump-async-send-many"] = (
                count // 2, partial(rdvpump_async, size, count // 2, batch=BATCH))
            runs["trio-memory-channel"] = (tcount, partial(trio_memory_channel, size, tcount))
            baselines.append("trio-memory-channel")
            if have_zmq:
                runs["pyzmq-inproc-push-pull"] = (count, partial(pyzmq_inproc, size, count))
                baselines.append("pyzmq-inproc-push-pull")
        best: dict[str, float] = {}
        for round_ in range(repeat):
            for name, (n, fn) in runs.items():
                if progress:
                    progress(f"{size} B x {n}: {name} (round {round_ + 1}/{repeat})")
                rate = n / fn()
                best[name] = max(best.get(name, 0.0), rate)
        cases = [c for c in runs if c not in baselines]
        for case in cases:
            for name in baselines:
                ours, theirs = best[case], best[name]
                yield Result(case, size, ours, ours * size / 1e6, name, theirs,
                             ours / theirs if theirs else math.nan)
