"""Failure domains and namespace anti-affinity groups (Pulsar's `LoadManagerShared`).

A namespace in an anti-affinity group should land where the group is thinnest: first keep
the failure domains holding the fewest namespaces of the group (counted over the candidate
brokers), then, within them, the brokers holding the fewest. A broker "holds" a namespace
when it owns any of its topics. Each rejection says why, with the counts.

Differences from Pulsar: the domain step applies whenever some broker has a domain (Pulsar
needs `failureDomainsEnabled`); placement counts the group's other namespaces (see
`group_counts`); a broker may be in one domain only, and a conflict is an error naming the
broker and both domains, not a silent overwrite.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ballast.model import BrokerId, ClusterSnapshot, topic_namespace

DEFAULT_DOMAIN = "default"  # Pulsar's name for brokers outside every domain


class DomainError(ValueError):
    """Inconsistent failure-domain input; the message names the broker and domains."""


@dataclass(frozen=True)
class FailureDomains:
    """Domain name → its brokers. A broker belongs to at most one domain."""

    domains: Mapping[str, frozenset[BrokerId]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        seen: dict[BrokerId, str] = {}
        for name in sorted(self.domains):
            if not name or "/" in name:
                raise DomainError(f"invalid failure-domain name {name!r}")
            for b in sorted(self.domains[name]):
                if b in seen:
                    raise DomainError(
                        f"broker {b!r} is in two failure domains: {seen[b]!r} and {name!r}; "
                        "a broker belongs to one domain only"
                    )
                seen[b] = name

    def broker_to_domain(self) -> dict[BrokerId, str]:
        return {b: name for name, bs in self.domains.items() for b in bs}

    @classmethod
    def merge(
        cls,
        registered: Mapping[BrokerId, str | None],
        admin: Mapping[str, Iterable[BrokerId]],
    ) -> FailureDomains:
        """Domains from brokers' own `broker.domain` plus `clusters failure-domain create`.

        The same broker named in two places with different domains is an error."""
        out: dict[str, set[BrokerId]] = {k: set(v) for k, v in admin.items()}
        FailureDomains({k: frozenset(v) for k, v in out.items()})  # validates admin alone
        from_admin = {b: d for d, bs in out.items() for b in bs}
        for b, d in sorted(registered.items()):
            if d is not None and b in from_admin and from_admin[b] != d:
                raise DomainError(
                    f"broker {b!r} is in two failure domains: {d!r} (its broker.domain) and "
                    f"{from_admin[b]!r} (failure-domain {from_admin[b]!r}); remove one"
                )
        for b, d in broker_domains(registered, admin).items():
            out.setdefault(d, set()).add(b)
        return cls({k: frozenset(v) for k, v in out.items()})


def broker_domains(
    registered: Mapping[BrokerId, str | None], admin: Mapping[str, Iterable[BrokerId]]
) -> dict[BrokerId, str]:
    """Each broker's failure domain: an admin-created domain, else its own `broker.domain`.

    The one merge of the two sources. It never fails: the running leader places with it
    whatever the store holds (an admin domain wins a conflict); `FailureDomains.merge`
    refuses the conflicts when an operator creates a domain."""
    out = {b: d for b, d in registered.items() if d}
    for name, brokers in sorted(admin.items()):
        out.update(dict.fromkeys(brokers, name))
    return out


def namespaces_by_broker(snapshot: ClusterSnapshot) -> dict[BrokerId, set[str]]:
    """The namespaces each broker holds (owns at least one topic of)."""
    return {b: {topic_namespace(t) for t in topics} for b, topics in snapshot.assignments.items()}


def group_counts(
    snapshot: ClusterSnapshot, namespace: str, include_self: bool = True
) -> dict[BrokerId, int] | None:
    """Per broker, how many namespaces of `namespace`'s group it holds (None: no group).

    Placement counts the *other* namespaces of the group (`include_self=False`), so that a
    namespace's further topics or bundles join it rather than another namespace of its
    group; Pulsar counts the namespace itself too (as the unload check here does)."""
    group = snapshot.anti_affinity_groups.get(namespace)
    if not group:
        return None
    members = {ns for ns, g in snapshot.anti_affinity_groups.items() if g == group}
    if not include_self:
        members.discard(namespace)
    counts: dict[BrokerId, int] = {}
    for b, nss in namespaces_by_broker(snapshot).items():
        n = len(nss & members)
        if n:
            counts[b] = n
    return counts


@dataclass(frozen=True)
class AffinityFilter:
    """Brokers kept by the anti-affinity filter and why each other one was dropped."""

    kept: tuple[BrokerId, ...]
    rejected: Mapping[BrokerId, str] = field(default_factory=dict)


def filter_anti_affinity(
    candidates: Sequence[BrokerId],
    counts: Mapping[BrokerId, int] | None,
    broker_domains: Mapping[BrokerId, str],
    group: str = "",
) -> AffinityFilter:
    """Pulsar's `filterAntiAffinityGroupOwnedBrokers`: domains with the fewest namespaces of
    the group, then brokers with the fewest. `counts` None: the namespace has no group."""
    kept = sorted(candidates)
    if counts is None or not kept:
        return AffinityFilter(tuple(kept))
    label = f"group {group!r}" if group else "the group"
    rejected: dict[BrokerId, str] = {}
    if broker_domains:
        per_domain: dict[str, int] = {}
        for b in kept:
            d = broker_domains.get(b, DEFAULT_DOMAIN)
            per_domain[d] = per_domain.get(d, 0) + counts.get(b, 0)
        least = min(per_domain.values())
        for b in kept:
            d = broker_domains.get(b, DEFAULT_DOMAIN)
            if per_domain[d] != least:
                rejected[b] = (
                    f"[anti-affinity] domain {d} holds {per_domain[d]} namespace(s) of {label}; "
                    f"another domain holds {least}"
                )
        kept = [b for b in kept if b not in rejected]
    least_b = min(counts.get(b, 0) for b in kept)
    for b in kept:
        if counts.get(b, 0) != least_b:
            rejected[b] = (
                f"[anti-affinity] broker holds {counts.get(b, 0)} namespace(s) of {label}; "
                f"another broker holds {least_b}"
            )
    return AffinityFilter(tuple(b for b in kept if b not in rejected), rejected)


def should_unload(
    current: BrokerId, candidates: Sequence[BrokerId], counts: Mapping[BrokerId, int] | None
) -> tuple[bool, str]:
    """Pulsar's `shouldAntiAffinityNamespaceUnload`: unloading helps only when another
    candidate holds fewer namespaces of the group, or not every candidate holds the same."""
    if not counts:
        return True, ""
    least = min((counts.get(b, 0) for b in candidates), default=0)
    here = counts.get(current, 0)
    if least == 0 or here > least:
        return True, ""
    same = sum(1 for b in candidates if counts.get(b, 0) == least)
    if same != len(candidates):
        return True, ""
    return False, (
        f"anti-affinity: every candidate holds {least} namespace(s) of the group, so the "
        "unit would come back here"
    )
