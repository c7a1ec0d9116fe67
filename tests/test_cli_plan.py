"""`ballast plan kafka` as a user runs it: files in, files out, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ballast.balance.kafka.reassignment import parse_assignment
from ballast.cli.main import app


def _write(path: Path, doc: object) -> Path:
    path.write_text(json.dumps(doc) if not isinstance(doc, str) else doc)
    return path


@pytest.fixture
def cluster(tmp_path: Path) -> dict[str, Path]:
    """Six brokers in three racks, one topic of 12 partitions at RF 3 with log dirs."""
    brokers = {"brokers": [{"id": i, "rack": f"r{i % 3}"} for i in range(6)]}
    brokers["brokers"] += [{"id": 6, "rack": "r0"}, {"id": 7, "rack": "r1"}, {"id": 8}]
    partitions = [
        {
            "topic": "orders",
            "partition": p,
            "replicas": [p % 6, (p + 1) % 6, (p + 2) % 6],
            "log_dirs": ["/data/a", "/data/b", "/data/c"],
        }
        for p in range(12)
    ]
    return {
        "brokers": _write(tmp_path / "brokers.json", brokers),
        "current": _write(tmp_path / "current.json", {"version": 1, "partitions": partitions}),
        "out": tmp_path / "reassignment.json",
        "rollback": tmp_path / "rollback.json",
    }


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["plan", "kafka", *args])
    return result.exit_code, result.stdout, result.stderr


def test_plan_writes_reassignment_and_rollback(cluster: dict[str, Path]) -> None:
    code, out, _ = run(
        "--current", str(cluster["current"]), "--brokers", str(cluster["brokers"]),
        "--add", "6,7", "--out", str(cluster["out"]), "--rollback", str(cluster["rollback"]),
    )  # fmt: skip
    assert code == 0, out
    assert "replica moves" in out and "= lower bound" in out and "round robin" in out
    assert "brokers that change" in out
    proposed = json.loads(cluster["out"].read_text())
    rollback = json.loads(cluster["rollback"].read_text())
    assert proposed["version"] == rollback["version"] == 1
    assert [p["partition"] for p in proposed["partitions"]] == [
        p["partition"] for p in rollback["partitions"]
    ]
    current = {a.partition: a for a in parse_assignment(cluster["current"].read_text())}
    for entry, back in zip(proposed["partitions"], rollback["partitions"], strict=True):
        before = current[entry["partition"]]
        # The rollback is exactly the current assignment, log dirs included.
        assert back["replicas"] == list(before.replicas)
        assert back["log_dirs"] == list(before.log_dirs or ())
        # Kept replicas keep their log dir; new ones may go anywhere.
        dirs = dict(zip(before.replicas, before.log_dirs or (), strict=True))
        assert entry["log_dirs"] == [dirs.get(b, "any") for b in entry["replicas"]]
    # Every broker of the brokers file takes its share, listed in --add or not.
    held = {b for e in proposed["partitions"] for b in e["replicas"]}
    assert {6, 7, 8} <= held


def test_json_summary_for_machines(cluster: dict[str, Path]) -> None:
    code, out, _ = run(
        "--current", str(cluster["current"]), "--brokers", str(cluster["brokers"]),
        "--remove", "5", "--no-rack-aware", "--out", str(cluster["out"]), "--json",
    )  # fmt: skip
    assert code == 0, out
    summary = json.loads(out)
    assert summary["replica_moves"] == summary["lower_bound"] > 0
    assert summary["rack_aware"] is False
    assert summary["round_robin_moves"] >= summary["replica_moves"]
    loads = {b["id"]: b for b in summary["brokers"]}
    assert loads[5]["state"] == "removed" and loads[5]["replicas_after"] == 0
    assert summary["written"] == {"reassignment": str(cluster["out"])}


@pytest.mark.parametrize(
    ("current", "extra", "message"),
    [
        ('{"version":1,"partitions":[', [], "not valid JSON"),
        (
            '{"partitions":[{"topic":"orders","partition":2,"replicas":[1,2,1]}]}',
            [],
            "orders-2: duplicate replicas [1, 2, 1]",
        ),
        (
            '{"partitions":[{"topic":"orders","partition":7,"replicas":[1,42]}]}',
            [],
            "orders-7: replicas [1, 42] name unknown broker(s) [42]",
        ),
        (
            '{"partitions":[{"topic":"big","partition":0,"replicas":[0,1,2,3,4,5,6,7,8]}]}',
            ["--remove", "8"],
            "big-0: replication factor 9 larger than available brokers: 8",
        ),
        (
            '{"partitions":[{"topic":"wide","partition":0,"replicas":[0,1,2,3,4]}]}',
            ["--strict-racks"],
            "wide-0: replication factor 5 larger than available racks: 4 (3 racks and 1 "
            "broker(s) without a rack)",
        ),
        ('{"partitions":[]}', ["--add", "x"], "--add 'x': 'x' is not a broker id"),
        ('{"partitions":[]}', ["--remove", "99"], "--remove 99: not a known broker"),
    ],
)
def test_bad_input_is_a_clear_error_not_a_traceback(
    cluster: dict[str, Path], current: str, extra: list[str], message: str
) -> None:
    bad = _write(cluster["current"].parent / "bad.json", current)
    code, out, err = run(
        "--current", str(bad), "--brokers", str(cluster["brokers"]), "--out",
        str(cluster["out"]), *extra,
    )  # fmt: skip
    assert code == 2
    assert message in " ".join(err.split()), err
    assert "Traceback" not in err + out
    assert not cluster["out"].exists()


def test_unreadable_and_unwritable_paths(cluster: dict[str, Path], tmp_path: Path) -> None:
    code, _, err = run(
        "--current", str(tmp_path / "missing.json"), "--brokers", str(cluster["brokers"]),
        "--out", str(cluster["out"]),
    )  # fmt: skip
    # (a long temporary path may wrap mid-word: look for the name without whitespace)
    assert code == 2 and "--current" in err and "missing.json" in "".join(err.split())
    code, _, err = run(
        "--current", str(cluster["current"]), "--brokers", str(cluster["brokers"]),
        "--out", str(tmp_path / "no-such-dir" / "out.json"),
    )  # fmt: skip
    assert code == 1 and "cannot write" in " ".join(err.split())


def test_help_names_every_option() -> None:
    result = CliRunner().invoke(app, ["plan", "kafka", "--help"])
    assert result.exit_code == 0
    for option in (
        "--current", "--brokers", "--add", "--remove", "--rack-aware", "--no-rack-aware",
        "--out", "--rollback", "--engine", "--master", "--json",
    ):  # fmt: skip
        assert option in result.stdout, option


def test_parse_execute_assignment_args_an_empty_plan_writes_nothing(tmp_path: Path) -> None:
    # ReassignPartitionsUnitTest#testParseExecuteAssignmentArgs: `--execute` rejects
    # {"version":1,"partitions":[]} ("Partition reassignment list cannot be empty"), so a
    # plan that changes nothing says so, writes no file and exits with status 3.
    brokers = _write(
        tmp_path / "brokers.json", {"brokers": [{"id": i, "rack": f"r{i}"} for i in range(3)]}
    )
    partitions = [
        {"topic": "orders", "partition": p, "replicas": [p % 3, (p + 1) % 3, (p + 2) % 3]}
        for p in range(3)
    ]
    current = _write(tmp_path / "current.json", {"version": 1, "partitions": partitions})
    out, back = tmp_path / "out.json", tmp_path / "rollback.json"
    args = ["--current", str(current), "--brokers", str(brokers), "--out", str(out)]
    code, stdout, err = run(*args, "--rollback", str(back))
    assert code == 3, stdout + err
    assert "nothing to move" in " ".join(err.split())
    assert "replica moves" in stdout  # the summary is still printed
    assert not out.exists() and not back.exists()
    code, stdout, _ = run(*args, "--json")
    assert code == 3
    summary = json.loads(stdout)
    assert summary["nothing_to_move"] is True and summary["written"] == {}
    assert summary["replica_moves"] == 0 and not out.exists()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--add", "1,1,2"], "--add '1,1,2': broker list contains duplicate entries: 1"),
        (
            ["--remove", "5,2,3,4,5,2"],
            "--remove '5,2,3,4,5,2': broker list contains duplicate entries: 2,5",
        ),
        (["--remove", "42,5,99"], "--remove 42,99: not a known broker"),
        (["--add", "6,7", "--remove", "7,5"], "broker(s) 7 both in --add and in --remove"),
    ],
)
def test_parse_generate_assignment_args_duplicate_and_unknown_brokers(
    cluster: dict[str, Path], extra: list[str], message: str
) -> None:
    # ReassignPartitionsUnitTest#testParseGenerateAssignmentArgs: "1,1,2" and "5,2,3,4,5"
    # are refused ("Broker list contains duplicate entries"); Ballast names the ids.
    code, out, err = run(
        "--current", str(cluster["current"]), "--brokers", str(cluster["brokers"]),
        "--out", str(cluster["out"]), *extra,
    )  # fmt: skip
    assert code == 2, out
    assert message in " ".join(err.split()), err
    assert not cluster["out"].exists()
