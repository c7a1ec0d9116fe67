"""What one `grpc.aio` hop costs before it does anything (issue 20; why the gateway has
its own HTTP/2 server, `ballast.server.h2grpc`).

A `grpc.aio` server that answers every unary call with its own request (no parsing, no
forwarding), called by 8 concurrent callers sending 1 KiB each, one call at a time (as
`bench_moves.py`'s overhead run sends). Prints calls/s and the CPU time per call of the
server process and of the calling process.

Why it matters: on a machine whose cores client, broker and gateway share, throughput is
set by the CPU each message costs in all of them together. A gateway loses at most 25 %
of the direct msg/s only if it adds at most a third of what a message costs directly
(client + broker, `cpu_us_per_msg` of the `direct` run in `bench_moves.py`). This server's
cost per call is the least any Python gRPC front end adds per message.

    .venv/bin/python benchmarks/bench_grpc_floor.py [--duration 5] [--callers 8] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import grpc
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.bench_failover import cpu_seconds
from benchmarks.cli import emit, parse_args

_METHOD = "/floor.Echo/Call"


class _Echo(grpc.GenericRpcHandler):
    def service(self, details: grpc.HandlerCallDetails) -> Any:
        async def echo(request: bytes, context: Any) -> bytes:
            return request

        return grpc.unary_unary_rpc_method_handler(echo)


async def _serve() -> None:
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((_Echo(),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(f"FLOOR-STARTED 127.0.0.1:{port}", flush=True)
    await server.wait_for_termination()


async def _measure(duration: float, callers: int) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--serve", stdout=asyncio.subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        if not line.startswith("FLOOR-STARTED "):
            raise RuntimeError(f"the echo server did not start: {line!r}")
        address = line.split()[1]
        async with grpc.aio.insecure_channel(address) as channel:
            call = channel.unary_unary(_METHOD)
            payload = b"x" * 1024
            for _ in range(200):  # warm-up: connection, handler cache
                await call(payload)
            server, me = psutil.Process(proc.pid), psutil.Process()
            server_before, me_before = cpu_seconds(server), cpu_seconds(me)
            calls = 0
            stop = time.monotonic() + duration

            async def run() -> None:
                nonlocal calls
                while time.monotonic() < stop:
                    await call(payload)
                    calls += 1

            began = time.monotonic()
            await asyncio.gather(*(run() for _ in range(callers)))
            elapsed = time.monotonic() - began
            spent_server, spent_me = (
                cpu_seconds(server) - server_before,
                cpu_seconds(me) - me_before,
            )
        return {
            "cpus": os.cpu_count(),
            "callers": callers,
            "payload_bytes": len(payload),
            "calls_per_s": round(calls / elapsed, 1),
            "server_cpu_us_per_call": round(spent_server / calls * 1e6),
            "caller_cpu_us_per_call": round(spent_me / calls * 1e6),
        }
    finally:
        proc.terminate()
        await proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds of calls")
    parser.add_argument("--callers", type=int, default=8, help="concurrent callers")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parse_args(parser, quick={"duration": 1.0})
    if args.serve:
        asyncio.run(_serve())
        return
    emit(asyncio.run(_measure(args.duration, args.callers)))


if __name__ == "__main__":
    main()
