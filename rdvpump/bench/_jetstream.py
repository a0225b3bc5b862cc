"""``rdvpump bench failover``'s baseline: NATS JetStream (Debian's ``nats-server -js``)
on one server and as a three-node cluster on 127.0.0.1, through ``nats-py``: its
throughput published as ours is (awaited, then in batches), and the time from its
stream leader's SIGKILL to the first acknowledged publish (:mod:`.failover` says how)."""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._errors import RunError
from ._failover_results import BATCHED, DEADLINE, SIZE, FailoverResult
from ._ports import free_ports


class NatsServers:
    """``count`` ``nats-server -js`` processes on 127.0.0.1, in one cluster when more
    than one; each started again by :meth:`start`, every one killed and reaped by
    :meth:`close`."""

    def __init__(self, count: int, tmp: Path) -> None:
        binary = shutil.which("nats-server")
        if binary is None:
            raise RunError("nats-server not found: apt-get install nats-server")
        self.binary, self.count, self.tmp = binary, count, tmp
        picked = free_ports(2 * count)
        self.ports, self.routes = picked[:count], picked[count:]
        self.procs: list[subprocess.Popen[bytes]] = []
        for i in range(count):
            self.procs.append(self._popen(i))

    def _popen(self, i: int) -> subprocess.Popen[bytes]:
        args = [self.binary, "-a", "127.0.0.1", "-p", str(self.ports[i]), "-n", f"n{i}",
                "-js", "-sd", str(self.tmp / f"nats{i}")]
        if self.count > 1:
            others = ",".join(f"nats://127.0.0.1:{self.routes[j]}"
                              for j in range(self.count) if j != i)
            args += ["--cluster_name", "bench", "--cluster",
                     f"nats://127.0.0.1:{self.routes[i]}", "--routes", others]
        return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def start(self, i: int) -> None:
        self.procs[i] = self._popen(i)

    async def connect(self) -> Any:
        import nats

        async def quiet(*_: Any) -> None:
            """The client's reconnects to a killed server are the scenario, not news."""

        return await nats.connect(
            servers=[f"nats://127.0.0.1:{p}" for p in self.ports],
            reconnect_time_wait=0.05, max_reconnect_attempts=-1, connect_timeout=2,
            allow_reconnect=True, error_cb=quiet, disconnected_cb=quiet,
            reconnected_cb=quiet)

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)


async def _nats_rates(js: Any, messages: int, publishers: int) -> tuple[float, float]:
    """JetStream's awaited and batched throughputs, published as ours are: 1 KiB
    messages from ``publishers`` concurrent publishers each awaiting its
    acknowledgement; then in batches (``publish_async``, the batch's acknowledgements
    awaited together), as many in flight as ours."""
    from .mq import IN_FLIGHT, batch_for

    body = b"x" * SIZE
    per = max(1, messages // publishers)

    async def publisher() -> None:
        for _ in range(per):
            await js.publish("bench", body)

    start = time.perf_counter()
    await asyncio.gather(*(publisher() for _ in range(publishers)))
    awaited = publishers * per / (time.perf_counter() - start)
    left = [BATCHED * messages]

    async def batches() -> None:
        while left[0] > 0:
            n = min(batch_for(SIZE), left[0])
            left[0] -= n
            await asyncio.gather(*[await js.publish_async("bench", body) for _ in range(n)])

    start = time.perf_counter()
    await asyncio.gather(*(batches() for _ in range(IN_FLIGHT)))
    return awaited, BATCHED * messages / (time.perf_counter() - start)


async def jetstream(trials: int, messages: int, publishers: int, tmp: Path,
                progress: Callable[[str], None]
                ) -> tuple[FailoverResult, dict[tuple[str, str], float]]:
    """JetStream's throughputs on one server and at R = 3, then the R = 3 trials."""
    rates: dict[tuple[str, str], float] = {}
    loop = asyncio.get_running_loop()
    for count in (1, 3):
        label = "single" if count == 1 else "r3"
        progress(f"NATS {label}: starting")
        servers = NatsServers(count, tmp / f"nats-{label}")
        nc = None
        try:
            nc = await servers.connect()
            js = nc.jetstream(timeout=10)
            await _nats_stream(js, loop.time() + DEADLINE, count)
            rates[(label, "awaited")], rates[(label, "batched")] = await _nats_rates(
                js, messages, publishers)
            if count == 3:
                js = nc.jetstream(timeout=2)
                result = await _nats_trials(servers, js, trials, progress)
        finally:
            if nc is not None:
                await nc.close()
            servers.close()
    return result, rates


async def _nats_trials(servers: NatsServers, js: Any, trials: int,
                       progress: Callable[[str], None]) -> FailoverResult:
    """Each trial SIGKILLs the stream's leader once every replica is current, and times
    the first acknowledged publish after it."""
    result = FailoverResult("failover-nats-jetstream-r3-sigkill", trials)
    loop = asyncio.get_running_loop()
    body = b"x" * SIZE
    for trial in range(trials):
        leader = await _nats_current(js, loop.time() + DEADLINE)
        progress(f"NATS: trial {trial + 1} of {trials}, leader {leader}")
        await js.publish("bench", body)
        i = int(leader[1:])
        begin = time.perf_counter()
        servers.procs[i].send_signal(signal.SIGKILL)
        await _nats_acked(js, body, begin)
        result.seconds.append(time.perf_counter() - begin)
        servers.procs[i].wait(timeout=10)
        servers.start(i)
    return result


async def _nats_stream(js: Any, deadline: float, replicas: int) -> None:
    """The bench stream (file storage, JetStream's default), once the cluster has elected
    its meta leader."""
    from nats.js.api import StreamConfig

    while True:
        try:
            await js.add_stream(StreamConfig(name="bench", subjects=["bench"],
                                             num_replicas=replicas))
            return
        except Exception:  # noqa: BLE001 - not ready yet: tried again, bounded
            if asyncio.get_running_loop().time() > deadline:
                raise RunError("the NATS cluster did not take the stream") from None
            await asyncio.sleep(0.1)


async def _nats_acked(js: Any, body: bytes, begin: float) -> None:
    """Publish until one is acknowledged (a new leader elected), within the deadline."""
    while True:
        try:
            await js.publish("bench", body, timeout=0.25)
            return
        except Exception:  # noqa: BLE001 - no leader yet: tried again, bounded
            if time.perf_counter() - begin > DEADLINE:
                raise RunError("NATS: no acknowledged publish after the leader's "
                               "kill") from None


async def _nats_current(js: Any, deadline: float) -> str:
    """The stream's leader once every replica is current."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            info = await js.stream_info("bench")
            cluster = info.cluster
            replicas = cluster.replicas or []
            if cluster.leader and len(replicas) == 2 and all(
                    r.current and not r.offline for r in replicas):
                return str(cluster.leader)
        except Exception:  # noqa: BLE001 - a cluster still electing: asked again, bounded
            pass
        if loop.time() > deadline:
            raise RunError("NATS: the stream's replicas did not all become current")
        await asyncio.sleep(0.05)
