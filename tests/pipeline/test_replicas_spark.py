"""The Spark engine plans exactly what the local engine plans (and the CLI uses it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from typer.testing import CliRunner

from ballast.balance.kafka.replicas import (
    KafkaBroker,
    PartitionAssignment,
    group_topics,
    make_layout,
    plan_replicas,
)
from ballast.cli.main import app
from ballast.pipeline.replicas import plan_replicas_spark


def _cluster(rf: int = 3) -> tuple[list[KafkaBroker], list[PartitionAssignment]]:
    """9 brokers in 3 racks (one without a rack), topics of 1..40 partitions, one
    partition at RF 2, many rack violations; every stage of the planner has work."""
    brokers = [KafkaBroker(i, f"r{i % 3}" if i != 8 else None) for i in range(9)]
    assignment = []
    for t, size in enumerate((40, 17, 6, 1, 3)):
        for p in range(size):
            width = rf if (t, p) != (1, 0) else 2
            replicas = tuple((p + 3 * j + t) % 8 for j in range(width))
            assignment.append(PartitionAssignment(f"topic-{t}", p, replicas))
    assignment.append(PartitionAssignment("crowded", 0, (0, 3, 1)))  # r0 twice
    return brokers, assignment


@pytest.mark.parametrize("rack_aware", [True, False])
def test_spark_plan_equals_local_plan(spark: SparkSession, rack_aware: bool) -> None:
    brokers, assignment = _cluster()
    layout = make_layout(brokers, add=[9, 10], remove=[4], rack_aware=rack_aware, max_rf=3)
    topics = group_topics(assignment, layout)
    local = plan_replicas(topics, layout)
    on_spark = plan_replicas_spark(spark, topics, layout, slices=3)
    assert local.replica_moves > 0 and local.changes
    assert local.rack_violations_before > 0
    assert local.rack_violations_after == 0 or not rack_aware
    assert on_spark == local


def test_cli_engine_spark_writes_the_same_files(spark: SparkSession, tmp_path: Path) -> None:
    brokers, assignment = _cluster()
    (tmp_path / "brokers.json").write_text(
        json.dumps({"brokers": [{"id": b.id, "rack": b.rack} for b in brokers]})
    )
    (tmp_path / "current.json").write_text(
        json.dumps(
            {
                "version": 1,
                "partitions": [
                    {"topic": a.topic, "partition": a.partition, "replicas": list(a.replicas)}
                    for a in assignment
                ],
            }
        )
    )
    outputs = {}
    for engine in ("local", "spark"):
        out = tmp_path / f"{engine}.json"
        result = CliRunner().invoke(
            app,
            [
                "plan",
                "kafka",
                "--current",
                str(tmp_path / "current.json"),
                "--brokers",
                str(tmp_path / "brokers.json"),
                "--add",
                "9",
                "--out",
                str(out),
                "--engine",
                engine,
                "--json",
            ],
        )
        assert result.exit_code == 0, result.output
        summary = json.loads(result.stdout)
        assert summary["engine"] == engine
        outputs[engine] = (out.read_text(), summary["replica_moves"], summary["lower_bound"])
    assert outputs["spark"] == outputs["local"]
    # The session belongs to the tests: the command must not have stopped it.
    assert spark.range(1).count() == 1
