"""Pulsar's namespace bundles: hash ranges, CRC-32 topic mapping, splitting.

A namespace's hash space 0x00000000–0xFFFFFFFF is cut into bundles by sorted boundaries
`b0=0 < b1 < … < bn=0xFFFFFFFF`; bundle i is `[b_i, b_{i+1})`, the last one closed
(`[b_{n-1}, 0xFFFFFFFF]`), as in Pulsar's `NamespaceBundles`. A topic belongs to the bundle
holding the CRC-32 (zlib/IEEE) of its full name. Bundles print as Pulsar prints them:
`ns/0x00000000_0x40000000`.

Split algorithms return the new boundaries inside one bundle; `split_bundle` applies them.
`decide_splits` is the automatic split rule (any threshold exceeded, up to the namespace's
maximum bundle count). Everything here is pure.
"""

from __future__ import annotations

import bisect
import re
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise

from ballast.config import PulsarConfig, SplitAlgorithm
from ballast.model import TopicLoad, TopicName

FULL_LOWER = 0x00000000
FULL_UPPER = 0xFFFFFFFF
MB = 1024 * 1024  # Pulsar's MByte for the bandwidth thresholds

_RANGE_RE = re.compile(r"^0x([0-9a-fA-F]{8})_0x([0-9a-fA-F]{8})$")


class BundleError(ValueError):
    """Bad bundle input (range, position, algorithm, name); the message names the value."""


def topic_hash(topic: str) -> int:
    """CRC-32 (zlib, IEEE polynomial) of the topic's full name, as an unsigned 32-bit int."""
    return zlib.crc32(topic.encode("utf-8")) & 0xFFFFFFFF


def parse_algorithm(name: str) -> SplitAlgorithm:
    """The split algorithm called `name`, or a `BundleError` listing the known ones."""
    try:
        return SplitAlgorithm(name)
    except ValueError:
        known = ", ".join(a.value for a in SplitAlgorithm)
        raise BundleError(f"unknown split algorithm {name!r}: use one of {known}") from None


@dataclass(frozen=True, order=True)
class BundleRange:
    """One bundle's hash range `[lower, upper)` (closed at the top when upper is 0xFFFFFFFF)."""

    lower: int
    upper: int

    def __post_init__(self) -> None:
        if not (FULL_LOWER <= self.lower < self.upper <= FULL_UPPER):
            raise BundleError(
                f"invalid bundle range 0x{self.lower:08x}_0x{self.upper:08x}: need "
                "0x00000000 <= lower < upper <= 0xffffffff"
            )

    @property
    def name(self) -> str:
        return f"0x{self.lower:08x}_0x{self.upper:08x}"

    def contains(self, h: int) -> bool:
        return self.lower <= h < self.upper or (self.upper == FULL_UPPER and h == FULL_UPPER)

    def is_inside(self, position: int) -> bool:
        """A split position must fall strictly inside the range."""
        return self.lower < position < self.upper

    @classmethod
    def parse(cls, text: str) -> BundleRange:
        """Parse `0xLLLLLLLL_0xUUUUUUUU` (optionally prefixed by `namespace/`)."""
        raw = text.rsplit("/", 1)[-1] if isinstance(text, str) else text
        m = _RANGE_RE.match(raw) if isinstance(raw, str) else None
        if m is None:
            raise BundleError(
                f"invalid bundle {text!r}: expected the form 0x00000000_0x40000000 "
                "(or ns/0x00000000_0x40000000)"
            )
        return cls(int(m.group(1), 16), int(m.group(2), 16))


def even_boundaries(n: int) -> tuple[int, ...]:
    """Pulsar's initial partition into `n` bundles: multiples of 2^32 // n, last 0xFFFFFFFF."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1 or n > (1 << 16):
        raise BundleError(f"invalid number of bundles {n!r}: must be an integer in 1..65536")
    seg = (1 << 32) // n
    return (*(i * seg for i in range(n)), FULL_UPPER)


@dataclass(frozen=True)
class NamespaceBundles:
    """The bundles of one namespace: validated boundaries that partition the full range."""

    namespace: str
    boundaries: tuple[int, ...]

    def __post_init__(self) -> None:
        b = self.boundaries
        if len(b) < 2 or b[0] != FULL_LOWER or b[-1] != FULL_UPPER:
            raise BundleError(
                f"namespace {self.namespace!r}: boundaries must start at 0x00000000 and end at "
                f"0xffffffff, got {[f'0x{x:08x}' for x in b[:1] + b[-1:]]}"
            )
        for lo, hi in pairwise(b):
            if hi <= lo:
                raise BundleError(
                    f"namespace {self.namespace!r}: boundaries must increase strictly, got "
                    f"0x{lo:08x} then 0x{hi:08x}"
                )

    @classmethod
    def create(cls, namespace: str, n: int) -> NamespaceBundles:
        """A namespace with `n` equal bundles (`defaultNumberOfNamespaceBundles`)."""
        return cls(namespace, even_boundaries(n))

    @classmethod
    def from_ranges(cls, namespace: str, ranges: Iterable[BundleRange]) -> NamespaceBundles:
        """Bundles from explicit ranges; overlaps and gaps are errors naming the ranges."""
        rs = sorted(ranges)
        if not rs:
            raise BundleError(f"namespace {namespace!r}: no bundle ranges given")
        for a, b in pairwise(rs):
            if b.lower < a.upper:
                raise BundleError(
                    f"namespace {namespace!r}: overlapping ranges {a.name} and {b.name}"
                )
            if b.lower > a.upper:
                raise BundleError(
                    f"namespace {namespace!r}: gap between {a.name} and {b.name} "
                    f"(0x{a.upper:08x}..0x{b.lower:08x} belongs to no bundle)"
                )
        return cls(namespace, (*(r.lower for r in rs), rs[-1].upper))

    @property
    def ranges(self) -> tuple[BundleRange, ...]:
        b = self.boundaries
        return tuple(BundleRange(lo, hi) for lo, hi in pairwise(b))

    def __len__(self) -> int:
        return len(self.boundaries) - 1

    def full_name(self, bundle: BundleRange) -> str:
        return f"{self.namespace}/{bundle.name}"

    def names(self) -> tuple[str, ...]:
        return tuple(self.full_name(r) for r in self.ranges)

    def bundle_for_hash(self, h: int) -> BundleRange:
        if not (FULL_LOWER <= h <= FULL_UPPER):
            raise BundleError(f"hash {h!r} is outside 0x00000000..0xffffffff")
        i = min(bisect.bisect_right(self.boundaries, h) - 1, len(self) - 1)
        return BundleRange(self.boundaries[i], self.boundaries[i + 1])

    def bundle_for_topic(self, topic: str) -> BundleRange:
        """The bundle holding `topic`, which must belong to this namespace (Pulsar's
        `NamespaceBundles.findBundle` rejects a topic of another namespace)."""
        ns = TopicName.parse(topic).namespace
        if ns != self.namespace:
            raise BundleError(
                f"topic {topic!r} belongs to namespace {ns!r}, not to {self.namespace!r}: "
                "it has no bundle here"
            )
        return self.bundle_for_hash(topic_hash(topic))

    def find(self, name: str) -> BundleRange:
        """The bundle named `name` (`0x…_0x…` or `ns/0x…_0x…`), or an error listing the bundles."""
        if "/" in name and name.rsplit("/", 1)[0] != self.namespace:
            raise BundleError(f"bundle {name!r} does not belong to namespace {self.namespace!r}")
        wanted = BundleRange.parse(name)
        if wanted not in self.ranges:
            raise BundleError(
                f"namespace {self.namespace!r} has no bundle {wanted.name}; its bundles are "
                f"{', '.join(r.name for r in self.ranges)}"
            )
        return wanted

    def split(self, bundle: BundleRange, positions: Iterable[int]) -> NamespaceBundles:
        """Cut `bundle` at `positions` (each strictly inside it)."""
        if bundle not in self.ranges:
            raise BundleError(f"namespace {self.namespace!r} has no bundle {bundle.name}")
        cuts = sorted(set(positions))
        if not cuts:
            raise BundleError(f"bundle {self.full_name(bundle)}: no split position given")
        for p in cuts:
            if not isinstance(p, int) or not bundle.is_inside(p):
                raise BundleError(
                    f"split position {_hex(p)} is outside bundle {self.full_name(bundle)} "
                    f"(must be strictly between 0x{bundle.lower:08x} and 0x{bundle.upper:08x})"
                )
        return NamespaceBundles(self.namespace, tuple(sorted({*self.boundaries, *cuts})))

    def group_topics(self, topics: Iterable[str]) -> dict[BundleRange, list[str]]:
        """Each topic under its bundle (every bundle present, possibly empty)."""
        groups: dict[BundleRange, list[str]] = {r: [] for r in self.ranges}
        for t in topics:
            groups[self.bundle_for_topic(t)].append(t)
        return groups

    def to_dict(self) -> dict[str, object]:
        return {"namespace": self.namespace, "boundaries": [f"0x{b:08x}" for b in self.boundaries]}

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> NamespaceBundles:
        ns = data.get("namespace")
        raw = data.get("boundaries")
        if not isinstance(ns, str) or not isinstance(raw, list):
            raise BundleError(f"malformed bundles record {dict(data)!r}")
        try:
            return cls(ns, tuple(int(str(x), 16) for x in raw))
        except ValueError as exc:
            if isinstance(exc, BundleError):
                raise
            raise BundleError(f"namespace {ns!r}: malformed boundaries {raw!r}") from None


def _hex(p: object) -> str:
    return f"0x{p:08x}" if isinstance(p, int) and p >= 0 else repr(p)


def parse_position(text: str) -> int:
    """A split position given by a user: hex (`0x…`) or decimal."""
    try:
        value = int(text, 0)
    except (TypeError, ValueError):
        raise BundleError(
            f"invalid split position {text!r}: give a hex (0x…) or decimal number"
        ) from None
    if not (FULL_LOWER <= value <= FULL_UPPER):
        raise BundleError(f"split position {text!r} is outside 0x00000000..0xffffffff")
    return value


# --- split algorithms -------------------------------------------------------------------


@dataclass(frozen=True)
class TopicTraffic:
    """A topic's traffic, the input of the flow/QPS split (bytes/s and msg/s, in + out)."""

    topic: str
    msg_rate: float = 0.0
    throughput: float = 0.0


@dataclass(frozen=True)
class SplitResult:
    """New boundaries inside one bundle (empty: no split) and why."""

    bundle: str
    algorithm: SplitAlgorithm
    positions: tuple[int, ...]
    reason: str


def range_equally_divide(bundle: BundleRange) -> tuple[int, ...]:
    """The midpoint of the range."""
    return (bundle.lower + (bundle.upper - bundle.lower) // 2,)


def topic_count_equally_divide(bundle: BundleRange, topics: Sequence[str]) -> tuple[int, ...]:
    """Halfway between the two middle topic hashes (Pulsar: needs at least two topics)."""
    hashes = sorted(h for h in (topic_hash(t) for t in topics) if bundle.contains(h))
    if len(hashes) <= 1:
        return ()
    start = hashes[max(len(hashes) // 2 - 1, 0)]
    end = hashes[len(hashes) // 2]
    middle = start + (end - start) // 2
    return (middle,) if bundle.is_inside(middle) else ()


def specified_positions_divide(
    bundle: BundleRange, positions: Sequence[int], topic_count: int
) -> tuple[int, ...]:
    """The given positions, unless the bundle holds at most one topic (`topic_count`): as
    Pulsar's `SpecifiedPositionsBundleSplitAlgorithm`, nothing is split then. Unlike Pulsar,
    a position outside the bundle is an error, not ignored."""
    if not positions:
        raise BundleError(f"bundle {bundle.name}: specified_positions_divide needs --positions")
    for p in positions:
        if not isinstance(p, int) or not bundle.is_inside(p):
            raise BundleError(
                f"split position {_hex(p)} is outside bundle {bundle.name} (must be strictly "
                f"between 0x{bundle.lower:08x} and 0x{bundle.upper:08x})"
            )
    if topic_count <= 1:
        return ()
    return tuple(sorted(set(positions)))


def flow_or_qps_equally_divide(
    bundle: BundleRange,
    topics: Sequence[TopicTraffic],
    max_msg_rate: float,
    max_bandwidth_bytes: float,
    diff_threshold: float,
) -> tuple[int, ...]:
    """Walk topics by hash; cut where the running msg rate or throughput would pass the
    bundle maximum. Idle topics are skipped; nothing is cut unless the bundle exceeds a
    maximum by more than `diff_threshold` (a fraction)."""
    traffic = sorted(
        (topic_hash(t.topic), t)
        for t in topics
        if (t.msg_rate > 0 or t.throughput > 0) and bundle.contains(topic_hash(t.topic))
    )
    total_rate = sum(t.msg_rate for _, t in traffic)
    total_bytes = sum(t.throughput for _, t in traffic)
    if len(traffic) < 2 or (
        total_rate < max_msg_rate * (1 + diff_threshold)
        and total_bytes < max_bandwidth_bytes * (1 + diff_threshold)
    ):
        return ()
    cuts: list[int] = []
    run_rate, run_bytes = traffic[0][1].msg_rate, traffic[0][1].throughput
    for (h_prev, _), (h, t) in pairwise(traffic):
        if run_rate + t.msg_rate > max_msg_rate or run_bytes + t.throughput > max_bandwidth_bytes:
            cut = h_prev + (h - h_prev) // 2 + 1
            if bundle.is_inside(cut) and (not cuts or cut > cuts[-1]):
                cuts.append(cut)
            run_rate, run_bytes = t.msg_rate, t.throughput
        else:
            run_rate += t.msg_rate
            run_bytes += t.throughput
    return tuple(cuts)


def split_positions(
    bundles: NamespaceBundles,
    bundle: BundleRange,
    algorithm: SplitAlgorithm | str,
    topics: Sequence[TopicTraffic] = (),
    positions: Sequence[int] = (),
    config: PulsarConfig | None = None,
) -> SplitResult:
    """Where `algorithm` cuts `bundle`, with a reason (an empty result says why not)."""
    algo = algorithm if isinstance(algorithm, SplitAlgorithm) else parse_algorithm(algorithm)
    cfg = config or PulsarConfig()
    name = bundles.full_name(bundle)
    if algo is SplitAlgorithm.RANGE_EQUALLY_DIVIDE:
        cuts = range_equally_divide(bundle) if bundle.upper - bundle.lower >= 2 else ()
        why = "the range is too small to halve" if not cuts else "midpoint of the range"
    elif algo is SplitAlgorithm.TOPIC_COUNT_EQUALLY_DIVIDE:
        cuts = topic_count_equally_divide(bundle, [t.topic for t in topics])
        why = (
            f"between the middle topics of {len(topics)}"
            if cuts
            else f"{len(topics)} topic(s): need two with distinct hashes"
        )
    elif algo is SplitAlgorithm.SPECIFIED_POSITIONS_DIVIDE:
        inside = sum(1 for t in topics if bundle.contains(topic_hash(t.topic)))
        cuts = specified_positions_divide(bundle, positions, inside)
        why = (
            "positions given by the operator"
            if cuts
            else f"{inside} topic(s): a bundle with at most one topic is not split"
        )
    else:
        cuts = flow_or_qps_equally_divide(
            bundle,
            topics,
            cfg.namespace_bundle_max_msg_rate,
            cfg.namespace_bundle_max_bandwidth_mbytes * MB,
            cfg.flow_or_qps_difference_threshold_percentage / 100,
        )
        why = (
            f"cumulative rate passes {cfg.namespace_bundle_max_msg_rate:.0f} msg/s or "
            f"{cfg.namespace_bundle_max_bandwidth_mbytes:.0f} MB/s"
            if cuts
            else "traffic is within the bundle maxima (or fewer than two busy topics)"
        )
    return SplitResult(name, algo, cuts, f"[{algo.value}] {name}: {why}")


def split_bundle(
    bundles: NamespaceBundles,
    bundle: BundleRange,
    algorithm: SplitAlgorithm | str,
    topics: Sequence[TopicTraffic] = (),
    positions: Sequence[int] = (),
    config: PulsarConfig | None = None,
) -> tuple[NamespaceBundles, SplitResult]:
    """Apply one split; the namespace is unchanged when the algorithm finds no cut."""
    result = split_positions(bundles, bundle, algorithm, topics, positions, config)
    if not result.positions:
        return bundles, result
    return bundles.split(bundle, result.positions), result


# --- automatic split --------------------------------------------------------------------


@dataclass(frozen=True)
class BundleStats:
    """Aggregated load of one bundle (msg rate and throughput are in + out)."""

    topics: int = 0
    sessions: int = 0
    msg_rate: float = 0.0
    throughput: float = 0.0  # bytes/s

    @classmethod
    def of(cls, loads: Iterable[TopicLoad]) -> BundleStats:
        n = s = 0
        rate = thr = 0.0
        for t in loads:
            n += 1
            s += t.producers + t.consumers
            rate += t.msg_rate
            thr += t.byte_rate
        return cls(n, s, rate, thr)


@dataclass(frozen=True)
class SplitDecision:
    """A bundle to split automatically, with the threshold(s) it exceeded."""

    namespace: str
    bundle: BundleRange
    exceeded: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"{self.namespace}/{self.bundle.name}"


@dataclass(frozen=True)
class SplitPlan:
    """Bundles to split now and why each other hot bundle is not split."""

    splits: tuple[SplitDecision, ...]
    skipped: Mapping[str, str] = field(default_factory=dict)


def exceeded_thresholds(stats: BundleStats, cfg: PulsarConfig) -> tuple[str, ...]:
    """Which of Pulsar's four bundle maxima `stats` exceeds, each with its numbers."""
    out = []
    if stats.topics > cfg.namespace_bundle_max_topics:
        out.append(f"topics {stats.topics} > {cfg.namespace_bundle_max_topics}")
    if cfg.namespace_bundle_max_sessions > 0 and stats.sessions > cfg.namespace_bundle_max_sessions:
        out.append(f"sessions {stats.sessions} > {cfg.namespace_bundle_max_sessions}")
    if stats.msg_rate > cfg.namespace_bundle_max_msg_rate:
        out.append(f"msg rate {stats.msg_rate:.0f}/s > {cfg.namespace_bundle_max_msg_rate:.0f}/s")
    if stats.throughput > cfg.namespace_bundle_max_bandwidth_mbytes * MB:
        out.append(
            f"bandwidth {stats.throughput / MB:.1f} MB/s > "
            f"{cfg.namespace_bundle_max_bandwidth_mbytes:.0f} MB/s"
        )
    return tuple(out)


def decide_splits(
    layouts: Mapping[str, NamespaceBundles],
    stats: Mapping[str, Mapping[BundleRange, BundleStats]],
    cfg: PulsarConfig,
) -> SplitPlan:
    """Pulsar's `BundleSplitterTask`: split every bundle over a maximum, while its namespace
    stays within `namespace_maximum_bundles`; a bundle with fewer than two topics cannot be
    split. Namespaces and bundles are visited in order, so the result is deterministic."""
    if not cfg.auto_bundle_split_enabled:
        return SplitPlan((), {})
    splits: list[SplitDecision] = []
    skipped: dict[str, str] = {}
    for ns in sorted(layouts):
        layout = layouts[ns]
        count = len(layout)
        for bundle in layout.ranges:
            s = stats.get(ns, {}).get(bundle, BundleStats())
            why = exceeded_thresholds(s, cfg)
            if not why:
                continue
            name = layout.full_name(bundle)
            if s.topics < 2:
                skipped[name] = f"[one-topic] {', '.join(why)}, but a single topic cannot split"
            elif count >= cfg.namespace_maximum_bundles:
                skipped[name] = (
                    f"[max-bundles] {', '.join(why)}, but {ns} has {count} bundles "
                    f"(loadBalancerNamespaceMaximumBundles {cfg.namespace_maximum_bundles})"
                )
            else:
                splits.append(SplitDecision(ns, bundle, why))
                count += 1
    return SplitPlan(tuple(splits), skipped)


def bundle_stats(
    layout: NamespaceBundles, loads: Iterable[TopicLoad]
) -> dict[BundleRange, BundleStats]:
    """Aggregate topic loads of one namespace by bundle."""
    groups: dict[BundleRange, list[TopicLoad]] = {r: [] for r in layout.ranges}
    for t in loads:
        groups[layout.bundle_for_topic(t.topic)].append(t)
    return {r: BundleStats.of(ts) for r, ts in groups.items()}
