"""The unreachable-owner rule: a broker that no gateway can reach is drained.

etcd decides whether a broker is alive (its registration lease); clients reach it through
gateways. When the two disagree — the broker keeps its lease while the path from the
gateways to it is cut (an asymmetric partition, a firewall, a dead switch port on the
front network only) — the broker's topics are alive for the cluster and dead for every
client. Gateways therefore report, under their own lease, each broker whose connection
has not been ready for `reachability.report_after_seconds` (`keys.unreachable_report`),
and the leader applies this rule (pure: a snapshot in, decisions out; the shell in
`cluster.load_manager` does the I/O):

- **Evict** a broker when every *counting* gateway reports it, every one of those reports
  for at least `evict_after_seconds`, and at least `min_gateways` gateways count. The
  broker is set ``draining`` (the leader's drain moves its topics: each one sealed by its
  owner, which still reaches etcd, then assigned elsewhere: one writer per topic, as any
  move) and remembered in `keys.reachability_eviction`.
- A gateway that reports **every** registered broker (two or more) does not count: it is
  the one cut off, and its reports must not empty the cluster.
- Never evict the last broker that every counting gateway can reach: the topics need
  somewhere to go. Brokers an operator set draining or drained are left alone.
- **Restore** an evicted broker (``active`` again, the eviction forgotten) once no
  counting gateway reports it; gateways withdraw a report only after the broker was
  reachable for `clear_after_seconds` (hysteresis on both sides: one flaky gateway can
  neither evict a broker the others reach, nor make it flap). An eviction whose broker
  left the cluster is forgotten.

Limits (docs/gray-failures.md): with one gateway, that gateway's view decides; a broker
that clients reach without gateways is evicted all the same; eviction needs the leader and
the gateways to reach etcd (a gateway cut from etcd loses its lease, and its reports
with it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ballast.model import BrokerId, BrokerMode, BrokerState

__all__ = ["Evict", "ReachabilityRule", "ReachabilitySnapshot", "Restore", "decide"]


@dataclass(frozen=True)
class ReachabilityRule:
    """The rule's settings (`reachability` section)."""

    evict_after_seconds: float = 1.0
    min_gateways: int = 1


@dataclass(frozen=True)
class ReachabilitySnapshot:
    """What the rule reads: live gateways, their reports, brokers and their states."""

    now: float
    gateways: frozenset[str]  # gateways whose registration (lease) is alive
    reports: Mapping[str, Mapping[BrokerId, float]]  # gateway -> broker -> unreachable since
    brokers: frozenset[BrokerId]  # registered brokers
    states: Mapping[BrokerId, BrokerState]
    evicted: frozenset[BrokerId]  # brokers this rule drained and has not restored


@dataclass(frozen=True)
class Evict:
    broker: BrokerId
    gateways: tuple[str, ...]  # the gateways that report it
    since: float  # the most recent of their reports' start

    @property
    def reason(self) -> str:
        return (
            f"unreachable from every gateway ({', '.join(self.gateways)}): "
            "its topics are moved away until gateways reach it again"
        )


@dataclass(frozen=True)
class Restore:
    broker: BrokerId
    registered: bool  # False: the broker left; only the eviction record goes


def counting(snapshot: ReachabilitySnapshot) -> dict[str, Mapping[BrokerId, float]]:
    """The live gateways whose reports count, with their reports of registered brokers."""
    out: dict[str, Mapping[BrokerId, float]] = {}
    for gateway in sorted(snapshot.gateways):
        reports = {
            b: since
            for b, since in snapshot.reports.get(gateway, {}).items()
            if b in snapshot.brokers
        }
        if len(snapshot.brokers) >= 2 and set(reports) >= snapshot.brokers:
            continue  # it reaches no broker at all: it is the one cut off
        out[gateway] = reports
    return out


def decide(rule: ReachabilityRule, snapshot: ReachabilitySnapshot) -> list[Evict | Restore]:
    """The evictions and restorations `snapshot` calls for (see the module docstring)."""
    gateways = counting(snapshot)
    unreachable: dict[BrokerId, tuple[tuple[str, ...], float]] = {}
    if len(gateways) >= max(1, rule.min_gateways):
        for broker in sorted(snapshot.brokers):
            starts = [reports.get(broker) for reports in gateways.values()]
            if all(s is not None for s in starts):
                unreachable[broker] = (tuple(gateways), max(s for s in starts if s is not None))
    out: list[Evict | Restore] = []
    for broker in sorted(snapshot.evicted):
        if broker not in snapshot.brokers:
            out.append(Restore(broker, registered=False))
        elif broker not in unreachable:
            out.append(Restore(broker, registered=True))
    reachable = [b for b in snapshot.brokers if b not in unreachable]
    active_reachable = [
        b for b in reachable if snapshot.states.get(b, BrokerState()).mode is BrokerMode.ACTIVE
    ]
    if not active_reachable:
        return out  # nowhere to move the topics: evict nobody
    for broker, (reporters, since) in sorted(unreachable.items()):
        if broker in snapshot.evicted:
            continue
        if snapshot.states.get(broker, BrokerState()).mode is not BrokerMode.ACTIVE:
            continue  # an operator's drain (or a drained broker): not ours to touch
        if snapshot.now - since < rule.evict_after_seconds:
            continue
        out.append(Evict(broker, reporters, since))
    return out
