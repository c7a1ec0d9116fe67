"""`heap.settle`: start-up garbage collected, the rest kept out of later collections."""

from __future__ import annotations

import gc
import weakref

from prometheus_client import CollectorRegistry

from ballast import heap


class _Node:
    def __init__(self) -> None:
        self.peer: _Node | None = None


def test_settle_collects_start_up_garbage_then_freezes_the_rest() -> None:
    before = gc.get_threshold()
    gc.disable()  # no collection but the one under test
    try:
        cycle = _Node()
        cycle.peer = cycle  # garbage only a collection frees
        gone = weakref.ref(cycle)
        del cycle
        kept = [_Node() for _ in range(100)]
        heap.settle()
        assert gone() is None  # collected, not frozen
        assert gc.get_freeze_count() >= len(kept)
        young = {id(o) for o in gc.get_objects()}
        assert not any(id(node) in young for node in kept)  # no collection scans them now
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
        gc.enable()


def test_after_settle_a_growing_heap_is_not_fully_collected_again_and_again() -> None:
    """A broker opening thousands of topics allocates millions of long-lived objects: with
    Python's default thresholds that meant a full collection (the whole heap scanned, the
    event loop stopped) every few hundred thousand of them."""
    before = gc.get_threshold()
    try:
        heap.settle()
        full = gc.get_stats()[2]["collections"]
        kept = [[i] for i in range(400_000)]  # long-lived, as a topic's state is
        assert gc.get_stats()[2]["collections"] == full
        assert len(kept) == 400_000
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_gc_pauses_are_exported_by_generation() -> None:
    registry = CollectorRegistry()
    pauses = heap.GcPauses(registry)
    try:
        gc.collect()
        assert registry.get_sample_value("ballast_gc_pause_seconds_count", {"generation": "2"})
    finally:
        pauses.close()
    assert pauses._callback not in gc.callbacks
    gc.collect()
    assert registry.get_sample_value("ballast_gc_pause_seconds_count", {"generation": "2"}) == 1
