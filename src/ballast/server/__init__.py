"""The broker's client-facing data plane: Danube's client protocol over gRPC.

The published `danube-client` (import package `danube`) talks to these services
unchanged. `DataPlaneHost` is the `TopicHost` that serves real topics (reliable ones on
`ballast.storage`, non-reliable ones in memory); `DataPlaneServer` serves Discovery,
ProducerService, ConsumerService and HealthCheck on the broker's `broker_url`.
"""

from ballast.server.host import DataPlaneHost
from ballast.server.server import DataPlaneServer

__all__ = ["DataPlaneHost", "DataPlaneServer"]
