"""The synthetic history: the sink's exact format, realistic shapes, reproducible."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ballast.model import LoadReport
from ballast.pipeline.generate import GeneratorError, GeneratorSpec, generate_history


def _lines(files: tuple[str, ...]) -> list[str]:
    return [line for f in files for line in Path(f).read_text().splitlines()]


def test_every_line_is_exactly_the_sinks_json(tmp_path: Path) -> None:
    result = generate_history(GeneratorSpec(brokers=4, topics=40, hours=2.5, seed=3), str(tmp_path))
    lines = _lines(result.files)
    assert len(lines) == result.reports
    # Byte for byte what the sink writes: LoadReport.to_json() of the parsed report,
    # derived totals included (summed in the same order).
    for line in lines:
        assert LoadReport.from_json(line).to_json() == line
    assert sum(len(json.loads(x)["topics"]) for x in lines) == result.topic_rows
    assert [Path(f).relative_to(tmp_path).as_posix() for f in result.files] == [
        f"date=2026-01-01/hour=0{h}/generator.jsonl" for h in range(3)
    ]


def test_scale_out_and_failure_are_in_the_data(tmp_path: Path) -> None:
    spec = GeneratorSpec(brokers=3, topics=30, hours=2, seed=1, interval_seconds=60)
    result = generate_history(spec, str(tmp_path))
    reports = [LoadReport.from_json(x) for x in _lines(result.files)]
    seen: dict[str, list[float]] = {}
    for r in reports:
        seen.setdefault(r.broker_id, []).append(r.timestamp)
    assert result.joined == {"broker-3": spec.start + 3600}
    assert result.died == {"broker-2": spec.start + 5400}
    assert min(seen["broker-3"]) >= spec.start + 3600
    assert max(seen["broker-2"]) < spec.start + 5400
    # Every existing topic is reported by exactly one broker per round.
    per_round: dict[int, list[str]] = {}
    for r in reports:
        per_round.setdefault(int((r.timestamp - spec.start) // 60), []).extend(
            t.topic for t in r.topics
        )
    for names in per_round.values():
        assert len(names) == len(set(names))
    created_late = [t for t, at in result.topic_created.items() if at > spec.start]
    assert created_late, "some topics are created during the run"
    # Zipf: the busiest topic carries far more than the median one.
    rates = sorted(t.msg_rate for t in reports[0].topics)
    assert rates[-1] > 10 * rates[len(rates) // 2]


def test_same_seed_same_bytes(tmp_path: Path) -> None:
    spec = GeneratorSpec(brokers=2, topics=10, hours=0.5, seed=7)
    a = generate_history(spec, str(tmp_path / "a"))
    b = generate_history(spec, str(tmp_path / "b"))
    c = generate_history(
        GeneratorSpec(brokers=2, topics=10, hours=0.5, seed=8), str(tmp_path / "c")
    )
    assert _lines(a.files) == _lines(b.files) != _lines(c.files)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (GeneratorSpec(brokers=0, topics=1, hours=1), "--brokers"),
        (GeneratorSpec(brokers=1, topics=0, hours=1), "--topics"),
        (GeneratorSpec(brokers=1, topics=1, hours=0), "--hours"),
        (GeneratorSpec(brokers=1, topics=1, hours=1, interval_seconds=0.0001), "--interval"),
    ],
)
def test_impossible_parameters_are_explained(
    spec: GeneratorSpec, message: str, tmp_path: Path
) -> None:
    with pytest.raises(GeneratorError, match=message):
        generate_history(spec, str(tmp_path))
