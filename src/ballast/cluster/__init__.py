"""The control plane: brokers, leader election, the load manager, admin and metrics.

Services own their asyncio tasks (`ballast.aio.TaskOwner`) and receive their
collaborators (store, clock, host, configuration) explicitly; the leader's policy is the
state machine of `ballast.leader`, every decision in it comes from `ballast.balance`.
"""

from ballast.cluster.admin import AdminClient, AdminError
from ballast.cluster.broker import BrokerNode
from ballast.cluster.cluster import BrokerProcess, LocalCluster, build_broker
from ballast.cluster.election import FenceLost, LeaderElection, Term
from ballast.cluster.host import SyntheticHost, TopicHost, TrafficProfile
from ballast.cluster.load_manager import LeaderSession, LoadManager
from ballast.cluster.metrics import ClusterMetrics

__all__ = [
    "AdminClient",
    "AdminError",
    "BrokerNode",
    "BrokerProcess",
    "ClusterMetrics",
    "FenceLost",
    "LeaderElection",
    "LeaderSession",
    "LoadManager",
    "LocalCluster",
    "SyntheticHost",
    "Term",
    "TopicHost",
    "TrafficProfile",
    "build_broker",
]
