from __future__ import annotations

from pathlib import Path

import pytest

from ballast.config import Aggressiveness, ConfigError, Strategy, load_config, parse_config


def test_defaults_match_the_reference_document() -> None:
    lm = load_config(None).load_manager
    assert lm.load_report_interval_seconds == 30
    assert lm.assignment_strategy is Strategy.BALANCED
    r = lm.rebalancing
    assert (r.enabled, r.aggressiveness) == (False, Aggressiveness.BALANCED)
    assert (r.check_interval_seconds, r.max_moves_per_hour, r.cooldown_seconds) == (300, 10, 60)
    assert (r.min_brokers_for_rebalance, r.min_topic_age_seconds) == (2, 300)
    assert r.blacklist_topics == () and r.cv_threshold == 0.30 and r.target_cv == 0.10


@pytest.mark.parametrize(
    ("level", "cv", "interval", "moves"),
    [("conservative", 0.40, 600, 5), ("balanced", 0.30, 300, 10), ("aggressive", 0.20, 120, 20)],
)
def test_presets(level: str, cv: float, interval: int, moves: int) -> None:
    r = parse_config({"load_manager": {"rebalancing": {"aggressiveness": level}}})
    got = r.load_manager.rebalancing
    assert (got.cv_threshold, got.check_interval_seconds, got.max_moves_per_hour) == (
        cv,
        interval,
        moves,
    )


def test_explicit_values_override_the_preset(tmp_path: Path) -> None:
    f = tmp_path / "broker.yml"
    f.write_text(
        "load_manager:\n"
        "  assignment_strategy: weighted_load\n"
        "  rebalancing:\n"
        "    enabled: true\n"
        "    aggressiveness: aggressive\n"
        "    max_moves_per_hour: 7\n"
        "    blacklist_topics: ['/system/*']\n"
    )
    r = load_config(f).load_manager
    assert r.assignment_strategy is Strategy.WEIGHTED_LOAD
    assert r.rebalancing.max_moves_per_hour == 7
    assert r.rebalancing.check_interval_seconds == 120  # still from the preset
    assert r.rebalancing.blacklist_topics == ("/system/*",)


@pytest.mark.parametrize(
    ("doc", "fragment"),
    [
        (
            {"load_manager": {"rebalancing": {"aggresiveness": "x"}}},
            "load_manager.rebalancing.aggresiveness: unknown key (allowed: aggressiveness,",
        ),
        (
            {"load_manager": {"assignment_strategy": "random"}},
            "load_manager.assignment_strategy: Input should be 'fair', 'balanced', "
            "'weighted_load', 'least_long_term_message_rate' or "
            "'least_resource_usage_with_weight' (got 'random')",
        ),
        (
            {"load_manager": {"rebalancing": {"max_moves_per_hour": "5"}}},
            "load_manager.rebalancing.max_moves_per_hour: Input should be a valid integer",
        ),
        (
            {"loadmanager": {}},
            "loadmanager: unknown key (allowed: auth, broker, connections, data_plane, gateway,",
        ),
        (
            {"load_manager": {"rebalancing": {"target_cv": 0.5}}},
            "target_cv (0.5) must not exceed cv_threshold",
        ),
    ],
)
def test_bad_config_is_rejected_with_path(doc: dict, fragment: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(doc)
    assert fragment in str(err.value)


def test_unreadable_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read configuration"):
        load_config(tmp_path / "missing.yml")
    bad = tmp_path / "bad.yml"
    bad.write_text("load_manager: [unclosed\n")
    with pytest.raises(ConfigError, match="malformed YAML"):
        load_config(bad)


def test_noise_and_seal_timeout_fields_have_defaults_and_bounds() -> None:
    r = parse_config({}).load_manager.rebalancing
    assert (r.seal_timeout_seconds, r.return_window_seconds) == (30, 3600)
    assert (r.min_imbalance, r.smoothing_weight) == (2.0, 0.9)
    with pytest.raises(ConfigError, match="smoothing_weight"):
        parse_config({"load_manager": {"rebalancing": {"smoothing_weight": 1.0}}})
    with pytest.raises(ConfigError, match="seal_timeout_seconds"):
        parse_config({"load_manager": {"rebalancing": {"seal_timeout_seconds": 0}}})
