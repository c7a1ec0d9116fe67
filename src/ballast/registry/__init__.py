"""The schema registry service: Danube's SchemaRegistry gRPC service over the metadata
store, with the pure compatibility rules of `ballast.schemas`.

Run by: every broker (registered on its client port by `ballast.broker.server`); the
console reads its records through `SchemaStore`.
May import: `ballast.schemas`, `ballast.wire`, `ballast.metadata`, `ballast.model` and the
standard helpers — never the broker's data plane, the gateway or the cluster shell.
"""
