"""A failover over several rounds moves the topics with clients first: theirs are the
clients waiting (10 000 topics take 25 rounds of `FAILOVER_TOPICS_PER_ROUND`). A topic the
dead broker was moving is placed meanwhile, not after the last round."""

from __future__ import annotations

import json

import pytest

from ballast.leader import rounds
from tests.leader.script import Runner, parse

SCRIPT = """
config strategy=fair
----

bootstrap now=0
put /cluster/register/b1 {"broker_url": "b1:6650"}
put /cluster/register/b2 {"broker_url": "b2:6650"}
put /topics/default/a/meta {"created_at": 0}
put /topics/default/b/meta {"created_at": 0}
put /topics/default/c/meta {"created_at": 0}
put /cluster/brokers/b1/default/a {"assigned_at": 0, "epoch": 1}
put /cluster/owners/default/a {"broker_id": "b1"}
put /cluster/brokers/b1/default/b {"assigned_at": 0, "epoch": 1}
put /cluster/owners/default/b {"broker_id": "b1"}
put /cluster/brokers/b1/default/c {"assigned_at": 0, "epoch": 1}
put /cluster/owners/default/c {"broker_id": "b1"}
EXTRA
----

watch now=10
delete /cluster/register/b1
----
"""
# b1's last report: only /default/c has a client.
REPORT = {
    "broker_id": "b1",
    "timestamp": 1,
    "topics": [
        {"topic": "/default/a"},
        {"topic": "/default/b"},
        {"topic": "/default/c", "producers": 1, "msg_rate": 50.0},
    ],
}


def test_the_topics_with_clients_fail_over_in_the_first_round(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(rounds, "FAILOVER_TOPICS_PER_ROUND", 1)
    runner = Runner()
    script = SCRIPT.replace("EXTRA", f"put /cluster/load/b1 {json.dumps(REPORT)}")
    outputs = [runner.run(block) for block in parse(script)]
    first = "\n".join(outputs[-1])
    assert "write 1: failover of b1" in first
    # /default/c had a producer: it goes first, though "a" and "b" sort before it.
    assert "put /cluster/brokers/b2/default/c " in first
    assert "/default/a" not in first and "/default/b " not in first
    assert "2 more next round" in first


def test_a_topic_the_dead_broker_was_moving_is_placed_during_the_failovers_rounds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(rounds, "FAILOVER_TOPICS_PER_ROUND", 1)
    runner = Runner()
    marker = {"reason": "rebalance", "from_broker": "b1", "to_broker": "b2", "ready": False}
    moving = (
        'put /topics/default/m/meta {"created_at": 0}\n'
        f"put /cluster/unassigned/default/m {json.dumps(marker)}"
    )
    script = SCRIPT.replace("EXTRA", moving) + "\nrun now=10\n----\n"
    outputs = [runner.run(block) for block in parse(script)]
    writes = [line for out in outputs[-2:] for line in out if line.startswith("write ")]
    # b1 died while sealing "m" for a move to b2: released in the first round, placed in
    # the second, while the failover of "a", "b" and "c" still takes its third.
    assert [w.split(": ", 1)[1] for w in writes] == [
        "failover of b1",
        "release /default/m",
        "failover of b1",
        "assign /default/m",
        "failover of b1",
    ]
