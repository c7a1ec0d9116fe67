"""`ballast demo`: a real cluster in one process, shown live.

Three brokers start over an embedded `MemoryStore` (or etcd with ``--etcd``), topics with
mixed synthetic traffic are created and placed, two brokers join and automated
rebalancing (accelerated intervals, aggressive, no cooldown) spreads the load, a broker is
killed and its topics fail over, another is drained. Everything runs through the real
services: election, brokers, the load manager and the admin client. A summary with the
CV before and after, the moves and the failover time closes the run.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ballast.balance import measure, rank
from ballast.clock import SystemClock
from ballast.cluster.admin import AdminClient
from ballast.cluster.cluster import LocalCluster
from ballast.cluster.host import mixed_profiles
from ballast.cluster.live import LiveCluster
from ballast.cluster.traffic import LiveTraffic, TrafficVerdict
from ballast.config import BallastConfig, parse_config
from ballast.leader.view import ClusterView
from ballast.metadata import MetadataStore, keys
from ballast.metadata.factory import open_store
from ballast.model import BrokerMode, topic_namespace

NAMESPACE = "demo"
LIVE_NAMESPACE = "live"  # topics with real producers and consumers (through a gateway)


def demo_config() -> BallastConfig:
    """Accelerated intervals: reports every 0.2 s, a rebalancing check every 0.05 s."""
    return parse_config(
        {
            "load_manager": {
                "load_report_interval_seconds": 0.2,
                "assignment_strategy": "balanced",
                "rebalancing": {
                    "enabled": True,
                    "aggressiveness": "aggressive",
                    "check_interval_seconds": 0.05,
                    "cooldown_seconds": 0,
                    "min_topic_age_seconds": 0,
                    "max_moves_per_hour": 100_000,
                    "target_cv": 0.10,
                },
            },
            "broker": {"registration_ttl_seconds": 2.0, "leader_ttl_seconds": 2.0},
            "history": {"enabled": False},
            "metrics": {"enabled": False},
            # Brokers and gateway share one process here: no path between them can be cut,
            # and a stall of the one event loop (a loaded machine) looked like every broker
            # unreachable, which drained them all in the middle of the demo.
            "reachability": {"enabled": False},
        }
    )


@dataclass
class DemoSummary:
    """What the demo showed, with numbers."""

    topics: int = 0
    cv_placed: float = 0.0  # 3 brokers, right after placement
    cv_before: float = 0.0  # 5 brokers, the two new ones empty
    cv_after: float = 0.0  # after automated rebalancing
    moves: int = 0
    rebalance_seconds: float = 0.0
    killed: str = ""
    failover_topics: int = 0
    failover_seconds: float = 0.0  # kill -> every topic owned elsewhere
    failover_after_expiry_seconds: float = 0.0  # registration gone -> every topic owned
    drained: str = ""
    drain_seconds: float = 0.0
    duration_seconds: float = 0.0
    traffic: TrafficVerdict | None = None  # the real producers and consumers
    live_topics_killed: int = 0  # live topics on the killed broker
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {
            "topics": self.topics,
            "cv_placed": self.cv_placed,
            "cv_before": self.cv_before,
            "cv_after": self.cv_after,
            "moves": self.moves,
            "rebalance_seconds": self.rebalance_seconds,
            "killed": self.killed,
            "failover_topics": self.failover_topics,
            "failover_seconds": self.failover_seconds,
            "failover_after_expiry_seconds": self.failover_after_expiry_seconds,
            "drained": self.drained,
            "drain_seconds": self.drain_seconds,
            "duration_seconds": self.duration_seconds,
            "live_topics_killed": self.live_topics_killed,
            "traffic": self.traffic.to_dict() if self.traffic is not None else None,
            "ok": self.ok,
            "problems": list(self.problems),
        }


class Dashboard:
    """The live view: phase, brokers, balance and the leader's latest decisions."""

    def __init__(self, cluster: LocalCluster, admin: AdminClient) -> None:
        self.cluster = cluster
        self.admin = admin
        self.phase = "starting"
        self.started = time.monotonic()
        self.view: ClusterView | None = None
        self.cv = 0.0

    async def refresh(self) -> ClusterView:
        self.view = await self.admin.view()
        self.cv = (await self.admin.balance()).stats.cv
        return self.view

    def render(self) -> Group:
        view = self.view
        leader = self.cluster.leader()
        header = Text.assemble(
            ("Ballast demo", "bold"),
            f"  {time.monotonic() - self.started:5.1f}s   ",
            (self.phase, "cyan"),
        )
        table = Table("broker", "state", "topics", "score", "class", "cpu %", "MB/s", "")
        if view is not None:
            snapshot = view.snapshot()
            session = leader.manager.session if leader is not None else None
            strategy = self.admin.strategy(view)
            scores = dict(rank(snapshot, strategy).entries)
            active = {b: s for b, s in scores.items() if view.state(b).is_active}
            stats = measure(active)
            for broker in sorted(view.known_brokers()):
                report = view.reports.get(broker) if broker in view.registrations else None
                count = len(view.topics_of(broker))
                bar = "█" * min(60, count // 4)
                state = view.state(broker).mode.value if broker in view.registrations else "dead"
                table.add_row(
                    broker + (" ★" if leader is not None and leader.broker_id == broker else ""),
                    state,
                    str(count),
                    f"{scores[broker]:.1f}" if broker in scores else "-",
                    stats.classification(broker) if broker in active else "-",
                    f"{report.cpu_percent:.0f}" if report else "-",
                    f"{report.total_throughput_mbps:.1f}" if report else "-",
                    bar,
                )
            pending = len(view.markers)
            decision = (
                session.last_decision.explanation if session and session.last_decision else ""
            )
            balance = Text(
                f"CV {self.cv:.1%}   assigned {len(view.owners)}   pending {pending}   "
                f"moves {len(view.moves)}\n{decision[:160]}"
            )
        else:
            balance = Text("")
        events = list(leader.manager.events)[-8:] if leader is not None else []
        log = Text("\n".join(e[:150] for e in events), style="dim")
        return Group(header, table, balance, Panel(log, title="leader", border_style="dim"))


async def _until(
    check: Callable[[], Any], timeout: float, interval: float = 0.1
) -> tuple[bool, float]:
    """Poll an async check until true or timeout; (reached, seconds)."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if await check():
            return True, time.monotonic() - start
        await asyncio.sleep(interval)
    return False, time.monotonic() - start


async def _prepare(store: MetadataStore) -> None:
    registered = await store.get_prefix(keys.REGISTER_PREFIX)
    if registered.items:
        ids = ", ".join(ClusterView.from_listings(registered)[0].brokers())
        raise RuntimeError(
            f"the store already has registered brokers ({ids}); the demo needs an empty "
            "cluster (use the embedded store, or an etcd nobody else uses)"
        )
    await store.delete_prefix(keys.CLUSTER_PREFIX)
    await _forget_topics(store)


async def _forget_topics(store: MetadataStore) -> None:
    for namespace in (NAMESPACE, LIVE_NAMESPACE):
        await store.delete_prefix(keys.namespace_topics_prefix(namespace))
        await store.delete_prefix(keys.namespace_storage_prefix(namespace))


class LiveDemo:
    """Real traffic during the demo: a gateway and `topics` producer/consumer pairs."""

    def __init__(self, store: MetadataStore, config: BallastConfig, topics: int, rate: float):
        self.store = store
        self.config = config
        self.names = [f"/{LIVE_NAMESPACE}/orders-{i}" for i in range(topics)]
        self.rate = rate
        self.gateway: Any = None
        self.traffic: LiveTraffic | None = None

    async def start(self) -> None:
        from ballast.gateway.gateway import Gateway

        logging.getLogger("danube").setLevel(logging.ERROR)  # the client's re-subscribe notes
        self.gateway = Gateway(self.store, self.config, "127.0.0.1:0")
        await self.gateway.start()
        self.traffic = LiveTraffic(self.gateway.advertise, self.names, rate=self.rate)
        await self.traffic.start()
        await asyncio.sleep(1.0)
        self.traffic.reset_pauses()  # pauses count from here: the start-up is not one

    async def finish(self, summary: DemoSummary) -> None:
        try:
            if self.traffic is not None:
                await self.traffic.stop_producing(settle=30)
                verdict = await self.traffic.verdict(self.store)
                summary.traffic = verdict
                if verdict.lost:
                    summary.problems.append(
                        f"{verdict.lost} acknowledged messages were never consumed "
                        f"(e.g. {', '.join(verdict.lost_examples)})"
                    )
                if verdict.unexplained_gaps or verdict.reused_offsets:
                    summary.problems.append(
                        f"offsets: {verdict.unexplained_gaps} unexplained gaps, "
                        f"{verdict.reused_offsets} reused"
                    )
                if verdict.produced == 0 or verdict.consumed == 0:
                    summary.problems.append("the real producers and consumers moved nothing")
        finally:
            await self.close()

    async def close(self) -> None:
        if self.traffic is not None:
            await self.traffic.close()
            self.traffic = None
        if self.gateway is not None:
            await self.gateway.stop(grace=0.2)
            self.gateway = None


async def run_demo(
    etcd: str | None = None,
    *,
    topics: int = 240,
    console: Console | None = None,
    live: bool = True,
    pause: float = 1.0,
    rebalance_timeout: float = 30.0,
    live_topics: int = 4,
    live_rate: float = 20.0,
) -> DemoSummary:
    """Run the whole demo; returns its summary (printed too).

    With `live_topics` > 0, brokers also serve real reliable topics, and that many
    producer/consumer pairs of the real client send through a gateway during every phase.
    """
    console = console or Console()
    clock = SystemClock()
    config = demo_config()
    summary = DemoSummary(topics=topics)
    started = time.monotonic()
    store = open_store(etcd, clock)
    async with store:
        await _prepare(store)
        admin = AdminClient(store, clock, config)
        scratch = tempfile.TemporaryDirectory(prefix="ballast-demo-")
        real = LiveDemo(store, config, live_topics, live_rate) if live_topics > 0 else None
        cluster_cm: LocalCluster = (
            LiveCluster(
                store,
                clock,
                config,
                data_dir=scratch.name,
                real_namespaces=frozenset({LIVE_NAMESPACE}),
                profiles=mixed_profiles,
            )
            if real is not None
            else LocalCluster(store, clock, config, profiles=mixed_profiles)
        )
        async with cluster_cm as cluster:
            board = Dashboard(cluster, admin)
            with Live(
                board.render(), console=console, refresh_per_second=8, transient=not live
            ) as screen:

                async def show(phase: str | None = None) -> ClusterView:
                    if phase is not None:
                        board.phase = phase
                    view = await board.refresh()
                    screen.update(board.render())
                    return view

                async def ticker() -> None:
                    while True:
                        await show()
                        await asyncio.sleep(0.2)

                ui = asyncio.ensure_future(ticker())
                try:
                    await _scenario(cluster, admin, summary, show, pause, rebalance_timeout, real)
                finally:
                    ui.cancel()
                    await asyncio.wait({ui})
                    if real is not None:
                        await real.close()
                await show("done")
        scratch.cleanup()
        if etcd is not None:
            await store.delete_prefix(keys.CLUSTER_PREFIX)
            await _forget_topics(store)
    summary.duration_seconds = time.monotonic() - started
    _print_summary(console, summary)
    return summary


async def _scenario(
    cluster: LocalCluster,
    admin: AdminClient,
    summary: DemoSummary,
    show: Callable[[str | None], Any],
    pause: float,
    rebalance_timeout: float,
    live: LiveDemo | None = None,
) -> None:
    n = summary.topics

    async def settled() -> bool:
        view = await admin.view()
        placed = sum(1 for t in view.owners if topic_namespace(t) == NAMESPACE)
        return placed == n and not view.markers

    await show("starting 3 brokers")
    for broker in ("b1", "b2", "b3"):
        await cluster.start_broker(broker)
    await cluster.wait_leader()
    if live is not None:
        await show(f"real traffic: {len(live.names)} producers and consumers through a gateway")
        await live.start()

    await show(f"creating {n} topics with mixed traffic (light, medium, heavy)")
    await admin.create_topics(f"/{NAMESPACE}/topic-{i:04d}" for i in range(n))
    if not (await _until(settled, 20))[0]:
        summary.problems.append("topics were not all placed within 20 s")
    await asyncio.sleep(pause)  # let the load reports show the traffic
    summary.cv_placed = (await admin.balance()).stats.cv

    await show("adding 2 brokers: automated rebalancing")
    for broker in ("b4", "b5"):
        await cluster.start_broker(broker)
    await asyncio.sleep(0.3)  # their first reports
    summary.cv_before = (await admin.balance()).stats.cv
    moves_before = len(await admin.history())
    rebalance_start = time.monotonic()

    async def rebalanced() -> bool:
        leader = cluster.leader()
        session = leader.manager.session if leader is not None else None
        decision = session.last_decision if session is not None else None
        view = await admin.view()
        return (
            decision is not None
            and decision.rule in ("balanced", "no-useful-move")
            and session is not None
            and not session.episode
            and not view.markers
            and len(view.moves) > moves_before
        )

    done, _ = await _until(rebalanced, rebalance_timeout)
    summary.rebalance_seconds = time.monotonic() - rebalance_start
    await asyncio.sleep(pause / 2)
    summary.cv_after = (await admin.balance()).stats.cv
    summary.moves = len(await admin.history()) - moves_before
    if not done:
        summary.problems.append(f"rebalancing did not finish within {rebalance_timeout:.0f} s")
    if summary.cv_after >= summary.cv_before:
        summary.problems.append("rebalancing did not lower the CV")
    await asyncio.sleep(pause)

    leader = cluster.leader()
    view = await admin.view()
    candidates = [b for b in ("b2", "b3", "b4") if leader is None or b != leader.broker_id]
    # Prefer the broker with the most live topics: their clients must survive its death.
    victim = max(
        candidates,
        key=lambda b: (
            sum(topic_namespace(t) == LIVE_NAMESPACE for t in view.topics_of(b)),
            -int(b[1:]),
        ),
    )
    orphans = set(view.topics_of(victim))
    summary.killed = victim
    summary.live_topics_killed = sum(topic_namespace(t) == LIVE_NAMESPACE for t in orphans)
    summary.failover_topics = len(orphans)
    await show(f"killing {victim} (no goodbye: its lease must expire)")
    killed_at = time.monotonic()
    await cluster.kill_broker(victim)
    expired_at: list[float] = []

    async def failed_over() -> bool:
        view = await admin.view()
        if not expired_at and victim not in view.registrations:
            expired_at.append(time.monotonic())
        return all(view.owner(t) not in (None, victim) for t in orphans)

    ok, _ = await _until(failed_over, 10, interval=0.02)
    done_at = time.monotonic()
    summary.failover_seconds = done_at - killed_at
    if expired_at:
        summary.failover_after_expiry_seconds = done_at - expired_at[0]
    if not ok:
        summary.problems.append(f"{victim}'s topics were not failed over within 10 s")
    await asyncio.sleep(pause)

    leader = cluster.leader()
    drain = next(
        b
        for b in ("b3", "b4", "b5", "b1")
        if b != victim and (leader is None or b != leader.broker_id)
    )
    summary.drained = drain
    await show(f"draining {drain}")
    await admin.drain(drain)

    async def drained() -> bool:
        view = await admin.view()
        return view.state(drain).mode is BrokerMode.DRAINED and not view.topics_of(drain)

    ok, summary.drain_seconds = await _until(drained, 15, interval=0.05)
    if not ok:
        summary.problems.append(f"{drain} was not drained within 15 s")
    if not (await _until(settled, 10))[0]:
        summary.problems.append("not every topic was assigned at the end")
    await asyncio.sleep(pause)
    if live is not None:
        await show("stopping the producers; the consumers catch up")
        await live.finish(summary)


def _print_summary(console: Console, s: DemoSummary) -> None:
    console.print()
    table = Table("", "", title="summary", show_header=False)
    table.add_row("topics", str(s.topics))
    table.add_row("CV after placement (3 brokers)", f"{s.cv_placed:.1%}")
    table.add_row("CV after adding 2 brokers", f"{s.cv_before:.1%}")
    table.add_row(
        "CV after rebalancing", f"{s.cv_after:.1%}  ({s.moves} moves in {s.rebalance_seconds:.1f}s)"
    )
    table.add_row(
        f"failover of {s.killed}",
        f"{s.failover_topics} topics in {s.failover_seconds:.2f}s after the kill "
        f"({s.failover_after_expiry_seconds:.2f}s after lease expiry); "
        f"{s.live_topics_killed} with live clients",
    )
    table.add_row(f"drain of {s.drained}", f"drained in {s.drain_seconds:.2f}s")
    t = s.traffic
    if t is not None:
        table.add_row(
            "real messages (client, gateway)",
            f"{t.produced} produced (acknowledged), {t.consumed} consumed on {t.topics} topics",
        )
        table.add_row("lost / duplicates", f"{t.lost} / {t.duplicates} (at-least-once retries)")
        table.add_row(
            "offset gaps not explained by a crash",
            f"{t.unexplained_gaps} (reused offsets: {t.reused_offsets})",
        )
        table.add_row(
            "longest pause",
            f"producer {t.longest_producer_pause:.2f}s, consumer {t.longest_consumer_pause:.2f}s",
        )
    table.add_row("duration", f"{s.duration_seconds:.1f}s")
    table.add_row("result", "[green]ok[/green]" if s.ok else "[red]" + "; ".join(s.problems))
    console.print(table)
