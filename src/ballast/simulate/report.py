"""Presenting a simulation: a rich table, CSV rows and a PNG chart."""

from __future__ import annotations

import csv
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ballast.simulate.engine import SimResult


def _brokers(result: SimResult) -> list[str]:
    return sorted({b for s in result.samples for b in s.topics})


def timeline_table(result: SimResult) -> Table:
    """CV, moves and per-broker topics/score over time."""
    brokers = _brokers(result)
    table = Table(title=f"Simulation: {result.scenario.name}", show_lines=False)
    table.add_column("time", justify="right")
    table.add_column("CV", justify="right")
    table.add_column("moves", justify="right")
    for b in brokers:
        table.add_column(f"{b}\ntopics/score", justify="right")
    table.add_column("last decision")
    for s in result.samples:
        cells = [
            f"{s.topics[b]}/{s.scores[b]:.1f}"
            if b in s.scores
            else (f"{s.topics[b]}/-" if b in s.topics else "-")
            for b in brokers
        ]
        table.add_row(f"{s.t / 3600:.1f}h", f"{s.cv:.1%}", str(s.moves), *cells, s.rule)
    return table


def summary_table(result: SimResult) -> Table:
    table = Table(title="Summary", show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("CV start → end", f"{result.initial_cv:.1%} → {result.final_cv:.1%}")
    table.add_row("rebalancing moves", str(len(result.moves)))
    table.add_row("failover reassignments", str(len(result.failovers)))
    table.add_row("drain reassignments", str(len(result.drains)))
    table.add_row("decisions", ", ".join(f"{k}: {v}" for k, v in sorted(result.rules.items())))
    table.add_row(
        "topics per broker (end)", ", ".join(f"{b}={n}" for b, n in result.final_topics.items())
    )
    return table


def print_result(result: SimResult, console: Console) -> None:
    console.print(timeline_table(result))
    console.print(summary_table(result))


def write_csv(result: SimResult, path: Path) -> None:
    """One row per sample: time, CV, moves, then topics and score per broker."""
    brokers = _brokers(result)
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(
            ["t_seconds", "cv", "moves", "decision"]
            + [f"{b}_topics" for b in brokers]
            + [f"{b}_score" for b in brokers]
        )
        for s in result.samples:
            w.writerow(
                [f"{s.t:.0f}", f"{s.cv:.6f}", s.moves, s.rule]
                + [s.topics.get(b, "") for b in brokers]
                + [f"{s.scores[b]:.4f}" if b in s.scores else "" for b in brokers]
            )


def write_png(result: SimResult, path: Path) -> None:
    """CV and moves over time (top), per-broker score over time (bottom)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hours = [s.t / 3600 for s in result.samples]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    ax1.plot(hours, [s.cv * 100 for s in result.samples], label="CV %", color="tab:red")
    ax1.set_ylabel("CV (%)")
    twin = ax1.twinx()
    twin.step(
        hours, [s.moves for s in result.samples], where="post", label="moves", color="tab:gray"
    )
    twin.set_ylabel("moves (cumulative)")
    ax1.set_title(f"Simulation: {result.scenario.name}")
    for b in _brokers(result):
        ax2.plot(hours, [s.scores.get(b, float("nan")) for s in result.samples], label=b)
    ax2.set_xlabel("virtual time (hours)")
    ax2.set_ylabel("score")
    ax2.legend(loc="upper right", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
