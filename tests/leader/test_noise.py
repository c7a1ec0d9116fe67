"""Noise does not move topics: the operator's scenario on a fake clock.

Three idle brokers on one machine report noisy resource readings every second (process CPU
and memory jitter, as psutil shows them); 30 idle topics were created one after another;
rebalancing is aggressive, min topic age 0, cooldown 1 s, a check every second. Ten
virtual minutes make zero moves. With the noise rules switched off (no smoothing, no floor,
no return window) the same readings do move topics back and forth, so the scenario does
exercise them.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

from ballast.config import parse_config
from ballast.leader import Bootstrap, LeaderMachine, Ready, Tick, Watched
from ballast.leader.perform import drive
from ballast.metadata import Put, keys
from ballast.metadata.core import StoreCore, watch_log
from ballast.metadata.records import Registration, TopicMeta
from ballast.model import LoadReport, Move, TopicLoad, UnassignedMarker

BROKERS = ("b1", "b2", "b3")
RULES_OFF = {"smoothing_weight": 0, "min_imbalance": 0, "return_window_seconds": 0}


def run(minutes: int, seed: int, **rebalancing: Any) -> list[tuple[str, str, str]]:
    config = parse_config(
        {
            "load_manager": {
                "load_report_interval_seconds": 1,
                "rebalancing": {
                    "enabled": True,
                    "aggressiveness": "aggressive",
                    "check_interval_seconds": 1,
                    "cooldown_seconds": 1,
                    "min_topic_age_seconds": 0,
                    **rebalancing,
                },
            }
        }
    )
    rng = random.Random(seed)
    store = StoreCore(lambda: now)
    changes = watch_log(store)
    now = 1_700_000_000.0
    for b in BROKERS:
        store.put(keys.register(b), Registration(f"{b}:6650").to_dict())
    machine = LeaderMachine("b1", 1, config)
    moved: list[Move] = []  # the moves whose write succeeded, as the machine's Readys tell

    def keep(ready: Ready) -> None:
        moved.extend(ready.moved)

    machine_seen = len(changes)
    ready = machine.step(
        Bootstrap(store.get_prefix(keys.CLUSTER_PREFIX), store.get_prefix(keys.TOPICS_PREFIX), now)
    )
    drive(machine, store, ready, now, on_ready=keep)
    serving: dict[str, set[str]] = {b: set() for b in BROKERS}
    reacted = len(changes)

    def settle() -> None:
        nonlocal machine_seen, reacted
        while True:
            # The brokers: serve what is assigned, seal what is taken away.
            while reacted < len(changes):
                event = changes[reacted]
                reacted += 1
                if event.key.startswith(keys.BROKERS_PREFIX) and not keys.is_broker_state_key(
                    event.key
                ):
                    broker, topic = keys.parse_assignment_key(event.key)
                    if event.kind == "put":
                        serving[broker].add(str(topic))
                    else:
                        serving[broker].discard(str(topic))
                        kv = store.get(keys.unassigned(topic))
                        if kv is not None:
                            marker = UnassignedMarker.from_dict(kv.value)
                            store.put(keys.unassigned(topic), replace(marker, ready=True).to_dict())
            if machine_seen == len(changes):
                return
            events = tuple(changes[machine_seen:])
            machine_seen = len(changes)
            drive(machine, store, machine.step(Watched(events, now)), now, on_ready=keep)

    for i in range(30):  # created one after another
        name = f"/default/t{i + 1}"
        meta = Put(keys.topic_meta(name), TopicMeta(now).to_dict())
        marker = Put(keys.unassigned(name), UnassignedMarker(timestamp=now).to_dict())
        store.txn([], [meta, marker])
        settle()
    for _ in range(minutes * 60):
        now += 1.0
        for b in BROKERS:
            # An idle Python broker: ~0.2-2 % of a core, ~0.4-0.9 % of memory, jittering.
            cpu = max(0.0, rng.gauss(0.8, 0.6))
            mem = 0.6 + rng.uniform(-0.2, 0.3)
            topics = tuple(TopicLoad(t) for t in sorted(serving[b]))
            report = LoadReport(b, now, cpu, mem, topics=topics)
            store.put(keys.load(b), report.to_dict())
        settle()
        drive(machine, store, machine.step(Tick(now)), now, on_ready=keep)
        settle()
    return [(m.topic, m.from_broker, m.to_broker) for m in moved]


def test_ten_minutes_of_noise_make_no_move() -> None:
    assert run(10, seed=1) == []


def test_without_the_noise_rules_the_same_readings_move_topics() -> None:
    moves = run(2, seed=1, **RULES_OFF)
    assert moves, "the scenario must be noisy enough to matter"
