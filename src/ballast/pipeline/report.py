"""report.html and its PNG charts, from the small tables the driver already holds.

Readable without Spark (or Python): a static page next to `charts/*.png`. matplotlib runs
on the Agg backend, so no display is needed.
"""

from __future__ import annotations

import html
import os
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

CHARTS = {
    "cv": "cv_over_time.png",
    "heatmap": "broker_load_heatmap.png",
    "topics": "top_topics.png",
}
STRATEGY_LABELS = {"fair": "Fair", "balanced": "Balanced", "weighted_load": "WeightedLoad"}


def chart_cv(comparison: pd.DataFrame, threshold: float, path: str) -> None:
    """CV of the active brokers' scores per window, one line per strategy."""
    fig, ax = plt.subplots(figsize=(10, 4))
    for strategy, label in STRATEGY_LABELS.items():
        rows = comparison[comparison["strategy"] == strategy].sort_values("window_start")
        ax.plot(rows["window_start"], rows["cv"], label=label, linewidth=1.2)
    ax.axhline(
        threshold, color="grey", linestyle="--", linewidth=1, label=f"threshold {threshold:.0%}"
    )
    ax.set_ylabel("CV (std / mean)")
    ax.set_title("Imbalance over time per strategy")
    ax.legend(loc="upper right")
    ax.grid(alpha=0.3)
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def chart_heatmap(brokers: pd.DataFrame, metric: str, path: str) -> None:
    """Brokers × windows, coloured by `metric` (blank where a broker did not report)."""
    grid = brokers.pivot_table(
        index="broker_id", columns="window_start", values=metric, aggfunc="mean"
    )
    grid = grid.reindex(sorted(grid.index, key=_natural_key))
    fig, ax = plt.subplots(figsize=(10, max(2.5, 0.35 * len(grid) + 1.5)))
    image = ax.imshow(
        np.ma.masked_invalid(grid.to_numpy(dtype=float)),
        aspect="auto",
        cmap="viridis",
        interpolation="nearest",
    )
    ax.set_yticks(range(len(grid)), list(grid.index))
    columns = list(grid.columns)
    ticks = (
        np.linspace(0, len(columns) - 1, num=min(8, len(columns))).astype(int).tolist()
        if columns
        else []
    )
    ax.set_xticks(
        list(ticks), [pd.Timestamp(columns[i]).strftime("%m-%d %H:%M") for i in ticks], rotation=30
    )
    ax.set_title(f"Per-broker load ({metric}) by window")
    fig.colorbar(image, ax=ax, label=metric)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def chart_top_topics(topics: pd.DataFrame, path: str) -> None:
    """The heaviest topics by mean throughput, with their p95."""
    fig, ax = plt.subplots(figsize=(10, max(2.5, 0.35 * len(topics) + 1.5)))
    rows = topics.iloc[::-1]
    ax.barh(rows["topic"], rows["mbps_mean"], color="#4878a8", label="mean")
    ax.scatter(
        rows["mbps_p95"], rows["topic"], color="#c44e52", marker="|", s=200, label="p95 of windows"
    )
    ax.set_xlabel("MB/s")
    ax.set_title("Top topics by throughput")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _natural_key(name: str) -> tuple[Any, ...]:
    """broker-2 before broker-10."""
    head, _, tail = name.rpartition("-")
    return (head, int(tail), "") if tail.isdigit() else (name, 0, name)


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_cell(v))}</td>" for v in row) + "</tr>" for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def write_report(
    out_dir: str,
    summary: Mapping[str, Any],
    comparison: pd.DataFrame,
    brokers: pd.DataFrame,
    top_topics: pd.DataFrame,
    plan: Mapping[str, Any],
    quarantine: Sequence[Mapping[str, Any]],
    threshold: float,
    heat_metric: str,
) -> str:
    """Write report.html and charts/*.png under `out_dir` (local); return the page path."""
    charts = os.path.join(out_dir, "charts")
    os.makedirs(charts, exist_ok=True)
    chart_cv(comparison, threshold, os.path.join(charts, CHARTS["cv"]))
    chart_heatmap(brokers, heat_metric, os.path.join(charts, CHARTS["heatmap"]))
    chart_top_topics(top_topics, os.path.join(charts, CHARTS["topics"]))

    per_strategy = []
    for strategy, label in STRATEGY_LABELS.items():
        rows = comparison[comparison["strategy"] == strategy].sort_values("window_start")
        if rows.empty:
            continue
        per_strategy.append(
            [
                label,
                float(rows["cv"].mean()),
                float(rows["cv"].max()),
                float(rows["cv"].iloc[-1]),
                int(rows["above_threshold"].sum()),
                len(rows),
            ]
        )
    moves = [
        [m["topic"], m["from_broker"], m["to_broker"], m["estimated_load"], m["reason"]]
        for m in plan["plan"]["moves"]
    ]
    before, after = plan["plan"]["before"], plan["plan"]["after"]
    sections = [
        "<h1>Ballast load-history analysis</h1>",
        _table(["", ""], [[k, v] for k, v in summary.items()]),
        "<h2>Imbalance per strategy</h2>",
        f'<img src="charts/{CHARTS["cv"]}" alt="CV over time per strategy">',
        _table(
            ["strategy", "mean CV", "max CV", "last CV", "windows above threshold", "windows"],
            per_strategy,
        ),
        f"<h2>Per-broker load ({html.escape(heat_metric)})</h2>",
        f'<img src="charts/{CHARTS["heatmap"]}" alt="per-broker load heat map">',
        "<h2>Top topics</h2>",
        f'<img src="charts/{CHARTS["topics"]}" alt="top topics">',
        _table(
            ["topic", "mean MB/s", "p95 MB/s", "backlog change"],
            top_topics[["topic", "mbps_mean", "mbps_p95", "backlog_change"]].itertuples(
                index=False, name=None
            ),
        ),
        f"<h2>Rebalance plan ({html.escape(str(plan['plan']['strategy']))})</h2>",
        f"<p>CV {before['cv']:.1%} → {after['cv']:.1%}; {len(moves)} move(s). "
        f"{html.escape(str(plan['plan']['reason']))}</p>",
        _table(["topic", "from", "to", "estimated load", "reason"], moves),
        "<p>The full plan, with the snapshot it was computed from, is in plan.json.</p>",
        "<h2>Quarantine</h2>",
        _table(
            ["kind", "records", "example reason"],
            [[q["kind"], q["records"], q["example"]] for q in quarantine],
        )
        if quarantine
        else "<p>Every record was valid.</p>",
    ]
    style = (
        "body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}"
        "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;"
        "text-align:left;font-size:14px}img{max-width:100%}"
    )
    page = (
        '<!doctype html><html><head><meta charset="utf-8"><title>Ballast analysis</title>'
        f"<style>{style}</style></head><body>{''.join(sections)}</body></html>"
    )
    path = os.path.join(out_dir, "report.html")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(page)
    return path
