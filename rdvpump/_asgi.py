"""An ASGI app served on the running trio loop, as ``--metrics`` and ``rdvpump console``
serve their pages: hypercorn's trio worker, no access log, and a lifespan the app does
not need to answer itself."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import trio

from ._errors import first_leaf

App = Callable[[Any, Any, Any], Awaitable[None]]


async def serve_asgi(app: App, host: str, port: int, *,
                     task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve ``app`` on ``host:port`` (0: a port the kernel picks) until cancelled;
    ``task_status.started("HOST:PORT")`` once it listens."""
    from hypercorn.config import Config
    from hypercorn.trio import serve

    async def with_lifespan(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":  # nothing to start or stop: said so at once
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        await app(scope, receive, send)

    config = Config()
    config.bind = [f"{host}:{port}"]
    config.accesslog = None
    config.loglevel = "WARNING"
    async with trio.open_nursery() as nursery:
        try:
            binds = await nursery.start(
                lambda task_status: serve(with_lifespan, config, task_status=task_status))
        except* OSError as failed:  # the address taken, or not this machine's
            exc = first_leaf(failed)  # hypercorn's nurseries nest the OSError
            assert isinstance(exc, OSError)
            why = (exc.strerror or str(exc)).lower()
            raise OSError(f"cannot serve on {host}:{port}: {why}") from None
        task_status.started(binds[0].removeprefix("http://"))
