"""Simulation scenarios: a cluster, its topics and a timeline of events, read from YAML."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ballast.config import ConfigError, LoadManagerConfig, explain_validation_error, lists_to_tuples


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BrokerSpec(_Model):
    """A simulated broker; capacities scale how much CPU/memory a unit of traffic costs."""

    id: str
    cpu_capacity: float = Field(default=1.0, gt=0)
    mem_capacity: float = Field(default=1.0, gt=0)


class TopicSpec(_Model):
    """A group of topics with a traffic profile.

    Byte rates follow a log-normal spread (`skew` is its sigma; 0 = all equal). `place_on` pins
    the initial placement round-robin over the listed brokers; otherwise the configured
    strategy places them.
    """

    count: int = Field(ge=1)
    namespace: str = "default"
    prefix: str = "topic"
    age_seconds: float = Field(default=86_400, ge=0)
    msg_rate: float = Field(default=100.0, ge=0)
    byte_rate: float = Field(default=100_000.0, ge=0)
    skew: float = Field(default=0.0, ge=0)
    producers: int = Field(default=1, ge=0)
    consumers: int = Field(default=1, ge=0)
    place_on: tuple[str, ...] = ()


class GrowSpec(_Model):
    """`count` topics (chosen by the seed) ramp their traffic up by `factor`."""

    count: int = Field(ge=1)
    factor: float = Field(gt=0)
    over_seconds: float = Field(default=3600, gt=0)
    prefix: str | None = None


class Event(_Model):
    """Something that happens at `at` seconds: exactly one action per event."""

    at: float = Field(ge=0)
    add_brokers: tuple[BrokerSpec, ...] = ()
    kill_broker: str | None = None
    drain_broker: str | None = None
    create_topics: TopicSpec | None = None
    grow_topics: GrowSpec | None = None

    @model_validator(mode="after")
    def _one_action(self) -> Event:
        actions = [
            bool(self.add_brokers),
            self.kill_broker is not None,
            self.drain_broker is not None,
            self.create_topics is not None,
            self.grow_topics is not None,
        ]
        if sum(actions) != 1:
            raise ValueError(
                "an event needs exactly one of add_brokers, kill_broker, drain_broker, "
                "create_topics, grow_topics"
            )
        return self


class Scenario(_Model):
    """A whole simulation."""

    name: str
    description: str = ""
    seed: int = 0
    duration_hours: float = Field(default=12, gt=0)
    step_seconds: Annotated[float | None, Field(gt=0)] = None
    sample_every_seconds: float = Field(default=1800, gt=0)
    load_manager: LoadManagerConfig = LoadManagerConfig()
    brokers: tuple[BrokerSpec, ...]
    topics: tuple[TopicSpec, ...] = ()
    events: tuple[Event, ...] = ()

    @property
    def step(self) -> float:
        return self.step_seconds or self.load_manager.rebalancing.check_interval_seconds


def builtin_names() -> list[str]:
    """Names of the scenarios shipped with Ballast."""
    folder = resources.files("ballast.simulate") / "scenarios"
    return sorted(
        p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml")
    )


def parse_scenario(data: Any, source: str) -> Scenario:
    """Validate a decoded scenario document."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level")
    lm = data.get("load_manager")
    if isinstance(lm, dict):
        # Validated as part of the scenario, so an error names `load_manager.<key>`.
        data = {**data, "load_manager": lists_to_tuples(lm)}
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{source}: {explain_validation_error(exc, Scenario)}") from None


def load_scenario(name_or_path: str, overrides: dict[str, Any] | None = None) -> Scenario:
    """Load a built-in scenario by name, or a YAML file by path."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        try:
            text = path.read_text()
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read scenario ({exc.strerror})") from None
        source = str(path)
    elif name_or_path in builtin_names():
        text = (
            resources.files("ballast.simulate") / "scenarios" / f"{name_or_path}.yaml"
        ).read_text()
        source = f"scenario '{name_or_path}'"
    else:
        raise ConfigError(
            f"unknown scenario {name_or_path!r}: built-in ones are {', '.join(builtin_names())}, "
            "or give a path to a YAML file"
        )
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: malformed YAML: {exc}") from None
    if overrides and isinstance(data, dict):
        data = {**data, **overrides}
    return parse_scenario(data, source)
