"""`ballast plan kafka`: a minimal-movement Kafka reassignment (KAFKA-19048).

Reads the current assignment and the brokers, writes a reassignment file that
`kafka-reassign-partitions --execute` takes as it is (and optionally the rollback), and
prints what the plan does against the lower bound and a `--generate`-style round robin.
Spark is imported only for `--engine spark`.
"""

from __future__ import annotations

import enum
import json
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from ballast.balance.kafka.reassignment import (
    dumps,
    parse_assignment,
    parse_broker_ids,
    parse_brokers,
    reassignment_document,
    rollback_document,
)
from ballast.balance.kafka.replicas import (
    ReplicaInputError,
    ReplicaPlan,
    check_feasible,
    group_topics,
    make_layout,
    plan_replicas,
)

NOTHING_TO_MOVE = 3  # exit status: the plan changes nothing, no file written


class Engine(enum.StrEnum):
    local = "local"
    spark = "spark"


def _read(path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ReplicaInputError(f"{what} {path}: cannot read it: {exc.strerror or exc}") from None


def _write(path: Path, text: str, what: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise ReplicaInputError(f"{what} {path}: cannot write it: {exc.strerror or exc}") from None


def _percent(part: int, whole: int) -> str:
    return f"{part / whole:.1%}" if whole else "-"


def print_plan(plan: ReplicaPlan, console: Console, written: dict[str, str], brokers: int) -> None:
    """The summary table, then the brokers whose counts change (at most `brokers` rows)."""
    table = Table(title="ballast plan kafka", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    table.add_row(
        "cluster",
        f"{plan.topics} topics, {plan.partitions} partitions, {plan.replicas} replicas, "
        f"{sum(b.state != 'removed' for b in plan.brokers)} brokers after the change "
        f"({'rack-aware' if plan.rack_aware else 'not rack-aware'})",
    )
    table.add_row(
        "replica moves",
        f"{plan.replica_moves} ({_percent(plan.replica_moves, plan.replicas)} of replicas) "
        f"in {len(plan.changes)} partitions",
    )
    verdict = "[green]= lower bound[/green]" if plan.at_lower_bound else "[yellow]≠[/yellow]"
    table.add_row(
        "lower bound",
        f"{plan.lower_bound} {verdict} (Σ per topic and broker of max(0, current − target); "
        f"cluster totals alone: {plan.cluster_lower_bound})",
    )
    table.add_row(
        "round robin",
        f"{plan.round_robin_moves} moves for a --generate-style assignment"
        + (
            f" ({plan.round_robin_moves / plan.replica_moves:.1f}× as many)"
            if plan.replica_moves
            else ""
        ),
    )
    table.add_row("leader changes", str(plan.leader_changes))
    table.add_row(
        "rack violations", f"{plan.rack_violations_before} → {plan.rack_violations_after}"
    )
    kept = [b for b in plan.brokers if b.state != "removed"]
    if kept:
        table.add_row(
            "replicas/broker",
            f"{min(b.replicas_before for b in kept)}–{max(b.replicas_before for b in kept)} → "
            f"{min(b.replicas_after for b in kept)}–{max(b.replicas_after for b in kept)}",
        )
        table.add_row(
            "leaders/broker",
            f"{min(b.leaders_before for b in kept)}–{max(b.leaders_before for b in kept)} → "
            f"{min(b.leaders_after for b in kept)}–{max(b.leaders_after for b in kept)}",
        )
    for name, path in written.items():
        table.add_row(name, path)
    console.print(table)
    changed = [
        b
        for b in plan.brokers
        if b.replicas_before != b.replicas_after or b.leaders_before != b.leaders_after
    ]
    if changed and brokers > 0:
        per_broker = Table(title="brokers that change", title_justify="left")
        for column in ("broker", "rack", "state", "replicas", "target", "leaders", "target"):
            per_broker.add_column(
                column, justify="left" if column in ("rack", "state") else "right"
            )
        for b in changed[:brokers]:
            per_broker.add_row(
                str(b.id),
                b.rack or "-",
                b.state,
                f"{b.replicas_before} → {b.replicas_after}",
                str(b.replica_target),
                f"{b.leaders_before} → {b.leaders_after}",
                str(b.leader_target),
            )
        console.print(per_broker)
        if len(changed) > brokers:
            console.print(f"… and {len(changed) - brokers} more brokers (all of them: --json)")
    for note in plan.notes[:10]:
        console.print(f"[yellow]note:[/yellow] {note}", markup=True, highlight=False)
    if len(plan.notes) > 10:
        console.print(f"[yellow]note:[/yellow] … and {len(plan.notes) - 10} more (--json)")


def register(app: typer.Typer) -> None:
    """Add `plan kafka` to `app`."""
    plan_app = typer.Typer(
        help="Offline plans for other systems' clusters (Kafka replica reassignment).",
        no_args_is_help=True,
    )
    app.add_typer(plan_app, name="plan")

    @plan_app.command("kafka")
    def kafka_cmd(
        current: Annotated[
            Path,
            typer.Option(
                help="Current assignment, kafka-reassign-partitions format "
                '({"version":1,"partitions":[{"topic","partition","replicas"}…]}).'
            ),
        ],
        brokers: Annotated[
            Path,
            typer.Option(
                help='Brokers file: {"brokers":[{"id":1,"rack":"r1"},…]} (rack optional).'
            ),
        ],
        out: Annotated[Path, typer.Option(help="Where to write the reassignment for --execute.")],
        add: Annotated[
            str | None,
            typer.Option(
                help="Brokers joining, e.g. 7,8 (racks from the brokers file; one missing "
                "there joins without a rack). Each id once."
            ),
        ] = None,
        remove: Annotated[
            str | None,
            typer.Option(help="Brokers leaving, e.g. 3: all their replicas move. Each id once."),
        ] = None,
        rack_aware: Annotated[
            bool,
            typer.Option(
                "--rack-aware/--no-rack-aware",
                help="Keep replicas of a partition in different racks (a hard constraint).",
            ),
        ] = True,
        strict_racks: Annotated[
            bool,
            typer.Option(help="Refuse an RF larger than the number of racks (rack-aware)."),
        ] = False,
        rollback: Annotated[
            Path | None,
            typer.Option(help="Also write the current assignment of the partitions that change."),
        ] = None,
        engine: Annotated[
            Engine, typer.Option(help="local: this process; spark: topics planned in parallel.")
        ] = Engine.local,
        master: Annotated[
            str,
            typer.Option(help="Spark master for --engine spark: local[*], spark://host:port, …"),
        ] = "local[*]",
        driver_memory: Annotated[str, typer.Option(help="Spark driver memory.")] = "2g",
        seed: Annotated[
            int, typer.Option(help="Seed of the round robin the plan is compared with.")
        ] = 0,
        show_brokers: Annotated[
            int, typer.Option(help="Brokers listed in the table (those whose counts change).")
        ] = 20,
        as_json: Annotated[
            bool, typer.Option("--json", help="Print the summary as JSON instead of tables.")
        ] = False,
    ) -> None:
        """Plan a Kafka reassignment that moves the fewest replicas (KAFKA-19048).

        Targets: every broker within one replica of its fair share of each topic and of the
        cluster (racks weighted by their brokers), then the fewest moves: only replicas
        above a broker's target move, only to brokers below theirs that keep rack
        anti-affinity. Then leaders are balanced with the fewest leader changes and the
        followers of changed partitions are ordered so that a broker's failure spreads its
        leaderships. The --out file holds only the partitions that change; feed it to
        `kafka-reassign-partitions --execute --reassignment-json-file FILE`.

        Exit status: 0 the plan is written; 2 bad input (malformed files, unknown or
        duplicate broker ids, an RF that cannot be placed); 1 a file cannot be written;
        3 nothing to move: the current assignment already meets every target, and no file
        is written (Kafka's --execute rejects an empty reassignment).
        """
        err = Console(stderr=True)
        started = time.perf_counter()
        try:
            broker_list = parse_brokers(_read(brokers, "--brokers"), str(brokers))
            assignments = parse_assignment(_read(current, "--current"), str(current))
            added = parse_broker_ids(add, "--add")
            removed = parse_broker_ids(remove, "--remove")
            max_rf = max((len(a.replicas) for a in assignments), default=1)
            layout = make_layout(broker_list, added, removed, rack_aware, max_rf)
            topics = group_topics(assignments, layout)
            check_feasible(topics, layout, strict_racks)
        except ReplicaInputError as exc:
            err.print(f"[red]error:[/red] {exc}", highlight=False)
            raise typer.Exit(2) from None
        if rack_aware and all(b.rack is None for b in broker_list):
            err.print("[yellow]note:[/yellow] no broker has a rack: nothing for rack-awareness")
        if engine is Engine.spark:
            from ballast.cli.spark import spark_session
            from ballast.pipeline.replicas import plan_replicas_spark

            with (
                spark_session(
                    err, master, app_name="ballast-plan-kafka", driver_memory=driver_memory
                ) as spark,
                err.status(f"planning {len(topics)} topics on Spark"),
            ):
                plan = plan_replicas_spark(spark, topics, layout, seed)
        else:
            with err.status(f"planning {len(topics)} topics"):
                plan = plan_replicas(topics, layout, seed)
        log_dirs = {(a.topic, a.partition): a.log_dirs for a in assignments if a.log_dirs}
        if not plan.changes:
            # `kafka-reassign-partitions --execute` rejects an empty partition list: write
            # nothing, say so, and exit with a status of its own.
            seconds = time.perf_counter() - started
            if as_json:
                summary = plan.to_dict() | {
                    "engine": engine.value,
                    "seconds": round(seconds, 3),
                    "written": {},
                    "nothing_to_move": True,
                }
                typer.echo(json.dumps(summary, indent=2))
            else:
                print_plan(plan, Console(), {}, show_brokers)
            err.print(
                f"nothing to move: the assignment already meets every target; {out} not "
                f"written{' (nor the rollback)' if rollback is not None else ''}",
                highlight=False,
            )
            raise typer.Exit(NOTHING_TO_MOVE)
        written = {"reassignment": str(out)}
        try:
            _write(out, dumps(reassignment_document(plan.changes, log_dirs)), "--out")
            if rollback is not None:
                _write(rollback, dumps(rollback_document(plan.changes, log_dirs)), "--rollback")
                written["rollback"] = str(rollback)
        except ReplicaInputError as exc:
            err.print(f"[red]error:[/red] {exc}", highlight=False)
            raise typer.Exit(1) from None
        seconds = time.perf_counter() - started
        if as_json:
            summary = plan.to_dict() | {
                "engine": engine.value,
                "seconds": round(seconds, 3),
                "written": written,
            }
            typer.echo(json.dumps(summary, indent=2))
        else:
            print_plan(plan, Console(), written, show_brokers)
            err.print(f"planned in {seconds:.2f}s ({engine.value})")


def main() -> None:
    """`python -m ballast.cli.plan …`: this command without the rest of the CLI."""
    app = typer.Typer(name="ballast", no_args_is_help=True, pretty_exceptions_enable=False)
    register(app)
    app()


if __name__ == "__main__":
    main()
