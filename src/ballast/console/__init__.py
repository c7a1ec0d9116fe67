"""The operator's console: an HTTP admin API and a live web console over `AdminClient`.

`LiveCluster` keeps one watch on the metadata store and fans its changes out to every
browser (server-sent events); `create_app` builds the FastAPI application around it;
`serve_console` is the shell behind ``ballast console``. `prometheus_targets` turns broker
registrations into Prometheus service discovery.
"""

from ballast.console.app import create_app
from ballast.console.live import BalanceSample, BrokerRow, Frame, LiveCluster, Update
from ballast.console.targets import prometheus_targets

__all__ = [
    "BalanceSample",
    "BrokerRow",
    "Frame",
    "LiveCluster",
    "Update",
    "create_app",
    "prometheus_targets",
]
