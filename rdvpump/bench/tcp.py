"""``rdvpump bench tcp``: two processes on loopback, message by message, beside pyzmq and trio.

The receiving side runs in a child process (``peer_main``); this process
sends.  Throughput cases time ``count`` messages until the receiver, having
delivered every one to its listener, answers "done".  Round trips time a 64 B
ping-pong one message at a time.  CPU placement: ``split`` pins the two
processes to different cores, ``same`` pins both to core 0.  The hand-written trio
baseline's sockets have the congestion control rdvpump's links on one host have
(:data:`rdv.LOCAL_CONGESTION`); pyzmq's keep the system's, which it has no option to
change.
"""

from __future__ import annotations

import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import trio

from brokermgr import BrokerManager
from channels import DEFAULT_ADAPTIVE_POLL, MessageQueue, QueueFullError
from pump import ConfigError
from rdv import local_congestion, open_tcp_stream

from .._errors import RunError
from ._result import Result, messages_for

DEFAULT_COUNTS = {64: 500_000, 1024: 300_000, 65536: 20_000}
PINGS = 5_000
#: Messages per ``send_many`` of the async face's batched case.
ASYNC_BATCH = 256
TOKEN = "bench"
DONE = b"done"


# -- the receiving side, in a child process ------------------------------------------------

def peer_main(argv: list[str] | None = None) -> None:
    """``python -m rdvpump.bench.tcp KIND COUNT CPU [POLL]``: POLL is ``adaptive`` (the
    default), ``off``, or seconds of busy polling."""
    args = argv or sys.argv[1:]
    kind, count, cpu = args[:3]
    global _POLL
    mode = args[3] if len(args) > 3 else ADAPTIVE
    _POLL = mode if mode in (ADAPTIVE, OFF) else float(mode)
    if int(cpu) >= 0:
        os.sched_setaffinity(0, {int(cpu)})
    {"rdv-sink": _rdv_peer, "rdv-echo": _rdv_peer, "zmq-sink": _zmq_sink,
     "zmq-echo": _zmq_echo, "trio-sink": _trio_sink}[kind](kind, int(count))


#: Round-trip polling modes: the default (adaptive polling), none at all, or a float:
#: seconds of busy polling.
ADAPTIVE, OFF = "adaptive", "off"


def _universe(mode: str | float, **options: Any) -> BrokerManager:
    """The bench's universe with a polling mode."""
    busy = 0.0 if mode in (ADAPTIVE, OFF) else float(mode)
    adaptive = 0.0 if mode == OFF else DEFAULT_ADAPTIVE_POLL
    return BrokerManager("bench", token=TOKEN, busy_poll=busy, adaptive_poll=adaptive,
                         **options)


_POLL: str | float = ADAPTIVE  # the peer's, from its command line


def _ready(*ports: int) -> None:
    print("ready", *ports, flush=True)


def _rdv_peer(kind: str, count: int) -> None:
    async def main() -> None:
        u = _universe(_POLL)
        peer = u.add_broker("peer")

        class Conn:
            n = 0

            def __init__(self, queue: MessageQueue) -> None:
                self.queue = queue

            def received(self, message: bytes) -> None:
                if kind == "rdv-echo":
                    self.queue.send(message)
                    return
                self.n += 1
                if self.n == count:
                    self.queue.send(DONE)

            def closed(self, reason: str) -> None:
                pass

        class Acceptor:
            def accepted(self, queue: MessageQueue) -> None:
                queue.set_listener(Conn(queue))

        peer.listen(1, Acceptor())
        async with trio.open_nursery() as nursery:
            await nursery.start(u.pump.serve)
            address = await nursery.start(u.serve_network)
            _ready(address[1])

    trio.run(main)


def _zmq_sink(kind: str, count: int) -> None:
    import zmq

    ctx = zmq.Context()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    a, b = pull.bind_to_random_port("tcp://127.0.0.1"), push.bind_to_random_port(
        "tcp://127.0.0.1")
    _ready(a, b)
    recv = pull.recv
    for _ in range(count):
        recv(copy=True)
    push.send(DONE)
    time.sleep(3600)  # the parent kills us


def _zmq_echo(kind: str, count: int) -> None:
    import zmq

    ctx = zmq.Context()
    rep = ctx.socket(zmq.REP)
    _ready(rep.bind_to_random_port("tcp://127.0.0.1"))
    while True:
        rep.send(rep.recv())


def _trio_sink(kind: str, count: int) -> None:
    """The hand-written baseline: receive_some into a buffer, parse length-prefixed frames."""

    async def main() -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        local_congestion(listeners[0].socket)  # as rdvpump's links on one host
        _ready(listeners[0].socket.getsockname()[1])
        stream = await listeners[0].accept()
        buf = bytearray()
        n = 0
        delivered: list[bytes] = []
        deliver = delivered.append
        while n < count:
            data = await stream.receive_some(1 << 16)
            if not data:
                return
            buf += data
            off = 0
            end = len(buf)
            while end - off >= 4:
                size = int.from_bytes(buf[off:off + 4], "big")
                if end - off - 4 < size:
                    break
                deliver(bytes(buf[off + 4:off + 4 + size]))
                off += 4 + size
                n += 1
            del buf[:off]
            delivered.clear()
        await stream.send_all(DONE)
        await trio.sleep_forever()

    trio.run(main)


class Peer:
    """A child process running one receiving side; ``ports`` from its ready line."""

    def __init__(self, kind: str, count: int, cpu: int, poll: str | float = ADAPTIVE) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rdvpump.bench.tcp", kind,
             str(count), str(cpu), str(poll)], stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().split()
        if not line or line[0] != "ready":
            self.close()
            raise RunError(f"bench peer {kind} did not start")
        self.ports = [int(p) for p in line[1:]]

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def __enter__(self) -> Peer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- the sending side, in this process -----------------------------------------------------

def rdv_stream(port: int, size: int, count: int) -> float:
    """Seconds for ``count`` messages from a listener-API producer to the peer's listener."""
    msg = b"x" * size

    async def main() -> float:
        u = BrokerManager("bench", token=TOKEN, directory={"peer": ("127.0.0.1", port)})
        me = u.add_broker("src")
        done = trio.Event()
        start = [0.0]

        class Flooder:
            left = count

            def connected(self, queue: MessageQueue) -> None:
                self.queue = queue
                queue.set_listener(self)
                start[0] = time.perf_counter()
                self.drained()

            def refused(self, reason: str) -> None:
                raise RunError(reason)

            def drained(self) -> None:
                send, left, sent = self.queue.send, self.left, 0
                try:
                    for sent in range(1, left + 1):  # noqa: B007
                        send(msg)
                except QueueFullError:
                    sent -= 1
                self.left = left - sent

            def received(self, message: bytes) -> None:
                done.set()

            def closed(self, reason: str) -> None:
                done.set()

        async with trio.open_nursery() as nursery:
            await nursery.start(u.pump.serve)
            await nursery.start(u.serve_network)
            me.connect("peer", 1, Flooder())
            await done.wait()
            elapsed = time.perf_counter() - start[0]
            nursery.cancel_scope.cancel()
        return elapsed

    return trio.run(main)


def rdv_async_stream(port: int, size: int, count: int, *, batch: int = 0) -> float:
    """Seconds for ``count`` messages from the async face to the peer's listener: ``await
    send`` per message, or ``send_many`` with lists of ``batch`` messages."""
    msg = b"x" * size

    async def main() -> float:
        u = BrokerManager("bench", token=TOKEN, directory={"peer": ("127.0.0.1", port)})
        async with trio.open_nursery() as nursery:
            await nursery.start(u.pump.serve)
            await nursery.start(u.serve_network)
            queue = await u.add_broker("src").connect_queue("peer", 1)
            start = time.perf_counter()
            if batch:
                chunk = [msg] * batch
                for first in range(0, count, batch):
                    await queue.send_many(chunk if first + batch <= count
                                          else chunk[:count - first])
            else:
                for _ in range(count):
                    await queue.send(msg)
            if await queue.receive() != DONE:
                raise RunError("bench tcp: the peer did not answer done")
            elapsed = time.perf_counter() - start
            nursery.cancel_scope.cancel()
        return elapsed

    return trio.run(main)


def rdv_ping(port: int, pings: int, poll: str | float = ADAPTIVE) -> list[float]:
    """Round-trip times (s) of 64 B messages, one at a time, chained in listener callbacks."""
    msg = b"p" * 64

    async def main() -> list[float]:
        u = _universe(poll, directory={"peer": ("127.0.0.1", port)})
        me = u.add_broker("src")
        done = trio.Event()
        rtts: list[float] = []

        class Pinger:
            t0 = 0.0

            def connected(self, queue: MessageQueue) -> None:
                self.queue = queue
                queue.set_listener(self)
                self.t0 = time.perf_counter()
                queue.send(msg)

            def refused(self, reason: str) -> None:
                raise RunError(reason)

            def received(self, message: bytes) -> None:
                now = time.perf_counter()
                rtts.append(now - self.t0)
                if len(rtts) == pings:
                    done.set()
                    return
                self.t0 = time.perf_counter()
                self.queue.send(msg)

            def closed(self, reason: str) -> None:
                done.set()

        async with trio.open_nursery() as nursery:
            await nursery.start(u.pump.serve)
            await nursery.start(u.serve_network)
            me.connect("peer", 1, Pinger())
            await done.wait()
            nursery.cancel_scope.cancel()
        return rtts

    return trio.run(main)


def zmq_stream(ports: list[int], size: int, count: int) -> float:
    import zmq

    ctx = zmq.Context()
    push, pull = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
    push.connect(f"tcp://127.0.0.1:{ports[0]}")
    pull.connect(f"tcp://127.0.0.1:{ports[1]}")
    msg = b"x" * size
    copy = size < 65536  # zero-copy for large messages, as pyzmq advises
    send = push.send
    try:
        start = time.perf_counter()
        for _ in range(count):
            send(msg, copy=copy)  # type: ignore[call-overload]
        pull.recv()
        return time.perf_counter() - start
    finally:
        ctx.destroy(linger=0)


def zmq_ping(port: int, pings: int) -> list[float]:
    import zmq

    ctx = zmq.Context()
    req = ctx.socket(zmq.REQ)
    req.connect(f"tcp://127.0.0.1:{port}")
    msg = b"p" * 64
    rtts = []
    try:
        for _ in range(pings):
            t0 = time.perf_counter()
            req.send(msg)
            req.recv()
            rtts.append(time.perf_counter() - t0)
        return rtts
    finally:
        ctx.destroy(linger=0)


def trio_stream(port: int, size: int, count: int) -> float:
    """The hand-written baseline's sender: frames built in batches, one send_all per batch."""
    frame = size.to_bytes(4, "big") + b"x" * size
    per_batch = max(1, (1 << 16) // len(frame))

    async def main() -> float:
        stream = await open_tcp_stream(("127.0.0.1", port))
        start = time.perf_counter()
        left = count
        while left:
            k = min(left, per_batch)
            await stream.send_all(frame * k)
            left -= k
        await stream.receive_some(16)
        elapsed = time.perf_counter() - start
        await stream.aclose()
        return elapsed

    return trio.run(main)


def _on_port(fn: Callable[[int, int, int], float], size: int, count: int, peer: Peer) -> float:
    return fn(peer.ports[0], size, count)


def _on_ports(fn: Callable[[list[int], int, int], float], size: int, count: int,
              peer: Peer) -> float:
    return fn(peer.ports, size, count)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(math.ceil(q * len(ordered))) - 1)] * 1e6


def run(sizes: list[int], *, scale: float = 1.0, repeat: int = 3, placement: str = "split",
        busy_poll: float = 100e-6,
        progress: Callable[[str], None] | None = None) -> Iterator[Result]:
    """Yield one Result per (size, baseline), then the round-trip results.

    The round trip is measured with default settings (adaptive polling), with no
    polling at all and, with ``split`` placement and ``busy_poll`` > 0, with both sides
    busy-polling.
    """
    if placement not in ("split", "same"):
        raise ConfigError("placement must be 'split' or 'same'")
    ncpu = len(os.sched_getaffinity(0))
    me_cpu, peer_cpu = (0, 1) if placement == "split" and ncpu > 1 else (0, 0)
    old_affinity = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {me_cpu})
    try:
        for size in sizes:
            yield from _streams(size, scale, repeat, placement, peer_cpu, progress)
        yield from _round_trips(scale, placement, busy_poll if me_cpu != peer_cpu else 0.0,
                                peer_cpu, progress)
    finally:
        os.sched_setaffinity(0, old_affinity)


def _streams(size: int, scale: float, repeat: int, placement: str, peer_cpu: int,
             progress: Callable[[str], None] | None) -> Iterator[Result]:
    """A stream of ``size``-byte messages: each rdvpump case against each baseline, the
    cases interleaved over ``repeat`` rounds, each case's best round kept."""
    count = messages_for(size, DEFAULT_COUNTS, 2**25, scale)
    best: dict[str, float] = {}
    cases: list[tuple[str, str, Callable[[Peer], float]]] = [
        ("rdvpump-tcp", "rdv-sink", partial(_on_port, rdv_stream, size, count)),
        ("rdvpump-tcp-async-await-each", "rdv-sink",
         partial(_on_port, rdv_async_stream, size, count)),
        ("rdvpump-tcp-async-send-many", "rdv-sink",
         partial(_on_port, partial(rdv_async_stream, batch=ASYNC_BATCH), size, count)),
        ("pyzmq-tcp-push-pull", "zmq-sink", partial(_on_ports, zmq_stream, size, count)),
        ("trio-batched-framing", "trio-sink", partial(_on_port, trio_stream, size, count)),
    ]
    for round_ in range(repeat):
        for name, kind, fn in cases:
            if progress:
                progress(f"{size} B x {count}: {name} ({round_ + 1}/{repeat})")
            with Peer(kind, count, peer_cpu) as peer:
                best[name] = max(best.get(name, 0.0), count / fn(peer))
    for case in ("rdvpump-tcp", "rdvpump-tcp-async-await-each", "rdvpump-tcp-async-send-many"):
        ours = best[case]
        for name in ("pyzmq-tcp-push-pull", "trio-batched-framing"):
            yield Result(case, size, ours, ours * size / 1e6, name, best[name],
                         ours / best[name], placement=placement)


def _round_trips(scale: float, placement: str, busy_poll: float, peer_cpu: int,
                 progress: Callable[[str], None] | None) -> Iterator[Result]:
    """64 B ping-pong, with default settings (adaptive polling), with no polling, and
    (``busy_poll`` > 0: the two processes on two cores) both sides busy-polling."""
    pings = max(200, int(PINGS * scale))
    if progress:
        progress(f"64 B ping-pong x {pings}")
    polls: list[str | float] = [ADAPTIVE, OFF]
    if busy_poll > 0:
        polls.append(busy_poll)
    rtts: dict[str | float, list[float]] = {}
    with Peer("zmq-echo", 0, peer_cpu) as peer:
        theirs_rtt = zmq_ping(peer.ports[0], pings)
    for poll in polls:
        with Peer("rdv-echo", 0, peer_cpu, poll) as peer:
            rtts[poll] = rdv_ping(peer.ports[0], pings, poll)
    theirs_med = statistics.median(theirs_rtt)
    for poll in polls:
        ours_rtt = rtts[poll]
        ours_med = statistics.median(ours_rtt)
        case = "rdvpump-tcp-round-trip" + (
            "" if poll == ADAPTIVE else "-no-polling" if poll == OFF
            else f"-busy-poll-{float(poll) * 1e6:.0f}us")
        yield Result(case, 64, 1 / ours_med, 64 / ours_med / 1e6,
                     "pyzmq-tcp-req-rep", 1 / theirs_med, theirs_med / ours_med,
                     median_us=ours_med * 1e6, p99_us=_pct(ours_rtt, 0.99),
                     baseline_median_us=theirs_med * 1e6,
                     baseline_p99_us=_pct(theirs_rtt, 0.99), placement=placement)


if __name__ == "__main__":
    peer_main()
