"""A long-running service and Python's cycle collector.

A full (generation 2) collection scans every tracked object: in a broker or a gateway
that is mostly what start-up made (modules, gRPC and protobuf machinery, configuration),
and it stalls the event loop for 40–100 ms on a busy machine (measured during topic moves,
where it made the longest client pauses). Frozen objects are never scanned again.

A broker that then opens thousands of topics grows its heap by millions of objects, all of
them long-lived. With Python's default thresholds (700, 10, 10) a broker opening 10 000
topics made 30 full collections in three minutes, 17.8 s of them in all and the longest
1.26 s of a stopped event loop (a drain's receiver: 23, 8.6 s, longest 0.99 s; measured
with a gc callback). `THRESHOLDS` collect the young generation every 10 000 allocations
(a few ms each) and allow a full collection only after 100 of the middle one.
`GcPauses` exports every collection's pause (``ballast_gc_pause_seconds``).
"""

from __future__ import annotations

import gc
import time
from typing import Any

from prometheus_client import CollectorRegistry, Histogram

__all__ = ["THRESHOLDS", "GcPauses", "settle"]

THRESHOLDS = (10_000, 10, 100)


def settle() -> None:
    """Collect what start-up left over, then freeze the rest: later full collections scan
    only what the service made since it started; and space collections by `THRESHOLDS`."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)


class GcPauses:
    """Every collection's pause, by generation, into ``ballast_gc_pause_seconds`` (a gc
    callback, from whichever thread allocated; removed by `close`)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.pauses = Histogram(
            "ballast_gc_pause_seconds",
            "Pauses of Python's cycle collector (every thread stops), by generation",
            ["generation"],
            registry=registry,
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
        )
        self._started = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            pause = time.perf_counter() - self._started
            self.pauses.labels(str(info["generation"])).observe(pause)

    def close(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)
