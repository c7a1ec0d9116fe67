"""What one gRPC server hop costs before it does anything (issues 20 and 37: why the
client ports serve on `ballast.wire.h2grpc`, on libnghttp2, and not on `grpc.aio`).

An echo server that answers every unary call with its own request (no parsing, no
forwarding), called by 8 concurrent callers (one `grpc.aio` channel) sending 1 KiB each,
one call at a time (as `bench_moves.py`'s overhead run sends). Prints calls/s and the CPU
time per call of the server process and of the calling process, for each server:

- ``grpc_aio``: `grpc.aio`'s server (the top-level figures, as before);
- ``wire``: Ballast's own wire layer (`ballast.wire.h2grpc.H2GrpcServer`, with every
  protection it has);
- ``ngh2`` and ``h2``: the least a server on each HTTP/2 engine does (one asyncio
  protocol, the engine fed bytes, the reply and trailers queued; no protections).

Why it matters: on a machine whose cores client, broker and gateway share, throughput is
set by the CPU each message costs in all of them together. A gateway loses at most 25 %
of the direct msg/s only if it adds at most a third of what a message costs directly
(client + broker, `cpu_us_per_msg` of the `direct` run in `bench_moves.py`). This server's
cost per call is the least any Python gRPC front end adds per message.

    .venv/bin/python benchmarks/bench_grpc_floor.py [--duration 5] [--callers 8]
        [--servers grpc_aio,wire,ngh2,h2] [--quick]
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
SERVERS = ("grpc_aio", "wire", "ngh2", "h2")


class _Echo(grpc.GenericRpcHandler):
    def service(self, details: grpc.HandlerCallDetails) -> Any:
        async def echo(request: bytes, context: Any) -> bytes:
            return request

        return grpc.unary_unary_rpc_method_handler(echo)


_RESPONSE = [(b":status", b"200"), (b"content-type", b"application/grpc")]
_TRAILERS = [(b"grpc-status", b"0")]


class _Ngh2Echo(asyncio.Protocol):
    """The least a gRPC echo on libnghttp2 (`ngh2`) does."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        import ngh2

        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.ngh2 = ngh2
        self.conn = ngh2.Connection(ngh2.Role.SERVER)
        self.conn.initiate_connection({ngh2.Setting.MAX_CONCURRENT_STREAMS: 1000})
        self.bodies: dict[int, bytes] = {}
        transport.write(self.conn.data_to_send())

    def data_received(self, data: bytes) -> None:
        conn, ngh2 = self.conn, self.ngh2
        conn.receive_data(data)
        for event in conn.events():
            if isinstance(event, ngh2.RequestReceived):
                self.bodies[event.stream_id] = b""
            elif isinstance(event, ngh2.DataReceived):
                body = self.bodies[event.stream_id] + event.data
                self.bodies[event.stream_id] = body
                if event.end_stream:
                    del self.bodies[event.stream_id]
                    conn.send_response(event.stream_id, _RESPONSE)
                    conn.send_data(event.stream_id, body)
                    conn.send_trailers(event.stream_id, _TRAILERS)
        out = conn.data_to_send()
        if out:
            self.transport.write(out)


class _H2Echo(asyncio.Protocol):
    """The least a gRPC echo on the `h2` package does."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        import h2.config
        import h2.connection
        import h2.events

        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.events = h2.events
        self.conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=False, header_encoding=None)
        )
        self.conn.initiate_connection()
        self.bodies: dict[int, bytes] = {}
        transport.write(self.conn.data_to_send())

    def data_received(self, data: bytes) -> None:
        conn, events = self.conn, self.events
        for event in conn.receive_data(data):
            if isinstance(event, events.RequestReceived):
                self.bodies[event.stream_id] = b""
            elif isinstance(event, events.DataReceived):
                self.bodies[event.stream_id] += event.data
                conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, events.StreamEnded):
                body = self.bodies.pop(event.stream_id)
                conn.send_headers(event.stream_id, _RESPONSE)
                conn.send_data(event.stream_id, body)
                conn.send_headers(event.stream_id, _TRAILERS, end_stream=True)
        out = conn.data_to_send()
        if out:
            self.transport.write(out)


async def _serve(kind: str) -> None:
    if kind == "grpc_aio":
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((_Echo(),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        print(f"FLOOR-STARTED 127.0.0.1:{port}", flush=True)
        await server.wait_for_termination()
        return
    if kind == "wire":
        from ballast.wire.h2grpc import H2GrpcServer

        echo = _Echo().service(None)  # type: ignore[arg-type]
        wire = H2GrpcServer(lambda method: echo, max_receive=1 << 20, ssl_context=None)
        port = await wire.start("127.0.0.1", 0)
    else:
        protocol = {"ngh2": _Ngh2Echo, "h2": _H2Echo}[kind]
        listener = await asyncio.get_running_loop().create_server(protocol, "127.0.0.1", 0)
        port = listener.sockets[0].getsockname()[1]
    print(f"FLOOR-STARTED 127.0.0.1:{port}", flush=True)
    await asyncio.Event().wait()


async def _measure(duration: float, callers: int, kind: str) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--serve", kind, stdout=asyncio.subprocess.PIPE
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
    parser.add_argument(
        "--servers",
        default=",".join(SERVERS),
        help=f"comma-separated, among {','.join(SERVERS)} (grpc_aio's figures are the top level)",
    )
    parser.add_argument("--serve", default=None, help=argparse.SUPPRESS)
    args = parse_args(parser, quick={"duration": 1.0})
    if args.serve:
        asyncio.run(_serve(args.serve))
        return
    kinds = [kind for kind in args.servers.split(",") if kind]
    unknown = sorted(set(kinds) - set(SERVERS))
    if unknown:
        parser.error(f"--servers: unknown {unknown}; choose among {list(SERVERS)}")

    async def every() -> dict[str, Any]:
        return {kind: await _measure(args.duration, args.callers, kind) for kind in kinds}

    by_server = asyncio.run(every())
    report = dict(by_server.get("grpc_aio", {}))
    report["servers"] = by_server
    emit(report)


if __name__ == "__main__":
    main()
