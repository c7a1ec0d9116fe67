"""Tuning the balancer on a recorded history: the grid, the figures of one replay, the
Pareto front and the recommendation. Pure: `ballast.pipeline.tune` runs the replays (one
Spark task per combination) and writes what this module computes.

A grid file names the candidate values of load-manager settings, by their path in the
``load_manager`` section; every combination is one replay:

    base:                      # optional: the section every combination starts from
      rebalancing: {enabled: true}
    grid:                      # setting -> candidate values
      assignment_strategy: [balanced, fair]
      rebalancing.cv_threshold: [0.2, 0.3, 0.4]
      rebalancing.max_moves_per_hour: [5, 10, 20]
    measure:                   # optional: the yardstick, the same for every combination
      strategy: balanced       # CV of these scores (default: base's strategy)
      cv_threshold: 0.3        # "above the threshold" (default: base's cv_threshold)
      overload_percent: 85     # a broker above this CPU % is overloaded
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from pydantic import BaseModel, ValidationError

from ballast.config import (
    ConfigError,
    LoadManagerConfig,
    Strategy,
    explain_validation_error,
    lists_to_tuples,
)
from ballast.simulate.replay import RecordedMove, ReplayResult, fidelity

SECTIONS = ("base", "grid", "measure")
MEASURE_KEYS = ("strategy", "cv_threshold", "overload_percent")
# A grid this large is a typo more often than a plan (each combination is one replay).
MAX_COMBINATIONS = 10_000
# The recommendation: the fewest moves among configurations whose CV p95 is within this
# share of the best one's (imbalance first, then moves: a quiet but unbalanced cluster is
# not what an operator tunes for).
CV_SLACK = 0.10


@dataclass(frozen=True)
class Measure:
    strategy: Strategy
    cv_threshold: float
    overload_percent: float = 85.0


@dataclass(frozen=True)
class Grid:
    """A validated grid: the base section, the axes in file order and the yardstick."""

    base: Mapping[str, Any]
    axes: tuple[tuple[str, tuple[Any, ...]], ...]
    measure: Measure

    def combinations(self) -> list[dict[str, Any]]:
        """Each combination's settings, {dotted key: value}, in grid order."""
        keys = [k for k, _ in self.axes]
        return [
            dict(zip(keys, values, strict=True))
            for values in itertools.product(*(v for _, v in self.axes))
        ]

    def config(self, settings: Mapping[str, Any]) -> LoadManagerConfig:
        """The load_manager section of one combination."""
        return LoadManagerConfig.model_validate(lists_to_tuples(_apply(self.base, settings)))


def _apply(base: Mapping[str, Any], settings: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = _copy(base)
    for key, value in settings.items():
        node = out
        *parents, leaf = key.split(".")
        for part in parents:
            child = node.get(part)
            node[part] = child = _copy(child) if isinstance(child, dict) else {}
            node = child
        node[leaf] = value
    return out


def _copy(data: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _copy(v) if isinstance(v, Mapping) else v for k, v in data.items()}


def _check_key(key: str, source: str) -> None:
    """`key` must name a setting (not a whole section) of `LoadManagerConfig`."""
    model: type[BaseModel] = LoadManagerConfig
    parts = key.split(".")
    for depth, part in enumerate(parts):
        fields = model.model_fields
        if part not in fields:
            where = ".".join(parts[:depth]) or "load_manager"
            raise ConfigError(
                f"{source}: grid key {key!r}: {where} has no setting {part!r} "
                f"(it has: {', '.join(sorted(fields))})"
            )
        annotation = fields[part].annotation
        section = (
            annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel)
            else None
        )
        last = depth == len(parts) - 1
        if section is not None and last:
            raise ConfigError(
                f"{source}: grid key {key!r} is a section: name one of its settings "
                f"({', '.join(f'{key}.{f}' for f in sorted(section.model_fields))})"
            )
        if not last:
            if section is None:
                raise ConfigError(f"{source}: grid key {key!r}: {part!r} is not a section")
            model = section


def parse_grid(data: Any, source: str = "<grid>") -> Grid:
    """Validate a decoded grid document; `ConfigError` names the key and value at fault."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping with {', '.join(SECTIONS)}")
    unknown = sorted(set(data) - set(SECTIONS))
    if unknown:
        raise ConfigError(
            f"{source}: unknown section(s) {', '.join(map(repr, unknown))} "
            f"(a grid has {', '.join(SECTIONS)}; settings go under grid: as "
            "rebalancing.cv_threshold: [0.2, 0.3])"
        )
    base = data.get("base") or {}
    if not isinstance(base, dict):
        raise ConfigError(f"{source}: base: expected the load_manager section (a mapping)")
    try:
        base_config = LoadManagerConfig.model_validate(lists_to_tuples(base))
    except ValidationError as exc:
        text = explain_validation_error(exc, LoadManagerConfig)
        raise ConfigError(f"{source}: base: {text}") from None
    grid = data.get("grid")
    if not isinstance(grid, dict) or not grid:
        raise ConfigError(
            f"{source}: grid: expected settings with their candidate values, e.g. "
            "grid: {rebalancing.cv_threshold: [0.2, 0.3]}"
        )
    axes = []
    for key, values in grid.items():
        key = str(key)
        _check_key(key, source)
        candidates = tuple(values) if isinstance(values, list) else (values,)
        if not candidates:
            raise ConfigError(f"{source}: grid key {key!r}: no values")
        for value in candidates:
            try:
                LoadManagerConfig.model_validate(lists_to_tuples(_apply(base, {key: value})))
            except ValidationError as exc:
                reasons = "; ".join(e["msg"] for e in exc.errors())
                raise ConfigError(
                    f"{source}: grid key {key!r}: value {value!r} is invalid: {reasons}"
                ) from None
        axes.append((key, candidates))
    count = int(np.prod([len(v) for _, v in axes]))
    if count > MAX_COMBINATIONS:
        raise ConfigError(
            f"{source}: {count} combinations (more than {MAX_COMBINATIONS}): narrow the grid"
        )
    measure = data.get("measure") or {}
    if not isinstance(measure, dict) or set(measure) - set(MEASURE_KEYS):
        raise ConfigError(f"{source}: measure: expected some of {', '.join(MEASURE_KEYS)}")
    try:
        strategy = Strategy(measure.get("strategy", base_config.assignment_strategy))
        threshold = float(measure.get("cv_threshold", base_config.rebalancing.cv_threshold))
        overload = float(measure.get("overload_percent", 85.0))
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{source}: measure: {exc}") from None
    if not (threshold > 0 and 0 < overload <= 100):
        raise ConfigError(
            f"{source}: measure: cv_threshold must be > 0 and overload_percent in (0, 100]"
        )
    return Grid(base, tuple(axes), Measure(strategy, threshold, overload))


def load_grid(path: str | Path) -> Grid:
    """Read and validate a grid YAML file."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read grid ({exc.strerror})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: malformed YAML: {exc}") from None
    return parse_grid(data, str(path))


@dataclass(frozen=True)
class Outcome:
    """The figures of one configuration's replay."""

    config_id: int
    settings: Mapping[str, Any]
    moves: int
    moved_mbps: float  # the moved topics' recorded throughput when they moved
    cv_p50: float
    cv_p95: float
    cv_max: float
    minutes_above_threshold: float
    broker_minutes_overloaded: float
    failovers: int
    # The share of the moves the history shows that this replay made (same topic, same
    # destination, within a check interval and a step): for the configuration the cluster
    # ran, how faithful the replay is.
    live_moves_reproduced: float
    replay_seconds: float  # wall time of the replay


def outcome(
    config_id: int,
    settings: Mapping[str, Any],
    result: ReplayResult,
    measure: Measure,
    seconds: float,
    live: tuple[RecordedMove, ...] = (),
) -> Outcome:
    """Summarise one replay (each sample stands for one step of virtual time); `live`:
    the moves the history shows."""
    tolerance = result.load_manager.rebalancing.check_interval_seconds + result.step_seconds
    reproduced = fidelity(live, result.moves, tolerance).share
    cvs = np.array([s.cv for s in result.samples], dtype=float)
    step_minutes = result.step_seconds / 60.0
    return Outcome(
        config_id=config_id,
        settings=dict(settings),
        moves=len(result.moves),
        moved_mbps=round(result.moved_mbps, 6),
        cv_p50=float(np.percentile(cvs, 50)) if cvs.size else 0.0,
        cv_p95=float(np.percentile(cvs, 95)) if cvs.size else 0.0,
        cv_max=float(cvs.max()) if cvs.size else 0.0,
        minutes_above_threshold=float((cvs > measure.cv_threshold).sum() * step_minutes),
        broker_minutes_overloaded=float(sum(s.overloaded for s in result.samples) * step_minutes),
        failovers=result.failovers,
        live_moves_reproduced=round(reproduced, 4),
        replay_seconds=round(seconds, 3),
    )


def pareto_front(outcomes: Sequence[Outcome]) -> list[int]:
    """Ids of the configurations no other beats on both moves and CV p95 (fewer moves
    and no worse imbalance, or less imbalance and no more moves), by moves."""
    front = [
        o
        for o in outcomes
        if not any(
            p.moves <= o.moves
            and p.cv_p95 <= o.cv_p95
            and (p.moves < o.moves or p.cv_p95 < o.cv_p95)
            for p in outcomes
        )
    ]
    return [o.config_id for o in sorted(front, key=lambda o: (o.moves, o.cv_p95, o.config_id))]


@dataclass(frozen=True)
class Recommendation:
    config_id: int
    reason: str


def recommend(outcomes: Sequence[Outcome]) -> Recommendation:
    """The fewest moves among the configurations whose CV p95 is within `CV_SLACK` of the
    best; ties go to less time above the threshold, then to the lower CV p95."""
    best = min(o.cv_p95 for o in outcomes)
    bound = best * (1 + CV_SLACK) + 1e-12
    near = [o for o in outcomes if o.cv_p95 <= bound]
    chosen = min(near, key=lambda o: (o.moves, o.minutes_above_threshold, o.cv_p95, o.config_id))
    most = max(o.moves for o in near)
    reason = (
        f"fewest moves ({chosen.moves}) among the {len(near)} of {len(outcomes)} "
        f"configurations whose CV p95 is within {CV_SLACK:.0%} of the best "
        f"({best:.1%}): CV p95 {chosen.cv_p95:.1%}, max {chosen.cv_max:.1%}, "
        f"{chosen.minutes_above_threshold:.0f} min above the threshold, "
        f"{chosen.broker_minutes_overloaded:.0f} broker-minutes overloaded"
    )
    if most > chosen.moves:
        reason += f" (the others among them make up to {most} moves)"
    return Recommendation(chosen.config_id, reason)


def recommended_section(grid: Grid, settings: Mapping[str, Any]) -> dict[str, Any]:
    """The `load_manager` section to paste: the settings that differ from the defaults,
    and every tuned setting even where the winner is the default (it was chosen)."""
    config = grid.config(settings)
    full = config.model_dump(mode="json")
    tuned = {}
    for key in settings:
        node = full
        for part in key.split("."):
            node = node[part]
        tuned[key] = node
    return {"load_manager": _apply(config.model_dump(mode="json", exclude_defaults=True), tuned)}
