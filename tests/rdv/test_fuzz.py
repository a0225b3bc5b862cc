"""Resource limits of the network side: unauthenticated handshakes are capped."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from brokermgr import BrokerManager
from pump import Pump


async def test_pending_handshakes_are_capped(autojump_clock: object) -> None:
    ub = BrokerManager("u", pump=Pump(), token="t")
    ub.net.handshake_timeout = 5.0
    ub.net._pending = trio.Semaphore(2)
    async with trio.open_nursery() as nursery:
        await nursery.start(ub.pump.serve)
        start = trio.current_time()
        ends: list[float] = []

        async def silent() -> None:
            ours, theirs = trio.testing.memory_stream_pair()
            nursery.start_soon(ub.net.run_stream, ours)
            assert await theirs.receive_some(10) == b""
            ends.append(trio.current_time() - start)

        async with trio.open_nursery() as peers:
            for _ in range(3):
                peers.start_soon(silent)
        # two held a handshake slot each; the third waited for a slot, then timed out
        assert sorted(ends) == [pytest.approx(5.0), pytest.approx(5.0), pytest.approx(10.0)]
        nursery.cancel_scope.cancel()
