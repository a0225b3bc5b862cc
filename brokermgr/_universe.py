"""``open_universe``: a universe whose pump trio serves for the duration of a block,
alone or joined over TCP to the managers of other processes (through a
:class:`~brokermgr.NameClient`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any

import trio

from pump import Pump, TraceRecorder, open_trace
from rdv import Address

from ._broker import BrokerManager
from ._names import DEFAULT_MANAGER_PORT, NameClient


@asynccontextmanager
async def open_universe(name: str, *, seed: int = 0, trace: TraceRecorder | None = None,
                        trace_dir: str | None = None, trace_format: str = "jsonl",
                        run: str | None = None, managers: Iterable[str | Address] = (),
                        listen: str | Address = "127.0.0.1:0", connect_timeout: float = 10.0,
                        **options: Any) -> AsyncIterator[BrokerManager]:
    """A universe whose pump is served by trio for the duration of the block.

    ``options`` are those of :class:`BrokerManager` (``ring_capacity``, ``token``, ...).
    With ``trace_dir`` the pump records a trace there (``trace_format`` jsonl
    or parquet; ``run`` names the run, by default ``<name>-<seed>``); or pass
    a recorder as ``trace``.  On exit every broker is closed, the pump stops
    and the trace file is complete.

    With ``managers`` (``HOST:PORT`` of ``rdvpump manager serve`` processes) this
    process joins that universe over TCP: it listens at ``listen``, registers its
    brokers with the managers, and the block starts once one of them has accepted it
    (within ``connect_timeout`` seconds, else :class:`OSError`), so that brokers of
    other processes (``rdvpump broker run``) are reached by id from the first line.
    """
    if trace_dir is not None:
        trace = open_trace(trace_dir, pump=name, run=run or f"{name}-{seed}",
                           format=trace_format)
    addresses = [Address.parse(m, default_port=DEFAULT_MANAGER_PORT)
                 if isinstance(m, str) else m for m in managers]
    manager = BrokerManager(name, pump=Pump(seed=seed, trace=trace, name=name), **options)
    names = None
    failed: OSError | None = None  # raised once the nursery is closed: a plain OSError
    async with trio.open_nursery() as nursery:
        await nursery.start(manager.pump.serve)
        try:
            if addresses:
                where = Address.parse(listen) if isinstance(listen, str) else listen
                await nursery.start(manager.serve_network, where[0], where[1])
                names = NameClient(manager, addresses)
                names.start()
                with trio.move_on_after(connect_timeout) as waited:
                    await names.connected()
                if waited.cancelled_caught:
                    failed = OSError(
                        f"no manager of universe {name!r} accepted this process within "
                        f"{connect_timeout:g} s (dialled: "
                        f"{', '.join(f'{a[0]}:{a[1]}' for a in addresses)})")
            if failed is None:
                yield manager
        finally:
            if names is not None:
                with trio.CancelScope(shield=True):
                    await names.aclose()
            manager.close()
            nursery.cancel_scope.cancel()
    if failed is not None:
        raise failed
    if trace_dir is not None:
        manager.pump.close_trace()
