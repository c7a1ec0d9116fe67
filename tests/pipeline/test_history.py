"""The history layout shared with the cluster's sink."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ballast.load_history import HistoryWriter, history_dir, history_line, history_path
from ballast.model import LoadReport, ModelError, TopicLoad

T = 1_767_229_261.5  # 2026-01-01T01:01:01.5Z


def test_history_path_is_date_and_hour_in_utc() -> None:
    assert history_path("/data/h", T) == "/data/h/date=2026-01-01/hour=01/history.jsonl"
    assert (
        history_path("s3://b/p/", T, "leader-b1")
        == "s3://b/p/date=2026-01-01/hour=01/leader-b1.jsonl"
    )
    assert history_dir("/x", T + 23 * 3600) == "/x/date=2026-01-02/hour=00"


def test_writer_name_is_validated() -> None:
    with pytest.raises(ModelError, match="history writer name"):
        history_path("/x", T, "../evil")


def test_line_is_the_report_json_plus_state() -> None:
    r = LoadReport("b1", T, 10.0, 20.0, topics=(TopicLoad("/ns/t", 1.0, 2.0, 1, 1, 1, 3),))
    assert json.loads(history_line(r)) == r.to_dict()
    assert json.loads(history_line(r, "draining")) == {**r.to_dict(), "state": "draining"}
    with pytest.raises(ValueError):
        history_line(r, "sleeping")


def test_writer_appends_to_hourly_files(tmp_path: Path) -> None:
    a = LoadReport("b1", T, 1.0)
    b = LoadReport("b2", T + 10, 2.0)
    c = LoadReport("b1", T + 3600, 3.0)
    with HistoryWriter(tmp_path, "w1") as writer:
        assert writer.append(a) == writer.append(b, "drained")
        writer.append(c)
    with HistoryWriter(tmp_path, "w1") as writer:  # a restart appends, never truncates
        writer.append(a)
    first = (tmp_path / "date=2026-01-01/hour=01/w1.jsonl").read_text().splitlines()
    second = (tmp_path / "date=2026-01-01/hour=02/w1.jsonl").read_text().splitlines()
    assert [LoadReport.from_json(x) for x in first] == [a, b, a]
    assert json.loads(first[1])["state"] == "drained"
    assert [LoadReport.from_json(x) for x in second] == [c]
