"""Configuration: the `load_manager` section of Danube's broker YAML, plus Ballast's additions.

Unknown keys and wrong types are rejected with the key's full path and the allowed values.
Aggressiveness presets fill every rebalancing value the file does not set explicitly.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError, model_validator


class ConfigError(ValueError):
    """An invalid configuration; the message lists every offending key by path."""


class Strategy(StrEnum):
    FAIR = "fair"
    BALANCED = "balanced"
    WEIGHTED_LOAD = "weighted_load"


class Aggressiveness(StrEnum):
    CONSERVATIVE = "conservative"
    BALANCED = "balanced"
    AGGRESSIVE = "aggressive"


# The reference document's table: CV threshold, check interval, max moves per hour.
PRESETS: dict[Aggressiveness, dict[str, float | int]] = {
    Aggressiveness.CONSERVATIVE: {
        "cv_threshold": 0.40,
        "check_interval_seconds": 600,
        "max_moves_per_hour": 5,
    },
    Aggressiveness.BALANCED: {
        "cv_threshold": 0.30,
        "check_interval_seconds": 300,
        "max_moves_per_hour": 10,
    },
    Aggressiveness.AGGRESSIVE: {
        "cv_threshold": 0.20,
        "check_interval_seconds": 120,
        "max_moves_per_hour": 20,
    },
}


# Enums arrive as strings from YAML: let those (only those) be coerced.
StrategyField = Annotated[Strategy, Strict(False)]
AggressivenessField = Annotated[Aggressiveness, Strict(False)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class RebalancingConfig(_Strict):
    """`load_manager.rebalancing`: when and how fast the leader moves topics."""

    enabled: bool = False
    aggressiveness: AggressivenessField = Aggressiveness.BALANCED
    cv_threshold: float = Field(0.30, gt=0, le=10)
    check_interval_seconds: float = Field(300, gt=0)
    max_moves_per_hour: int = Field(10, ge=0)
    cooldown_seconds: float = Field(60, ge=0)
    min_brokers_for_rebalance: int = Field(2, ge=2)
    min_topic_age_seconds: float = Field(300, ge=0)
    blacklist_topics: tuple[str, ...] = ()
    # Ballast addition: an episode, once started, goes on until CV falls below this.
    target_cv: float = Field(0.10, ge=0, le=10)
    # Ballast additions against noise and stuck moves (README "Rebalancing"):
    # - a source that has not sealed a moving topic after this many seconds is overruled:
    #   the leader proceeds and records the move as forced (the storage engine's fenced
    #   claim makes a late seal harmless);
    seal_timeout_seconds: float = Field(30, gt=0)
    # - a topic never moves back to the broker it left within this window;
    return_window_seconds: float = Field(3600, ge=0)
    # - no move while the spread of the active brokers' scores (max - min) is below this
    #   absolute floor (score units: topics for fair, points for balanced/weighted_load);
    min_imbalance: float = Field(2.0, ge=0)
    # - resource readings (cpu, memory, disk, network) are smoothed by an exponentially
    #   weighted average seeded with the first sample: u = w * u_prev + (1 - w) * sample.
    smoothing_weight: float = Field(0.9, ge=0, lt=1)

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        level = data.get("aggressiveness", Aggressiveness.BALANCED.value)
        try:
            preset = PRESETS[Aggressiveness(level)]
        except ValueError:
            return data  # the field validator reports the bad level with its path
        return {**preset, **data}

    @model_validator(mode="after")
    def _target_below_threshold(self) -> RebalancingConfig:
        if self.target_cv > self.cv_threshold:
            raise ValueError(
                f"target_cv ({self.target_cv}) must not exceed cv_threshold "
                f"({self.cv_threshold}): an episode would never start or never end"
            )
        return self


class LoadManagerConfig(_Strict):
    """`load_manager`: the section of Danube's `danube_broker.yml`, same defaults."""

    load_report_interval_seconds: float = Field(30, gt=0)
    assignment_strategy: StrategyField = Strategy.BALANCED
    rebalancing: RebalancingConfig = RebalancingConfig()


class BrokerConfig(_Strict):
    """`broker`: how one broker process identifies and exposes itself."""

    id: str | None = None
    broker_url: str = "127.0.0.1:6650"
    admin_url: str = "127.0.0.1:50051"
    rack: str | None = None
    domain: str | None = None
    registration_ttl_seconds: float = Field(32, gt=0)
    leader_ttl_seconds: float = Field(14, gt=0)


class MetricsConfig(_Strict):
    """`metrics`: the Prometheus endpoint."""

    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = Field(9040, ge=0, le=65535)


class HistoryConfig(_Strict):
    """`history`: where the leader appends every load report for the data pipeline."""

    enabled: bool = True
    directory: str = "./load-history"


class BallastConfig(_Strict):
    """The whole broker configuration file."""

    load_manager: LoadManagerConfig = LoadManagerConfig()
    broker: BrokerConfig = BrokerConfig()
    metrics: MetricsConfig = MetricsConfig()
    history: HistoryConfig = HistoryConfig()


def _allowed_keys(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """Field names allowed at the parent of `loc` (for unknown-key errors)."""
    current: Any = model
    for part in loc[:-1]:
        fields = getattr(current, "model_fields", None)
        if not fields or part not in fields:
            return []
        current = fields[part].annotation
    return sorted(getattr(current, "model_fields", {}))


def explain_validation_error(exc: ValidationError, root: type[BaseModel]) -> str:
    lines = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        path = ".".join(str(p) for p in loc) or "<root>"
        if err["type"] == "extra_forbidden":
            allowed = ", ".join(_allowed_keys(root, loc))
            lines.append(f"{path}: unknown key (allowed: {allowed})")
        else:
            lines.append(f"{path}: {err['msg']} (got {err.get('input')!r})")
    return "invalid configuration:\n  " + "\n  ".join(lines)


def parse_config(data: Any, source: str = "<config>") -> BallastConfig:
    """Validate a decoded YAML/JSON document; raise `ConfigError` listing every problem."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level")
    try:
        # YAML gives lists; strict mode wants tuples for the blacklist.
        return BallastConfig.model_validate(lists_to_tuples(data))
    except ValidationError as exc:
        raise ConfigError(f"{source}: {explain_validation_error(exc, BallastConfig)}") from None


def load_config(path: str | Path | None) -> BallastConfig:
    """Load a YAML file (or the defaults when `path` is None)."""
    if path is None:
        return BallastConfig()
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read configuration ({exc.strerror})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: malformed YAML: {exc}") from None
    return parse_config(data, str(p))


def lists_to_tuples(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: lists_to_tuples(v) for k, v in value.items()}
    if isinstance(value, list):
        return tuple(lists_to_tuples(v) for v in value)
    return value
