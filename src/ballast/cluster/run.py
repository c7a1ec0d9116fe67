"""Run one broker process: ``python -m ballast.cluster.run --etcd URL [--config F] [--id ID]``.

The same `serve` backs ``ballast broker``. It serves until SIGINT or SIGTERM, then leaves
gracefully (topics sealed, leadership handed over, leases revoked). Topics are served by
the data plane (`ballast.broker`: Danube's client protocol on `broker.broker_url`, port 0
picks a free port and the registration carries the real address), or, with
``--profiles idle|mixed``, by a `SyntheticHost` whose traffic is simulated.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable

from ballast import heap
from ballast.broker import DataPlaneHost, DataPlaneServer
from ballast.broker.metrics import DataPlaneMetrics
from ballast.clock import SystemClock
from ballast.cluster.cluster import build_broker
from ballast.cluster.host import (
    HostSampler,
    SyntheticHost,
    TopicHost,
    idle_profiles,
    mixed_profiles,
)
from ballast.cluster.metrics import ClusterMetrics
from ballast.config import BallastConfig, load_config
from ballast.metadata.directory import DEFAULT_NAMESPACE
from ballast.metadata.factory import open_store
from ballast.model import BrokerId, validate_broker_id
from ballast.storage import ObjectStoreMismatchError

log = logging.getLogger(__name__)

PROFILES = {"idle": idle_profiles, "mixed": mixed_profiles}


def default_broker_id(config: BallastConfig) -> BrokerId:
    """`broker.id` from the configuration, else ``{hostname}-{pid}``."""
    if config.broker.id:
        return validate_broker_id(config.broker.id, "broker.id")
    host = "".join(c if c.isalnum() or c in "-_." else "-" for c in socket.gethostname())
    return validate_broker_id(f"{host or 'broker'}-{os.getpid()}")


async def serve(
    etcd: str | None,
    config: BallastConfig,
    broker_id: BrokerId | None = None,
    *,
    profiles: str | None = None,
    synthetic_resources: bool = False,
    on_started: Callable[[BrokerId, str], None] | None = None,
) -> None:
    """Serve one broker until SIGINT/SIGTERM (synthetic topics when `profiles` is given).

    `on_started` gets the broker's id and a line for the operator saying where it serves
    (once it registered and took part in the election)."""
    broker_id = validate_broker_id(broker_id) if broker_id else default_broker_id(config)
    clock = SystemClock()
    store = open_store(etcd, clock, connections=config.connections)
    async with store:
        metrics = ClusterMetrics(broker_id)
        metrics.connection_timeouts.watch("etcd", lambda: getattr(store, "connection_timeouts", 0))
        pauses = heap.GcPauses(metrics.registry)
        if config.metrics.enabled:
            try:
                metrics.serve(config.metrics.host, config.metrics.port)
            except OSError as exc:
                raise OSError(
                    f"metrics endpoint {config.metrics.host}:{config.metrics.port}: "
                    f"{exc.strerror} (set metrics.port, or metrics.enabled: false)"
                ) from None
        host: TopicHost
        server: DataPlaneServer | None = None
        sampler = None
        try:
            if profiles is not None or not config.data_plane.enabled:
                synthetic = SyntheticHost(broker_id, clock, PROFILES[profiles or "idle"])
                sampler = HostSampler(synthetic) if synthetic_resources else None
                host = synthetic
            else:
                data_host = DataPlaneHost(
                    broker_id, store, clock, config, metrics=DataPlaneMetrics(metrics.registry)
                )
                # Refuse to start on an object store the other brokers cannot read.
                await data_host.verify_object_store()
                dialer = data_host.dialer
                metrics.connection_timeouts.watch("broker", lambda: dialer.connection_timeouts)
                server = DataPlaneServer(data_host, config, config.broker.broker_url)
                url = await server.start()
                # Register the real address (a port 0 in the configuration is now bound).
                config = config.model_copy(
                    update={"broker": config.broker.model_copy(update={"broker_url": url})}
                )
                await data_host.directory.ensure_namespace(DEFAULT_NAMESPACE)
                host = data_host
            history_dir = config.history.directory if config.history.enabled else None
            process = build_broker(
                store,
                clock,
                config,
                broker_id,
                host,
                sampler=sampler,
                history_dir=history_dir,
                metrics=metrics,
            )
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, process.stop.set)
            runner = asyncio.ensure_future(process.run())
            started = asyncio.ensure_future(process.started.wait())
            await asyncio.wait({runner, started}, return_when=asyncio.FIRST_COMPLETED)
            if process.started.is_set():
                heap.settle()
                if on_started is not None:
                    on_started(broker_id, _serving(broker_id, config, server, profiles))
            started.cancel()
            await runner
        finally:
            pauses.close()
            if server is not None:
                await server.stop()


def _serving(
    broker_id: BrokerId, config: BallastConfig, server: DataPlaneServer | None, profiles: str | None
) -> str:
    metrics = (
        f"metrics on http://{config.metrics.host}:{config.metrics.port}/metrics"
        if config.metrics.enabled
        else "metrics off"
    )
    if server is None:
        return f"broker {broker_id} started with synthetic topics ({profiles or 'idle'}); {metrics}"
    link = f"gateways' link port {server.link_port}" if server.link_port else "no link port"
    return f"broker {broker_id} serving clients on {config.broker.broker_url}; {link}; {metrics}"


def main(argv: list[str] | None = None) -> None:
    """Command-line entry for one broker process."""
    parser = argparse.ArgumentParser(prog="python -m ballast.cluster.run", description=__doc__)
    parser.add_argument("--etcd", default=None, help="etcd endpoints (default: embedded memory)")
    parser.add_argument("--config", default=None, help="broker YAML configuration")
    parser.add_argument("--id", default=None, help="broker id (default: broker.id or host-pid)")
    parser.add_argument(
        "--profiles", choices=sorted(PROFILES), default=None, help="synthetic topics instead"
    )
    parser.add_argument("--synthetic-resources", action="store_true")
    parser.add_argument("--broker-url", default=None, help="host:port (port 0: a free port)")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    config = load_config(args.config)
    if args.broker_url:
        config = config.model_copy(
            update={"broker": config.broker.model_copy(update={"broker_url": args.broker_url})}
        )

    def started(broker_id: BrokerId, _serving: str) -> None:
        # Tests wait for this line before they start killing things.
        print(f"BROKER-STARTED {broker_id}", flush=True)

    try:
        asyncio.run(
            serve(
                args.etcd,
                config,
                args.id,
                profiles=args.profiles,
                synthetic_resources=args.synthetic_resources,
                on_started=started,
            )
        )
    except ObjectStoreMismatchError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
