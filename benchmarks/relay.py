"""The cheapest `grpc.aio` forwarder in front of one broker: what a Python gateway on
`grpc.aio`'s server costs at least (the gateway itself serves on `h2grpc` instead).

Not part of Ballast: `bench_failover.py` runs it beside the real gateway so the gateway's
overhead can be read against what merely adding a Python gRPC hop costs on the same
machine in the same run. It keeps no sessions, holds nothing across moves and checks
nothing: lookups are answered by the broker with the relay put in as `connect_url`, every
other call goes on unchanged as bytes — `--mode unary` one unary call per call,
`--mode link` SendMessage on the gateway's send link (`ballast.wire.link.SendLink`, on
the broker's TCP link port as the gateway's).

    python benchmarks/relay.py --broker 127.0.0.1:6650 [--mode link]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from ballast.wire.link import SendLink
from ballast.wire.protocol import pb

_LOOKUP = "/danube.Discovery/TopicLookup"
_SEND = "/danube.ProducerService/SendMessage"
_RECEIVE = "/danube.ConsumerService/ReceiveMessages"


class Relay(grpc.GenericRpcHandler):
    def __init__(self, broker: str, mode: str) -> None:
        self.channel = grpc.aio.insecure_channel(broker)
        self.link = SendLink(self.channel, broker, tcp=True) if mode == "link" else None
        self.address = ""
        self._handlers: dict[str, Any] = {}

    def service(self, details: grpc.HandlerCallDetails) -> Any:
        method = details.method
        if method not in self._handlers:
            self._handlers[method] = self._handler(method)
        return self._handlers[method]

    def _handler(self, method: str) -> Any:
        if method == _RECEIVE:
            stream = self.channel.unary_stream(method)

            async def receive(request: bytes, context: Any) -> Any:
                async for item in stream(request):
                    yield item

            return grpc.unary_stream_rpc_method_handler(receive)
        call = self.channel.unary_unary(method)
        if method == _LOOKUP:

            async def lookup(request: bytes, context: Any) -> bytes:
                answer = pb.TopicLookupResponse.FromString(await call(request))
                answer.connect_url = self.address
                answer.proxy = True
                return bytes(answer.SerializeToString())

            return grpc.unary_unary_rpc_method_handler(lookup)
        if method == _SEND and self.link is not None:
            link = self.link

            async def send(request: bytes, context: Any) -> bytes:
                return await link.send(request, None, 30.0)

            return grpc.unary_unary_rpc_method_handler(send)

        async def forward(request: bytes, context: Any) -> bytes:
            return bytes(await call(request))

        return grpc.unary_unary_rpc_method_handler(forward)


async def serve(broker: str, mode: str, listen: str) -> None:
    relay = Relay(broker, mode)
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((relay,))
    port = server.add_insecure_port(listen)
    relay.address = f"{listen.rsplit(':', 1)[0]}:{port}"
    await server.start()
    print(f"RELAY-STARTED {relay.address}", flush=True)
    await server.wait_for_termination()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--broker", required=True, help="the broker's address (host:port)")
    parser.add_argument("--mode", choices=("unary", "link"), default="unary")
    parser.add_argument("--listen", default="127.0.0.1:0")
    args = parser.parse_args()
    asyncio.run(serve(args.broker, args.mode, args.listen))


if __name__ == "__main__":
    main()
