"""The whole `analyze` job: outputs, plan rules, clear errors, s3:// through moto."""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import fsspec
import numpy as np
import pandas as pd
import pytest
from pyspark.sql import SparkSession
from typer.testing import CliRunner

from ballast.cli.pipeline import register
from ballast.config import BallastConfig, Strategy, parse_config
from ballast.model import LoadReport, TopicLoad
from ballast.pipeline.generate import GeneratorSpec, generate_history
from ballast.pipeline.job import AnalyzeOptions, PipelineError, run_analysis
from ballast.pipeline.schemas import OUTPUT_SCHEMAS

from .support import START, report, write_history


def _cli() -> CliRunner:
    return CliRunner()


def _app():  # type: ignore[no-untyped-def]
    import typer

    app = typer.Typer()
    register(app)
    return app


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("history")
    generate_history(GeneratorSpec(brokers=4, topics=40, hours=2, seed=5), str(root))
    return root


def test_outputs_have_the_stated_schemas(
    spark: SparkSession, generated: Path, tmp_path: Path
) -> None:
    config = parse_config({"load_manager": {"rebalancing": {"target_cv": 0.02}}})
    result = run_analysis(
        spark, AnalyzeOptions(history=str(generated), out=str(tmp_path), config=config)
    )
    assert result.records == result.reports == 4 * 240 - 120 - 60  # joiner at 1h, victim at 1.5h
    assert result.quarantined == {}
    assert result.brokers == ("broker-1", "broker-2", "broker-3", "broker-4")
    assert result.windows == 24
    for name, schema in OUTPUT_SCHEMAS.items():
        table = spark.read.parquet(str(tmp_path / name))
        got = [(f.name, f.dataType.simpleString()) for f in table.schema.fields]
        assert got == [(f.name, f.dataType.simpleString()) for f in schema.fields], name
        # readable without Spark
        assert list(pd.read_parquet(tmp_path / name).columns) == [f.name for f in schema.fields]
    comparison = pd.read_parquet(tmp_path / "strategy_comparison")
    assert sorted(comparison["strategy"].unique()) == sorted(s.value for s in Strategy)
    assert len(comparison) == len(Strategy) * 24
    policies = json.loads((tmp_path / "policy_comparison.json").read_text())
    assert [p["policy"] for p in policies] == ["danube", "threshold", "overload", "uniform"]
    # Replayed over the planning horizon's windows (1 h of 5-minute windows), not all 24.
    assert all(p["windows"] == 12 for p in policies)
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["strategy"] == "balanced"
    assert plan["departed_brokers"][0]["broker_id"] == "broker-2"
    assert {b["broker_id"] for b in plan["brokers"]} == {"broker-1", "broker-3", "broker-4"}
    assert plan["plan"]["after"]["cv"] <= plan["plan"]["before"]["cv"]
    assert plan["plan"]["moves"], "CV is above the 2 % target: there is work to do"
    assert plan["plan"]["after"]["cv"] < plan["plan"]["before"]["cv"]
    page = (tmp_path / "report.html").read_text()
    for png in re.findall(r'src="(charts/[^"]+\.png)"', page):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(re.findall(r'src="charts/', page)) == 3
    assert set(result.timings) >= {"compact", "read", "brokers", "topics", "plan"}
    # The history was compacted once (this test or an earlier one); the JSON stays.
    assert (generated / "_columnar" / "_committed").is_dir()
    assert list(generated.glob("date=*/hour=*/*.jsonl"))


def test_plan_respects_blacklist_age_and_broker_states(spark: SparkSession, tmp_path: Path) -> None:
    history = []
    for minute in range(21):
        t = START + 60 * minute
        topics = [TopicLoad(f"/ns/t{i}", 10.0, 1e5, 1, 1) for i in range(10)]
        topics += [TopicLoad(f"/ns/critical-{i}", 10.0, 1e5, 1, 1) for i in range(4)]
        if minute >= 16:  # first seen 4 minutes before the end: too young to move
            topics += [TopicLoad(f"/ns/young-{i}", 10.0, 1e5, 1, 1) for i in range(4)]
        history.append(report("b1", t, 50, 50, topics=topics))
        history.append(report("b2", t + 1, 5, 5))
        history.append((report("b3", t + 2, 1, 1), "draining"))
    write_history(tmp_path / "h", history)
    config = parse_config(
        {
            "load_manager": {
                "rebalancing": {
                    "blacklist_topics": ["/ns/critical-*"],
                    "min_topic_age_seconds": 600,
                }
            }
        }
    )
    result = run_analysis(
        spark,
        AnalyzeOptions(
            history=str(tmp_path / "h"),
            out=str(tmp_path / "o"),
            strategy=Strategy.FAIR,
            config=config,
        ),
    )
    moves = result.plan["plan"]["moves"]
    assert moves
    assert {(m["from_broker"], m["to_broker"]) for m in moves} == {("b1", "b2")}
    assert all(re.fullmatch(r"/ns/t\d", m["topic"]) for m in moves)
    assert result.plan["plan"]["after"]["cv"] < result.plan["plan"]["before"]["cv"]
    states = {b["broker_id"]: b["state"] for b in result.plan["brokers"]}
    assert states == {"b1": "active", "b2": "active", "b3": "draining"}
    # The strategy table leaves the draining broker out of the statistics.
    comparison = pd.read_parquet(tmp_path / "o" / "strategy_comparison")
    assert set(comparison["brokers"]) == {2}


def test_max_moves_caps_the_plan(spark: SparkSession, generated: Path, tmp_path: Path) -> None:
    config = parse_config({"load_manager": {"rebalancing": {"target_cv": 0.0}}})
    result = run_analysis(
        spark,
        AnalyzeOptions(
            history=str(generated),
            out=str(tmp_path),
            config=config,
            max_moves=1,
            horizon_seconds=7200.0,
        ),
    )
    assert len(result.plan["plan"]["moves"]) == 1
    # A horizon spanning the whole history replays the policies over all its windows.
    policies = json.loads((tmp_path / "policy_comparison.json").read_text())
    assert all(p["windows"] == 24 for p in policies)
    assert result.plan["plan"]["reason"] == "reached the move limit (1)"


def test_windows_of_many_samples_get_exact_p95s(
    spark: SparkSession, generated: Path, tmp_path: Path
) -> None:
    """15-minute windows of 30 s reports hold 30 samples per topic: too many for the
    two-largest shortcut, so the job recomputes the p95s the exact way."""
    run_analysis(
        spark, AnalyzeOptions(history=str(generated), out=str(tmp_path), window_seconds=900.0)
    )
    windows = pd.read_parquet(tmp_path / "topic_windows")
    assert windows["samples"].max() > 21 and windows["msg_rate_p95"].notna().all()
    rows = pd.read_parquet(generated / "_columnar" / "topics")
    rows["window"] = (rows["timestamp"] // 900) * 900
    for _, window in windows.sample(20, random_state=1).iterrows():
        start = window["window_start"].timestamp()
        values = rows[(rows["topic"] == window["topic"]) & (rows["window"] == start)]
        assert window["msg_rate_p95"] == np.percentile(values["msg_rate"], 95)


def test_empty_history_is_a_clear_message(spark: SparkSession, tmp_path: Path) -> None:
    (tmp_path / "h").mkdir()
    result = _cli().invoke(
        _app(), ["analyze", "--history", str(tmp_path / "h"), "--out", str(tmp_path / "o")]
    )
    assert result.exit_code == 1
    assert "Traceback" not in result.output
    assert f"no load history under {tmp_path / 'h'}" in _flat(result.output)
    missing = _cli().invoke(
        _app(), ["analyze", "--history", str(tmp_path / "nope"), "--out", str(tmp_path / "o")]
    )
    assert missing.exit_code == 1 and "does not exist" in _flat(missing.output)
    # Files whose every line is blank or broken.
    hour = tmp_path / "h" / "date=2026-01-01" / "hour=00"
    hour.mkdir(parents=True)
    (hour / "x.jsonl").write_text("\n\n")
    blank = _cli().invoke(
        _app(), ["analyze", "--history", str(tmp_path / "h"), "--out", str(tmp_path / "o")]
    )
    assert blank.exit_code == 1 and "hold no records" in _flat(blank.output)
    (hour / "x.jsonl").write_text('{"broker_id":"b1"\n{"broker_id":"b1","timestamp":-5}\n')
    broken = _cli().invoke(
        _app(), ["analyze", "--history", str(tmp_path / "h"), "--out", str(tmp_path / "o")]
    )
    assert broken.exit_code == 1
    # (a long temporary path may wrap mid-word: look for the word without whitespace)
    assert "none of the 2 records" in _flat(broken.output)
    assert "quarantine" in "".join(broken.output.split())
    assert len(pd.read_parquet(tmp_path / "o" / "quarantine")) == 2
    # The file changed after its hour was compacted (blank, then two bad lines): the hour
    # was compacted again, not served stale.


def test_one_broker_history_is_explained_not_a_crash(spark: SparkSession, tmp_path: Path) -> None:
    write_history(
        tmp_path / "h",
        [
            report("solo", START + 30 * i, 20, 30, topics=[TopicLoad("/ns/a", 1.0)])
            for i in range(12)
        ],
    )
    result = _cli().invoke(
        _app(),
        [
            "analyze",
            "--history",
            str(tmp_path / "h"),
            "--out",
            str(tmp_path / "o"),
            "--window",
            "1m",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "only one broker (solo)" in _flat(result.output)
    plan = json.loads((tmp_path / "o" / "plan.json").read_text())
    assert plan["plan"]["moves"] == []
    assert pd.read_parquet(tmp_path / "o" / "strategy_comparison")["cv"].eq(0).all()
    assert spark.range(1).count() == 1  # the CLI left the shared session running


def test_bad_options_are_explained(tmp_path: Path) -> None:
    result = _cli().invoke(
        _app(), ["analyze", "--history", "x", "--out", "y", "--window", "5 parsecs"]
    )
    assert result.exit_code == 2 and "invalid duration" in result.output
    with pytest.raises(PipelineError):
        from ballast.pipeline.job import parse_duration

        parse_duration("-5m")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture()
def s3() -> Iterator[dict[str, str]]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=_free_port())
    server.start()
    host, port = server.get_host_and_port()
    options = {"endpoint_url": f"http://{host}:{port}", "key": "testing", "secret": "testing"}
    try:
        fs = fsspec.filesystem("s3", skip_instance_cache=True, **options)
        fs.mkdir("ballast-test")
        yield options
    finally:
        server.stop()


def test_s3_input_and_output(
    spark: SparkSession, s3: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    generate_history(
        GeneratorSpec(brokers=3, topics=12, hours=1, seed=9), "s3://ballast-test/history", s3
    )
    result = run_analysis(
        spark,
        AnalyzeOptions(
            history="s3://ballast-test/history",
            out="s3://ballast-test/analysis",
            storage_options=s3,
            config=BallastConfig(),
        ),
    )
    assert result.outputs["plan"] == "s3://ballast-test/analysis/plan.json"
    fs = fsspec.filesystem("s3", skip_instance_cache=True, **s3)
    assert json.loads(fs.cat("ballast-test/analysis/plan.json"))["plan"] == result.plan["plan"]
    assert fs.exists("ballast-test/analysis/report.html")
    assert fs.glob("ballast-test/analysis/charts/*.png")
    windows = pd.read_parquet("s3://ballast-test/analysis/broker_windows", storage_options=s3)
    assert sorted(windows["broker_id"].unique()) == ["broker-1", "broker-2", "broker-3"]
    # The same history read locally gives the same tables.
    local = tmp_path / "local"
    fs.get("ballast-test/history", str(local), recursive=True)
    run_analysis(spark, AnalyzeOptions(history=str(local), out=str(tmp_path / "o")))
    pd.testing.assert_frame_equal(windows, pd.read_parquet(tmp_path / "o" / "broker_windows"))
    # A second run replaces the outputs instead of mixing old part files in.
    run_analysis(
        spark,
        AnalyzeOptions(
            history="s3://ballast-test/history",
            out="s3://ballast-test/analysis",
            storage_options=s3,
        ),
    )
    assert len(fs.glob("ballast-test/analysis/broker_windows/*.parquet")) == 1


def test_generate_command(tmp_path: Path) -> None:
    result = _cli().invoke(
        _app(),
        [
            "history",
            "generate",
            "--out",
            str(tmp_path),
            "--brokers",
            "3",
            "--topics",
            "5",
            "--hours",
            "1",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "broker-3 joins" in result.output
    files = list(tmp_path.glob("date=*/hour=*/*.jsonl"))
    assert len(files) == 1
    LoadReport.from_json(files[0].read_text().splitlines()[0])
    bad = _cli().invoke(_app(), ["history", "generate", "--out", str(tmp_path), "--brokers", "0"])
    assert bad.exit_code == 2 and "--brokers must be at least 1" in bad.output
