"""A data-driven runner for the leader state machine, in the style of etcd-io/raft's
``testdata/*.txt``: each block is a command, its input lines, ``----`` and the expected
effects. ``REWRITE=1 pytest tests/leader`` rewrites the expected outputs in place.

The store is a `StoreCore` (the simulator's, etcd's revisions: an empty store is at
revision 1) and ``run`` performs writes with `leader.perform.drive`, as the simulator does.

Commands (times are seconds of a fake clock, ``now=``):

- ``config strategy=fair enabled=true ...``: a fresh configuration (rebalancing keys;
  ``placement_unit=bundle``; ``pulsar.KEY=VALUE`` for `load_manager.pulsar`);
- ``bootstrap now=T [leader=b1 term=N]``: input ``put KEY JSON`` lines are stored, then a
  new machine is bootstrapped from the store's listings (also a leader change: the
  persisted state, move history included, is reloaded);
- ``behind``: the input changes happen in the store only (the watch lags behind);
- ``watch now=T``: input ``put KEY JSON`` / ``delete KEY`` / ``error KEY`` lines happen
  in the store (``txn`` groups the following lines into one revision until ``end``) and
  are fed to the machine; ``tick now=T``: time passes;
- ``run now=T``: the pending writes are performed on the store (compares evaluated) and
  every outcome fed back, until the machine asks for nothing more;
- ``fail now=T``: the pending writes fail (as if someone changed their keys first), with
  their keys read again from the store;
- ``store [prefix=P]``: print the store's keys; ``owners``: print each broker's topics.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ballast.config import BallastConfig, parse_config
from ballast.leader import (
    Bootstrap,
    LeaderMachine,
    Ready,
    Tick,
    Watched,
    Write,
    WriteDone,
    effects_text,
)
from ballast.leader.perform import drive, refreshed
from ballast.metadata import Delete, Put, WatchEvent, keys
from ballast.metadata.core import StoreCore, watch_log


@dataclass
class Block:
    command: str
    args: dict[str, str]
    input: list[str]
    expected: list[str]
    line: int


def parse(text: str) -> list[Block]:
    blocks: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.strip() or line.startswith("#"):
            i += 1
            continue
        start = i
        head = line.split()
        command, args = head[0], dict(a.split("=", 1) for a in head[1:])
        i += 1
        body: list[str] = []
        while i < len(lines) and lines[i] != "----":
            body.append(lines[i])
            i += 1
        i += 1  # ----
        expected: list[str] = []
        while i < len(lines) and lines[i].strip():
            expected.append(lines[i])
            i += 1
        blocks.append(Block(command, args, body, expected, start + 1))
    return blocks


def render(blocks: list[Block], outputs: list[list[str]], header: str) -> str:
    parts = [header.rstrip("\n")] if header.strip() else []
    for block, output in zip(blocks, outputs, strict=True):
        head = " ".join([block.command, *(f"{k}={v}" for k, v in block.args.items())])
        parts.append("\n".join([head, *block.input, "----", *(output or ["ok"])]))
    return "\n\n".join(parts) + "\n"


@dataclass
class Runner:
    config: BallastConfig = field(default_factory=lambda: parse_config({}))
    store: StoreCore = field(default_factory=lambda: StoreCore(lambda: 0.0))
    machine: LeaderMachine | None = None
    pending: list[Write] = field(default_factory=list)

    def run(self, block: Block) -> list[str]:
        now = float(block.args.get("now", 0))
        handler = getattr(self, "cmd_" + block.command.replace("-", "_"))
        result: list[str] = handler(block, now)
        return result

    def _effects(self, readies: list[Ready]) -> list[str]:
        out: list[str] = []
        for ready in readies:
            out += effects_text(ready)
        return out

    def _step(self, event: Any) -> list[str]:
        assert self.machine is not None, "bootstrap first"
        ready = self.machine.step(event)
        self.pending += ready.writes
        return effects_text(ready)

    def cmd_config(self, block: Block, now: float) -> list[str]:
        rebalancing: dict[str, Any] = {}
        lm: dict[str, Any] = {"rebalancing": rebalancing}
        for key, value in block.args.items():
            parsed = yaml.safe_load(value)
            if key in ("strategy", "assignment_strategy"):
                lm["assignment_strategy"] = parsed
            elif key in ("load_report_interval_seconds", "placement_unit"):
                lm[key] = parsed
            elif key.startswith("pulsar."):
                lm.setdefault("pulsar", {})[key.removeprefix("pulsar.")] = parsed
            else:
                rebalancing[key] = parsed
        self.config = parse_config({"load_manager": lm})
        return []

    def __post_init__(self) -> None:
        self.events = watch_log(self.store)

    def _changes(self, lines: list[str]) -> list[WatchEvent]:
        before = len(self.events)
        grouped: list[Put | Delete] | None = None
        errors: list[WatchEvent] = []
        for line in lines:
            verb, _, rest = line.strip().partition(" ")
            key, _, raw = rest.partition(" ")
            if verb == "txn":
                grouped = []
                continue
            if verb == "end":
                assert grouped is not None
                self.store.txn([], grouped)
                grouped = None
                continue
            if verb == "error":
                # An undecodable value: the store holds it, the watch reports an error.
                revision = self.store.put_raw(key, b"<not JSON>")
                self.events.pop()
                errors.append(WatchEvent("error", key, None, revision, f"{key}: not JSON"))
                continue
            value = json.loads(raw) if raw else None
            if verb == "put":
                op: Put | Delete = Put(key, value)
            elif verb == "delete":
                op = Delete(key)
            else:
                raise ValueError(f"unknown change {line!r}")
            if grouped is not None:
                grouped.append(op)
            elif isinstance(op, Put):
                self.store.put(key, value)
            else:
                self.store.delete(key)
        return [*self.events[before:], *errors]

    def cmd_bootstrap(self, block: Block, now: float) -> list[str]:
        self._changes(block.input)
        self.pending = []
        leader = block.args.get("leader", "b1")
        self.machine = LeaderMachine(leader, int(block.args.get("term", 1)), self.config)
        cluster = self.store.get_prefix(keys.CLUSTER_PREFIX)
        topics = self.store.get_prefix(keys.TOPICS_PREFIX)
        return self._step(Bootstrap(cluster, topics, now))

    def cmd_watch(self, block: Block, now: float) -> list[str]:
        events = self._changes(block.input)
        return self._step(Watched(tuple(events), now))

    def cmd_behind(self, block: Block, now: float) -> list[str]:
        """Changes that happen in the store but have not reached the machine (watch lag)."""
        self._changes(block.input)
        return []

    def cmd_tick(self, block: Block, now: float) -> list[str]:
        return self._step(Tick(now))

    def cmd_run(self, block: Block, now: float) -> list[str]:
        assert self.machine is not None
        pending, self.pending = self.pending, []
        out: list[str] = []
        first = Ready(writes=tuple(pending))
        readies = drive(self.machine, self.store, first, now)
        for ready in readies[1:]:
            out += effects_text(ready)
        return out

    def cmd_fail(self, block: Block, now: float) -> list[str]:
        pending, self.pending = self.pending, []
        out: list[str] = []
        for write in pending:
            fresh = tuple(refreshed(k, self.store.get(k)) for k in write.touched_keys())
            out += self._step(WriteDone(write.id, False, 0, now, fresh))
        return out

    def cmd_store(self, block: Block, now: float) -> list[str]:
        prefix = block.args.get("prefix", "/")
        return [
            f"{kv.key} {json.dumps(_stable(kv.value), sort_keys=True)}"
            for kv in self.store.get_prefix(prefix).items
        ]

    def cmd_owners(self, block: Block, now: float) -> list[str]:
        assert self.machine is not None
        view = self.machine.view
        out = [f"{b}: {' '.join(sorted(view.topics_of(b)))}" for b in sorted(view.by_broker)]
        out += [
            f"marker {t}: {p.marker.reason.value} from={p.marker.from_broker} "
            f"to={p.marker.to_broker} ready={p.marker.ready}"
            for t, p in sorted(view.markers.items())
        ]
        return out


def _stable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _stable(v) for k, v in value.items() if k not in ("timestamp", "assigned_at")}
    return value


def run_file(path: Path) -> tuple[str, str]:
    """(expected text, actual text) of one scenario file."""
    text = path.read_text()
    blocks = parse(text)
    first = blocks[0].line - 1 if blocks else 0
    header = "\n".join(line for line in text.splitlines()[:first] if line.startswith("#"))
    runner = Runner()
    outputs = [runner.run(block) for block in blocks]
    actual = render(blocks, outputs, header)
    if os.environ.get("REWRITE"):
        path.write_text(actual)
        return actual, actual
    return text, actual
