"""`heap.settle`: start-up garbage collected, the rest kept out of later collections."""

from __future__ import annotations

import gc
import weakref

from ballast import heap


class _Node:
    def __init__(self) -> None:
        self.peer: _Node | None = None


def test_settle_collects_start_up_garbage_then_freezes_the_rest() -> None:
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
        gc.enable()
