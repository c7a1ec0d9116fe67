"""A console served for real (uvicorn on a free port) over a `LiveCluster`."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import uvicorn

from ballast.cluster.admin import AdminClient
from ballast.console import LiveCluster, create_app
from ballast.wire.auth import TokenAuthority


@contextlib.asynccontextmanager
async def serving(
    admin: AdminClient,
    *,
    authority: TokenAuthority | None = None,
    frame_seconds: float = 0.1,
) -> AsyncIterator[tuple[str, LiveCluster]]:
    """The console's URL and its live cluster, until exit (streams ended, server stopped)."""
    stopping = asyncio.Event()
    async with LiveCluster(
        admin.store, admin.clock, admin=admin, frame_seconds=frame_seconds
    ) as live:
        app = create_app(live, authority=authority, stopping=stopping)
        config = uvicorn.Config(
            app, host="127.0.0.1", port=0, log_level="warning", lifespan="off",
            timeout_graceful_shutdown=1,
        )  # fmt: skip
        server = uvicorn.Server(config)
        server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign,assignment]
        task = asyncio.ensure_future(server.serve())
        try:
            async with asyncio.timeout(10):
                while not server.started:
                    if task.done():
                        task.result()
                    await asyncio.sleep(0.02)
            host, port = server.servers[0].sockets[0].getsockname()[:2]
            yield f"http://{host}:{port}", live
        finally:
            stopping.set()
            server.should_exit = True
            await task
