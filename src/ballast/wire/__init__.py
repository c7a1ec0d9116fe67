"""The wire layer every client-facing port shares: HTTP/2 on libnghttp2 (`h2grpc`), the
gRPC semantics above it (`rpc`, `errors`, `limits`), Danube's protocol descriptor
(`protocol`), authentication and TLS (`auth`, `security`), the gateway ↔ broker send link
(`link`, both ends), calls between cluster members (`cluster_calls`) and the counters of
what the wire refused (`metrics`).

Run by: the broker (`ballast.broker`) and the gateway (`ballast.gateway`) processes.
May import: `ballast.config`, `ballast.metadata`, `ballast.model`, `ballast.schemas` and
the standard helpers (`aio`, `clock`) — never the broker, the gateway, the registry or
the cluster shell.
"""
