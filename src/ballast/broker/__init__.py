"""The broker's client-facing data plane: Danube's client protocol over gRPC.

The published `danube-client` (import package `danube`) talks to these services
unchanged. `DataPlaneHost` is the `TopicHost` that serves real topics (reliable ones on
`ballast.storage`, non-reliable ones in memory); `DataPlaneServer` serves Discovery,
ProducerService, ConsumerService, HealthCheck and SchemaRegistry on the broker's
`broker_url`.

Run by: the broker process (`ballast broker`, `ballast.cluster.run`), which wires it to
the load manager in `ballast.cluster`.
May import: `ballast.wire`, `ballast.registry`, `ballast.storage`, `ballast.metadata`,
`ballast.model`, `ballast.config` and the standard helpers — never the gateway or the
cluster shell (the shell imports the broker, not the other way round).
"""

from ballast.broker.host import DataPlaneHost
from ballast.broker.server import DataPlaneServer

__all__ = ["DataPlaneHost", "DataPlaneServer"]
