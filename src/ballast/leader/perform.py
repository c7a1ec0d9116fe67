"""Performing a `Ready`: the loop every shell runs around the machine, written once.

A `Ready`'s writes are performed in batches (at most `in_flight` at once), their outcomes
fed back to the machine in the order the writes were asked for, and every `Ready` those
outcomes produce is performed in turn, until the machine asks for nothing more.
`ReadyQueue` is that loop without the I/O: the live leader (`cluster.load_manager`)
performs each batch on etcd, concurrently and fenced on its term; `drive` performs it
synchronously on a `StoreCore` (the simulator, the scripted tests).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence

from ballast.leader.effects import Event, Ready, Refreshed, Write, WriteDone
from ballast.leader.machine import LeaderMachine
from ballast.metadata import keys
from ballast.metadata.core import StoreCore
from ballast.metadata.store import Compare, KeyValue, Put, ValueDecodeError

# Writes of one `Ready` performed at once (they touch disjoint keys).
WRITES_IN_FLIGHT = 16


class ReadyQueue:
    """The `Ready`s one step leads to, in order. Iterate it; for each `Ready`, perform its
    `batches` and `feed` each batch's outcomes back (in the batch's order) before the next;
    then perform the `Ready`'s other effects (rankings, history, metrics, logs)."""

    def __init__(
        self, machine: LeaderMachine, ready: Ready, in_flight: int = WRITES_IN_FLIGHT
    ) -> None:
        self.machine = machine
        self.in_flight = in_flight
        self._queue: deque[Ready] = deque([ready])

    def __iter__(self) -> Iterator[Ready]:
        while self._queue:
            yield self._queue.popleft()

    def batches(self, ready: Ready) -> Iterator[tuple[Write, ...]]:
        """`ready`'s writes, `in_flight` at a time."""
        for start in range(0, len(ready.writes), self.in_flight):
            yield ready.writes[start : start + self.in_flight]

    def feed(self, outcomes: Iterable[WriteDone]) -> None:
        """Step the machine with each outcome; the `Ready`s it returns are performed next."""
        for outcome in outcomes:
            self._queue.append(self.machine.step(outcome))


def refreshed(key: str, kv: KeyValue | None) -> Refreshed:
    """`key` as read again after a failed write (`kv` None: absent)."""
    if kv is None:
        return Refreshed(key, present=False)
    return Refreshed(key, kv.value, kv.mod_revision)


def drive(
    machine: LeaderMachine,
    store: StoreCore,
    ready: Ready,
    now: float,
    *,
    fence: Sequence[Compare] = (),
    on_ready: Callable[[Ready], None] | None = None,
    inputs: list[Event] | None = None,
) -> list[Ready]:
    """Perform `ready` on `store` (each write, and the rankings, fenced by `fence`) and
    every `Ready` its outcomes produce; return them all, the first one included, in order.
    Each outcome fed to the machine is appended to `inputs` (a record for replays). The
    other effects (history, metrics, logs) are the caller's, read from the `Ready`s."""
    done: list[Ready] = []
    queue = ReadyQueue(machine, ready)
    for current in queue:
        done.append(current)
        if on_ready is not None:
            on_ready(current)
        for batch in queue.batches(current):
            outcomes = [_write(store, write, fence, now) for write in batch]
            if inputs is not None:
                inputs += outcomes
            queue.feed(outcomes)
        if current.rankings is not None:
            store.txn(fence, [Put(keys.LOAD_BALANCE, current.rankings.payload)])
    return done


def _write(store: StoreCore, write: Write, fence: Sequence[Compare], now: float) -> WriteDone:
    result = store.txn([*fence, *write.compares], write.ops)
    if result.succeeded:
        return WriteDone(write.id, True, result.revision, now)
    fresh: list[Refreshed] = []
    for key in write.touched_keys():
        try:
            fresh.append(refreshed(key, store.get(key)))
        except ValueDecodeError:
            fresh.append(Refreshed(key, undecodable=True))
    return WriteDone(write.id, False, 0, now, tuple(fresh))
