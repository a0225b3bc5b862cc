"""MQ end to end: a producer process, a server process and a consumer process on 127.0.0.1.

A message counts once it is published, stored as the durability policy says,
delivered and acknowledged; the figure is messages over the time from the
producer's start to the consumer's last ack.  Baselines in the same run:

* Redis Streams: Debian's ``redis-server`` started here on 127.0.0.1 with
  ``appendonly yes`` and ``appendfsync everysec`` (``always`` beside ``sync``),
  a producer process with pipelined ``XADD`` and a consumer process with
  ``XREADGROUP COUNT`` and ``XACK``, batches the same size as ours;
* NATS JetStream: Debian's ``nats-server -js`` started here on 127.0.0.1 (one server,
  file storage), a producer process publishing a batch at a time (each publish's
  acknowledgement awaited together, as a pipeline), and a consumer process on a durable
  pull consumer (``fetch`` in batches, one acknowledgement per batch with the
  ``all`` ack policy), through ``nats-py``.  Its file store fsyncs on its own schedule
  (every two minutes in nats-server 2.9, which has no setting for it): a weaker
  promise than either of ours, so the same baseline stands beside both policies;
* the physical limit: one process appending the same bytes to a file with
  the same fsync policy (every batch for ``sync``, every second otherwise);
* the relay floor: the same bytes through three processes with nothing but blocking
  sockets and the file, fsynced as the plain append (:mod:`._relay`): what the
  processes and the two TCP hops of an MQ between two clients leave of the plain append.

Producers send batches (``publish_many`` / a pipeline) with a few in flight;
the consumer acknowledges in batches.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import trio

from brokermgr import BrokerManager
from channels import keep_freed_memory
from mq import MqClient
from pump import Pump
from rdv import Address

from .._errors import RunError
from ._ports import free_ports
from ._relay import relay_floor

DEFAULT_COUNTS = {64: 200_000, 1024: 100_000, 65536: 4_000}
IN_FLIGHT = 16
UNIVERSE = "bench-mq"


def batch_for(size: int) -> int:
    return max(1, min(200, (256 << 10) // max(size, 1)))


@dataclass(frozen=True)
class MqResult:
    case: str
    size: int
    durability: str
    msgs_per_s: float
    mb_per_s: float
    baseline: str
    baseline_msgs_per_s: float
    ratio: float

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for key in ("msgs_per_s", "mb_per_s", "baseline_msgs_per_s"):
            d[key] = round(d[key], 1)
        d["ratio"] = round(self.ratio, 3)
        return d


# -- children ------------------------------------------------------------------------------

def child_main(argv: list[str] | None = None) -> None:
    """``python -m rdvpump.bench.mq KIND ...``: one side, a JSON line of times on stdout."""
    args = sys.argv[1:] if argv is None else argv
    kind = args[0]
    if kind in ("producer", "consumer"):
        keep_freed_memory()  # as an embedding client moving large messages would
        host, port, size, count = args[1], int(args[2]), int(args[3]), int(args[4])
        print(json.dumps(trio.run(_ours, kind, host, port, size, count)), flush=True)
    elif kind in ("redis-producer", "redis-consumer"):
        port, size, count = int(args[1]), int(args[2]), int(args[3])
        print(json.dumps(_redis(kind, port, size, count)), flush=True)
    elif kind in ("nats-producer", "nats-consumer"):
        import asyncio

        port, size, count = int(args[1]), int(args[2]), int(args[3])
        print(json.dumps(asyncio.run(_nats(kind, port, size, count))), flush=True)
    else:
        raise SystemExit(f"unknown bench child {kind!r}")


async def publish_in_flight(client: MqClient, topic: str, body: bytes, count: int,
                            batch: int, in_flight: int) -> None:
    """``count`` copies of ``body`` to ``topic``, in batches of ``batch``, ``in_flight``
    batches at a time on the client's one link."""
    left = [count]

    async def publisher() -> None:
        while left[0] > 0:
            n = min(batch, left[0])
            left[0] -= n
            await client.publish_many(topic, [body] * n)

    async with trio.open_nursery() as publishers:
        for _ in range(in_flight):
            publishers.start_soon(publisher)


async def _ours(kind: str, host: str, port: int, size: int, count: int) -> dict[str, float]:
    manager = BrokerManager(UNIVERSE, pump=Pump(name=kind))
    manager.directory["s1"] = Address(host, port)
    async with trio.open_nursery() as nursery:
        await nursery.start(manager.pump.serve)
        await nursery.start(manager.serve_network, "127.0.0.1", 0)
        client = MqClient(manager.add_broker(kind), "s1:15555", timeout=60)
        await client.connected()
        batch = batch_for(size)
        if kind == "consumer":
            sub = await client.subscribe("bench", window=max(1000, 2 * batch))
            print("subscribed", flush=True)
            got, first = 0, 0.0
            while got < count:
                taken = await sub.receive_batch()  # columns: no object made per message
                if not got:
                    first = time.time()
                got += len(taken)
                await taken.ack()
            # a reply after the last ack: the server has taken every ack (one link, in
            # order), as Redis's XACK reply and NATS's flush say for theirs
            await client.query("bench")
            result = {"first": first, "end": time.time()}
        else:
            start = time.time()
            await publish_in_flight(client, "bench", b"x" * size, count, batch, IN_FLIGHT)
            result = {"start": start, "end": time.time()}
        client.close()
        nursery.cancel_scope.cancel()
    return result


def _redis(kind: str, port: int, size: int, count: int) -> dict[str, float]:
    import redis

    r: Any = redis.Redis(host="127.0.0.1", port=port)
    batch = batch_for(size)
    if kind == "redis-consumer":
        r.xgroup_create("bench", "g", id="0", mkstream=True)
        print("subscribed", flush=True)
        got, first = 0, 0.0
        while got < count:
            reply = r.xreadgroup("g", "c", {"bench": ">"}, count=max(500, batch), block=5000)
            if not reply:
                continue
            ids = [entry_id for entry_id, _ in reply[0][1]]
            if not got:
                first = time.time()
            got += len(ids)
            r.xack("bench", "g", *ids)
        return {"first": first, "end": time.time()}
    body = b"x" * size
    start = time.time()
    sent = 0
    pipe = r.pipeline(transaction=False)
    while sent < count:
        n = min(batch, count - sent)
        for _ in range(n):
            pipe.xadd("bench", {"b": body})
        pipe.execute()
        sent += n
    return {"start": start, "end": time.time()}


async def _nats(kind: str, port: int, size: int, count: int) -> dict[str, float]:
    import asyncio

    import nats
    from nats.js.api import AckPolicy, ConsumerConfig, StorageType, StreamConfig

    nc = await nats.connect(f"nats://127.0.0.1:{port}", connect_timeout=5)
    js = nc.jetstream(timeout=30)
    batch = batch_for(size)
    if kind == "nats-consumer":
        await js.add_stream(StreamConfig(name="bench", subjects=["bench"],
                                         storage=StorageType.FILE))
        fetched = max(500, batch)
        sub = await js.pull_subscribe("bench", durable="g", config=ConsumerConfig(
            ack_policy=AckPolicy.ALL, max_ack_pending=4 * fetched))
        print("subscribed", flush=True)
        got, first = 0, 0.0
        while got < count:
            try:
                messages = await sub.fetch(fetched, timeout=5)
            except nats.errors.TimeoutError:
                continue
            if not got:
                first = time.time()
            got += len(messages)
            await messages[-1].ack()  # the ``all`` policy: every message up to this one
        await nc.flush()
        result = {"first": first, "end": time.time()}
    else:
        body = b"x" * size
        start = time.time()
        sent = 0
        while sent < count:
            n = min(batch, count - sent)
            # a batch published at once, its acknowledgements awaited together
            await asyncio.gather(*[await js.publish_async("bench", body) for _ in range(n)])
            sent += n
        result = {"start": start, "end": time.time()}
    await nc.close()
    return result


# -- the parent ----------------------------------------------------------------------------

class _Proc:
    """A child of the benchmark: its stdout read as results, its stderr kept in a file
    for the error if it fails.  Children run without ``RDVPUMP_*`` variables: every
    process of the benchmark is in the same universe with the same (empty) token,
    whatever the calling shell exported."""

    def __init__(self, args: list[str], *, ready: str | None = None) -> None:
        self.errors = tempfile.TemporaryFile()  # noqa: SIM115
        env = {k: v for k, v in os.environ.items() if not k.startswith("RDVPUMP_")}
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self.errors,
                                     text=True, env=env)
        self.first = ""
        if ready is not None:
            assert self.proc.stdout is not None
            self.first = self.proc.stdout.readline()
            if not self.first.startswith(ready):
                self.close()
                raise RunError(f"{' '.join(args[1:5])} did not start: "
                                   f"{self.stderr_tail() or 'no output'}")

    def stderr_tail(self) -> str:
        self.errors.seek(0)
        lines = self.errors.read().decode(errors="replace").strip().splitlines()
        return lines[-1] if lines else ""

    def result(self, timeout: float = 600) -> dict[str, float]:
        out, _ = self.proc.communicate(timeout=timeout)
        lines = [line for line in out.splitlines() if line.startswith("{")]
        if self.proc.returncode != 0 or not lines:
            raise RunError(f"bench child failed (exit {self.proc.returncode}): "
                               f"{self.stderr_tail() or 'no output'}")
        return json.loads(lines[-1])  # type: ignore[no-any-return]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.errors.close()


CHILD = [sys.executable, "-m", "rdvpump.bench.mq"]
RDVPUMP = [sys.executable, "-m", "rdvpump"]


def _pair(prefix: str, args: list[str]) -> tuple[dict[str, float], dict[str, float]]:
    """A consumer child (subscribed first), then a producer child: their times."""
    consumer = _Proc([*CHILD, f"{prefix}consumer", *args], ready="subscribed")
    try:
        producer = _Proc([*CHILD, f"{prefix}producer", *args])
        try:
            return producer.result(), consumer.result()
        finally:
            producer.close()
    finally:
        consumer.close()


@contextmanager
def served(durability: str, data: Path) -> Iterator[int]:
    """A manager and an MQ server process (``s1``, topic ``bench``, ``durability``,
    stored in ``data``) on 127.0.0.1: the server's port; both stopped and ``data``
    removed on the way out."""
    manager_port, server_port = free_ports(2)
    manager = _Proc([*RDVPUMP, "manager", "serve", "--universe", UNIVERSE, "--listen",
                     f"127.0.0.1:{manager_port}"], ready="ready")
    try:
        server = _Proc([*RDVPUMP, "broker", "run", "--universe", UNIVERSE, "--id", "s1",
                        "--manager", f"127.0.0.1:{manager_port}", "--listen",
                        f"127.0.0.1:{server_port}", "--role", "server", "--mq-dir", str(data),
                        "--topic", "bench", "--durability", durability],
                       ready="ready")
        try:
            yield server_port
        finally:
            server.proc.send_signal(2)
            server.close()
    finally:
        manager.close()
        shutil.rmtree(data, ignore_errors=True)


def ours(size: int, count: int, durability: str, tmp: Path) -> float:
    """Messages per second end to end through an rdvpump MQ server process."""
    with served(durability, tmp / f"mq-{size}-{durability.replace(':', '')}") as port:
        sent, got = _pair("", ["127.0.0.1", str(port), str(size), str(count)])
    if os.environ.get("RDVPUMP_BENCH_DEBUG"):
        print(f"ours {size} {durability}: produced in {sent['end'] - sent['start']:.3f} s, "
              f"first delivery after {got['first'] - sent['start']:.3f} s, all acked after "
              f"{got['end'] - sent['start']:.3f} s", file=sys.stderr)
    return count / (got["end"] - sent["start"])


def redis_streams(size: int, count: int, appendfsync: str, tmp: Path) -> float:
    """Messages per second end to end through one ``redis-server`` (append-only file)."""
    data = tmp / f"redis-{size}-{appendfsync}"
    return _peer("redis-server", "apt-get install redis-server", lambda port: [
        "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data), "--appendonly",
        "yes", "--appendfsync", appendfsync, "--save", ""], "redis-", data, size, count)


def nats_jetstream(size: int, count: int, tmp: Path) -> float:
    """Messages per second end to end through one ``nats-server -js`` (file storage)."""
    data = tmp / f"nats-{size}"
    return _peer("nats-server", "apt-get install nats-server", lambda port: [
        "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(data)], "nats-", data, size,
        count)


def _peer(binary: str, install: str, args: Callable[[int], list[str]], prefix: str,
          data: Path, size: int, count: int) -> float:
    """A peer's server on a free port of 127.0.0.1 (its files in ``data``), then the
    peer's consumer and producer children (``prefix``): messages per second end to end."""
    found = shutil.which(binary)
    if found is None:
        raise RunError(f"{binary} not found: {install}")
    data.mkdir()
    (port,) = free_ports(1)
    server = subprocess.Popen([found, *args(port)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RunError(f"{binary} did not start") from None
                time.sleep(0.05)
        sent, got = _pair(prefix, [str(port), str(size), str(count)])
    finally:
        server.kill()
        server.wait(timeout=30)
        shutil.rmtree(data, ignore_errors=True)
    return count / (got["end"] - sent["start"])


def plain_append(size: int, count: int, durability: str, tmp: Path) -> float:
    """The physical limit: the same bytes appended to one file, fsynced as the policy says."""
    path = tmp / f"append-{size}"
    batch = batch_for(size)
    chunk = (b"x" * (size + 36)) * batch  # a record header's worth more per message
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        start = last_sync = time.perf_counter()
        written = 0
        while written < count:
            n = min(batch, count - written)
            os.write(fd, chunk if n == batch else chunk[:n * (size + 36)])
            written += n
            now = time.perf_counter()
            if durability == "sync" or now - last_sync >= 1.0:
                os.fsync(fd)
                last_sync = now
        os.fsync(fd)
        elapsed = time.perf_counter() - start
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    return count / elapsed


@dataclass(frozen=True)
class RecoveryResult:
    case: str
    gib: float
    records: int
    segments: int
    seconds: float
    baseline: str
    baseline_seconds: float
    ratio: float

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for key in ("seconds", "baseline_seconds"):
            d[key] = round(d[key], 3)
        d["ratio"] = round(self.ratio, 2)
        return d


def recovery(gib: float = 1.0, size: int = 1024, repeat: int = 3) -> RecoveryResult:
    """Seconds to open a queue of ``gib`` GiB after a clean close (sealed segments come
    back from their indexes once their checksums match, the last one is read whole),
    beside the same queue with every index lost (every segment read record by record).
    The files are in the page cache."""
    from mq import TopicLog

    with tempfile.TemporaryDirectory(prefix="rdvpump-bench-recovery-") as tmp:
        log = TopicLog(tmp)
        body = b"x" * size
        while log.size_bytes < gib * (1 << 30):
            log.append([(None, "p", i, body) for i in range(1000)])
        log.sync()
        log.close()
        best = math.inf
        for _ in range(repeat):
            start = time.perf_counter()
            log = TopicLog(tmp)
            best = min(best, time.perf_counter() - start)
            records, segments = log.next_offset, len(log.segments)
            log.close()
        for index in Path(tmp, "segments").glob("*.idx"):
            index.unlink()
        start = time.perf_counter()
        TopicLog(tmp).close()
        scanned = time.perf_counter() - start
    return RecoveryResult("recover-after-restart", gib, records, segments, best,
                          "every-segment-read-whole", scanned, scanned / best)


def run(sizes: list[int], *, durabilities: list[str], scale: float = 1.0, repeat: int = 1,
        progress: Callable[[str], None] | None = None) -> Iterator[MqResult]:
    # NATS's file store has no fsync policy to set: it is run in the first policy's pass
    # and the same figure stands beside every policy
    nats: dict[int, float] = {}
    with tempfile.TemporaryDirectory(prefix="rdvpump-bench-mq-") as tmp_name:
        tmp = Path(tmp_name)
        for durability in durabilities:
            for size in sizes:
                count = max(1, int(DEFAULT_COUNTS.get(size, 10_000) * scale))
                best: dict[str, float] = {}
                for _ in range(repeat):
                    if progress:
                        progress(f"{size} B, {durability}: rdvpump ...")
                    best["ours"] = max(best.get("ours", 0), ours(size, count, durability, tmp))
                    if progress:
                        progress(f"{size} B, {durability}: Redis Streams ...")
                    fsync = "always" if durability == "sync" else "everysec"
                    best[f"redis-streams-{fsync}"] = max(
                        best.get(f"redis-streams-{fsync}", 0),
                        redis_streams(size, count, fsync, tmp))
                    if durability == durabilities[0]:
                        if progress:
                            progress(f"{size} B: NATS JetStream ...")
                        nats[size] = max(nats.get(size, 0), nats_jetstream(size, count, tmp))
                    best["nats-jetstream-file"] = nats[size]
                    if progress:
                        progress(f"{size} B, {durability}: plain append ...")
                    best["plain-append"] = max(best.get("plain-append", 0),
                                               plain_append(size, count, durability, tmp))
                    if progress:
                        progress(f"{size} B, {durability}: relay floor ...")
                    best["relay-floor"] = max(best.get("relay-floor", 0), relay_floor(
                        size, count, durability, batch_for(size), tmp))
                for name, theirs in best.items():
                    if name == "ours":
                        continue
                    yield MqResult("rdvpump-mq", size, durability, best["ours"],
                                   best["ours"] * size / 1e6, name, theirs,
                                   best["ours"] / theirs)


if __name__ == "__main__":
    child_main()
