"""The record vocabulary: key kinds and the values readers decode, each failure a
`ValueError` naming what is wrong (the caller skips the record and keeps going)."""

from __future__ import annotations

import pytest

from ballast.metadata import keys
from ballast.metadata.records import (
    RecordKind,
    anti_affinity_value,
    classify,
    failure_domain_value,
    parse_anti_affinity_value,
    parse_failure_domain_value,
)
from ballast.model import ModelError


def test_keys_of_no_kind_are_other_and_a_misfit_is_named() -> None:
    assert classify(keys.topic_owner("/ns/t")) == (RecordKind.OWNER, None, "/ns/t")
    assert classify(keys.topic_meta("/ns/t")) == (RecordKind.TOPIC, None, "/ns/t")
    assert classify(keys.failure_domain("rack-a"))[0] is RecordKind.OTHER
    assert classify(keys.subscription_cursor("/ns/t", "s"))[0] is RecordKind.OTHER
    with pytest.raises(ValueError, match="'/cluster/owners/ns' is not an ownership-record key"):
        classify("/cluster/owners/ns")


def test_pulsar_values_round_trip_and_bad_ones_are_named() -> None:
    assert parse_failure_domain_value(failure_domain_value(["b2", "b1"])) == ("b1", "b2")
    assert parse_anti_affinity_value(anti_affinity_value("g")) == "g"
    assert parse_anti_affinity_value({}) is None
    with pytest.raises(ModelError, match=r"failure_domain\.brokers: expected a list"):
        parse_failure_domain_value({"brokers": "b1"})
    with pytest.raises(ModelError, match=r"failure_domain\.brokers: invalid broker id"):
        parse_failure_domain_value({"brokers": ["a/b"]})
    with pytest.raises(ModelError, match=r"anti_affinity\.group: expected a name"):
        parse_anti_affinity_value({"group": ""})
    with pytest.raises(ModelError, match="anti_affinity: expected a JSON object"):
        parse_anti_affinity_value(["g"])
