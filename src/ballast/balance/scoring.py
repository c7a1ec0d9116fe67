"""Scoring formulas, written once as plain arithmetic.

Each function works unchanged on floats, NumPy arrays, pandas Series and Spark `Column`s:
only `+ - * /` and comparisons are used. Where a formula has to choose (WeightedLoad's
bottleneck, the CV guard, Balanced's fallback), the caller passes the engine's
`where`/`maximum` in an `Ops` value (NumPy by default, `ballast.model.PYTHON_OPS` for plain
floats, Spark's `F.when`/`F.greatest` in the pipeline). Guards such as division by zero
belong to callers, except where a rule defines the guarded value (CV is 0 for a zero mean).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ballast.model import PYTHON_OPS, Ops

__all__ = [
    "NUMPY_OPS",
    "PYTHON_OPS",
    "Ops",
    "balanced_score",
    "balanced_with_fallback",
    "cluster_stats",
    "coefficient_of_variation",
    "ewma",
    "fair_score",
    "normalise",
    "reports_resources",
    "topic_load_score",
    "weighted_load_score",
]

# Danube's weights (docs/design/implementation-notes.md, "Rankings").
TOPIC_COUNT_W, TOPIC_THROUGHPUT_W, TOPIC_CONNECTIONS_W, TOPIC_BACKLOG_W = 0.2, 0.3, 0.3, 0.2
BACKLOG_UNIT = 10_000
BALANCED_TOPIC_W, BALANCED_CPU_W, BALANCED_MEM_W = 0.3, 0.35, 0.35
BOTTLENECK_THRESHOLD = 0.7


def topic_load_score(count: Any, throughput_mbps: Any, connections: Any, backlog: Any) -> Any:
    """Weighted topic load. Linear, so a broker's value is the sum over its topics
    (each with count 1)."""
    return (
        TOPIC_COUNT_W * count
        + TOPIC_THROUGHPUT_W * throughput_mbps
        + TOPIC_CONNECTIONS_W * connections
        + TOPIC_BACKLOG_W * (backlog / BACKLOG_UNIT)
    )


def fair_score(topic_count: Any) -> Any:
    """Fair: the number of topics."""
    return topic_count * 1.0


def balanced_score(weighted_topic_load: Any, cpu_percent: Any, memory_percent: Any) -> Any:
    """Balanced: 30 % weighted topic load, 35 % CPU, 35 % memory."""
    return (
        BALANCED_TOPIC_W * weighted_topic_load
        + BALANCED_CPU_W * cpu_percent
        + BALANCED_MEM_W * memory_percent
    )


def reports_resources(max_cpu_percent: Any, max_memory_percent: Any) -> Any:
    """Whether any broker reports CPU or memory (given the cluster's maxima)."""
    return (max_cpu_percent > 0) | (max_memory_percent > 0)


def balanced_with_fallback(
    balanced: Any, fair: Any, resources_reported: Any, ops: Ops = PYTHON_OPS
) -> Any:
    """Balanced, or Danube's fallback to the topic count (Fair) while no broker reports
    CPU or memory (`reports_resources`)."""
    return ops.where(resources_reported, balanced, fair)


NUMPY_OPS = Ops(where=np.where, maximum=np.maximum)


def normalise(value: Any, cluster_max: Any, ops: Ops = NUMPY_OPS) -> Any:
    """A metric divided by the cluster maximum, the maximum starting at 1.0 (Danube)."""
    return value / ops.maximum(1.0, cluster_max)


def weighted_load_score(
    cpu: Any, mem: Any, disk: Any, net: Any, thr: Any, topic: Any, ops: Ops = NUMPY_OPS
) -> Any:
    """WeightedLoad on metrics already normalised to 0..1 by the cluster maximum.

    Above 0.7 the bottleneck (first of cpu, mem, disk, net, throughput, topic at the
    maximum) gets weight 0.5; below, a balanced mix. Result x100.
    """
    peak = ops.maximum(
        ops.maximum(ops.maximum(cpu, mem), ops.maximum(disk, net)), ops.maximum(thr, topic)
    )
    by_cpu = 0.5 * cpu + 0.2 * mem + 0.15 * thr + 0.15 * topic
    by_mem = 0.5 * mem + 0.2 * cpu + 0.15 * thr + 0.15 * topic
    by_thr = 0.5 * thr + 0.2 * net + 0.15 * cpu + 0.15 * mem
    by_net = 0.5 * net + 0.2 * thr + 0.15 * cpu + 0.15 * mem
    by_other = 0.5 * topic + 0.2 * cpu + 0.2 * mem + 0.1 * thr
    # disk as the bottleneck falls to the "other" weights, as in Danube.
    pressured = ops.where(
        cpu == peak,
        by_cpu,
        ops.where(
            mem == peak,
            by_mem,
            ops.where(
                disk == peak,
                by_other,
                ops.where(net == peak, by_net, ops.where(thr == peak, by_thr, by_other)),
            ),
        ),
    )
    relaxed = 0.25 * topic + 0.25 * cpu + 0.25 * mem + 0.15 * thr + 0.1 * net
    return 100.0 * ops.where(peak > BOTTLENECK_THRESHOLD, pressured, relaxed)


def coefficient_of_variation(std: Any, mean: Any, count: Any, ops: Ops = PYTHON_OPS) -> Any:
    """CV = std / mean of `count` scores; 0 with fewer than two scores or a mean that is
    not positive (nothing to balance)."""
    defined = (count >= 2) & (mean > 0)
    return ops.where(defined, std / ops.where(defined, mean, 1.0), 0.0)


def cluster_stats(values: Any) -> tuple[float, float, float]:
    """Mean, population standard deviation and coefficient of variation of a 1-D array."""
    arr = np.asarray(values, dtype=float)
    if arr.size == 0:
        return 0.0, 0.0, 0.0
    mean = float(arr.mean())
    std = float(arr.std())
    return mean, std, float(coefficient_of_variation(std, mean, arr.size))


def ewma(previous: Any, sample: Any, history_weight: float = 0.9) -> Any:
    """Pulsar's exponentially smoothed usage: `u = w*u_prev + (1-w)*sample`."""
    return history_weight * previous + (1 - history_weight) * sample
