"""`serve_console`: the console's shell — the store, the live view, the HTTP server."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable, Iterator

import uvicorn

from ballast import heap
from ballast.clock import SystemClock
from ballast.cluster.admin import AdminClient
from ballast.config import BallastConfig
from ballast.console.app import create_app
from ballast.console.live import LiveCluster
from ballast.metadata import keys
from ballast.metadata.factory import open_store
from ballast.wire.auth import TokenAuthority

log = logging.getLogger(__name__)


class _Server(uvicorn.Server):
    """uvicorn's server without its own signal handling: the console installs its own
    (set `stopping` to end the event streams, then shut down), and exits 0."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def parse_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` → (host, port); ValueError says what is wrong."""
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"--listen {listen!r}: expected HOST:PORT, e.g. 127.0.0.1:8080")
    return host.strip("[]"), int(port)


async def serve_console(
    etcd: str | None,
    listen: str,
    config: BallastConfig,
    *,
    on_started: Callable[[str], None] | None = None,
) -> None:
    """Serve the console on `listen` until SIGINT/SIGTERM."""
    host, port = parse_listen(listen)
    authority = TokenAuthority(config.auth) if config.auth.mode == "jwt" else None
    clock = SystemClock()
    store = open_store(etcd, clock)
    stopping = asyncio.Event()
    async with store:
        # Fail fast, as every admin command does, if the store cannot be reached at all;
        # once serving, the live view survives outages (it re-lists and catches up).
        await store.get(keys.LEADER)
        admin = AdminClient(store, clock, config)
        async with LiveCluster(store, clock, admin=admin) as live:
            await live.current_frame()
            # The listed view is long-lived: keep the collector from re-scanning it (at 100 000
            # topics a full collection would otherwise stall requests for hundreds of ms).
            heap.settle()
            app = create_app(
                live, authority=authority, store_label=etcd or "embedded", stopping=stopping
            )
            server = _Server(
                uvicorn.Config(
                    app,
                    host=host,
                    port=port,
                    log_level="warning",
                    lifespan="off",
                    timeout_graceful_shutdown=2,
                )
            )
            loop = asyncio.get_running_loop()

            def stop() -> None:
                stopping.set()
                server.should_exit = True

            serving = asyncio.ensure_future(server.serve())
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop)
            while not server.started and not serving.done():
                await asyncio.sleep(0.05)
            if server.started:
                bound = server.servers[0].sockets[0].getsockname()
                url = f"http://{bound[0]}:{bound[1]}"
                log.info("console: serving on %s", url)
                if on_started is not None:
                    on_started(url)
            await serving
