"""Smoothing of resource readings: an exponentially weighted moving average.

As Pulsar does (`loadBalancerHistoryResourcePercentage`), each broker's resource usage is
``u = w * u_prev + (1 - w) * sample``, seeded with the first sample (no ramp from zero).
Traffic figures (topics, rates, connections, backlog) are taken as reported: they are
counted, not sampled, and moves must see them at once.
"""

from __future__ import annotations

from dataclasses import replace

from ballast.balance.scoring import ewma
from ballast.model import LoadReport


def smooth_report(previous: LoadReport | None, sample: LoadReport, weight: float) -> LoadReport:
    """`sample` with its CPU, memory, disk and network smoothed against `previous`."""
    if previous is None or weight <= 0:
        return sample
    return replace(
        sample,
        cpu_percent=float(ewma(previous.cpu_percent, sample.cpu_percent, weight)),
        memory_percent=float(ewma(previous.memory_percent, sample.memory_percent, weight)),
        disk_io_bps=float(ewma(previous.disk_io_bps, sample.disk_io_bps, weight)),
        network_io_bps=float(ewma(previous.network_io_bps, sample.network_io_bps, weight)),
    )
