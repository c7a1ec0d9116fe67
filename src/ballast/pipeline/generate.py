"""A synthetic load history, written in exactly the sink's format.

The shapes are the ones a balancer has to cope with: a diurnal cycle, Zipf-skewed topic
popularity, a few topics that keep growing, some with a growing backlog, topics created
during the run (placed on the broker with the fewest topics, as Danube does), a broker
added half-way through (it only receives new topics, so it stays light) and a broker that
dies at three quarters (its topics fail over one by one to the least loaded brokers).
The original topics are spread unevenly (the first brokers hold more), as in a cluster
that grew without a balancer, so the final state leaves the planner work to do.

Everything is computed with NumPy over a whole hour of reports at once and the JSON is
assembled with Arrow string kernels, so tens of millions of topic rows take a minute or
two, not an hour. Numbers are generated on decimal grids (milli-messages, whole bytes,
centi-percent, milliseconds) and printed from integers, and the derived totals are summed
in the same order as `LoadReport`, so every line is byte-for-byte `LoadReport.to_json()`
of the report it describes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ballast.load_history import history_path

DEFAULT_START = 1_767_225_600.0  # 2026-01-01T00:00:00Z: fixed, so a seed gives one history
NAMESPACES = ("default", "orders", "analytics", "iot")
ZIPF_EXPONENT = 1.1
TOP_TOPIC_MSG_RATE = 4_000.0  # msg/s of the most popular topic at the diurnal mean
GROWING_FRACTION = 0.03  # topics whose traffic grows 4x over the run
LAGGING_FRACTION = 0.05  # topics whose consumers fall behind (backlog grows)
LATE_TOPIC_FRACTION = 0.15  # topics created during the run


class GeneratorError(ValueError):
    """Parameters that cannot describe a history; the message says which and why."""


@dataclass(frozen=True)
class GeneratorSpec:
    """What to generate: cluster size, duration, seed and report interval."""

    brokers: int
    topics: int
    hours: float
    seed: int = 0
    interval_seconds: float = 30.0
    start: float = DEFAULT_START

    def validate(self) -> None:
        """Raise `GeneratorError` naming the parameter that makes no history."""
        if self.brokers < 1:
            raise GeneratorError(f"--brokers must be at least 1, got {self.brokers}")
        if self.topics < 1:
            raise GeneratorError(f"--topics must be at least 1, got {self.topics}")
        if not self.hours > 0:
            raise GeneratorError(f"--hours must be positive, got {self.hours}")
        interval_ms = self.interval_seconds * 1000
        if self.interval_seconds < 1 or interval_ms != round(interval_ms):
            raise GeneratorError(
                f"--interval must be at least 1 second, in whole milliseconds, got "
                f"{self.interval_seconds}"
            )
        if self.start < 0 or self.start * 1000 != round(self.start * 1000):
            raise GeneratorError(f"start must be non-negative whole milliseconds: {self.start}")

    @property
    def ticks(self) -> int:
        """Number of report rounds."""
        return max(1, math.floor(self.hours * 3600 / self.interval_seconds))


@dataclass(frozen=True)
class GeneratedHistory:
    """What was written, for the caller's summary and for tests."""

    root: str
    files: tuple[str, ...]
    reports: int
    topic_rows: int
    brokers: tuple[str, ...]
    start: float
    end: float
    joined: dict[str, float] = field(default_factory=dict)  # broker -> first report
    died: dict[str, float] = field(default_factory=dict)  # broker -> last report + interval
    topic_created: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class _Plan:
    """The static part of a history: who exists when, who owns what, base traffic."""

    broker_ids: list[str]
    join_tick: np.ndarray  # (N,) first tick a broker reports
    death_tick: np.ndarray  # (N,) first tick it no longer reports
    jitter_ms: np.ndarray  # (N,) report offset inside a tick, < 1 s
    created_tick: np.ndarray  # (M,)
    owner1: np.ndarray  # (M,) owner from creation
    fail_tick: np.ndarray  # (M,) tick the topic fails over (ticks+1 if never)
    owner2: np.ndarray  # (M,) owner after fail-over
    base_rate: np.ndarray  # (M,) msg/s at the diurnal mean
    msg_size: np.ndarray  # (M,) bytes per message
    growth: np.ndarray  # (M,) extra multiple reached at the end of the run
    lag_seconds: np.ndarray  # (M,) steady consumer lag
    backlog_drift: np.ndarray  # (M,) messages/s of backlog growth for lagging consumers
    producers: np.ndarray
    consumers: np.ndarray
    subscriptions: np.ndarray
    topic_prefix: pa.Array  # '{"topic":"/ns/name","msg_rate":' per topic
    topic_names: list[str]
    throughput_ref: float  # MB/s that puts a broker at ~60 % CPU
    count_ref: float


def _least_loaded(counts: np.ndarray, alive: np.ndarray) -> int:
    """Alive broker with the fewest topics, lowest index on ties (deterministic)."""
    masked = np.where(alive, counts, np.iinfo(np.int64).max)
    return int(np.argmin(masked))


def _make_plan(spec: GeneratorSpec, rng: np.random.Generator) -> _Plan:
    n, m, ticks = spec.brokers, spec.topics, spec.ticks
    broker_ids = [f"broker-{i + 1}" for i in range(n)]
    join_tick = np.zeros(n, dtype=np.int64)
    death_tick = np.full(n, ticks + 1, dtype=np.int64)
    if n >= 3:  # scale-out and a failure need a cluster that survives both
        join_tick[n - 1] = ticks // 2
        death_tick[1] = max(1, (3 * ticks) // 4)
    jitter_ms = (np.arange(n, dtype=np.int64) * 137) % 997

    created = np.zeros(m, dtype=np.int64)
    late = rng.random(m) < LATE_TOPIC_FRACTION
    late[0] = False  # at least one topic from the start
    created[late] = rng.integers(1, max(2, ticks), size=int(late.sum()))

    # Replay creations and the death in time order, placing like the leader would.
    owner1 = np.full(m, -1, dtype=np.int64)
    owner2 = np.full(m, -1, dtype=np.int64)
    fail_tick = np.full(m, ticks + 1, dtype=np.int64)
    counts = np.zeros(n, dtype=np.int64)
    initial = np.flatnonzero(created == 0)
    starters = np.flatnonzero(join_tick == 0)
    # Organic growth leaves a skew: the first brokers hold more of the original topics.
    weights = 1.0 / (np.arange(starters.size) + 1.0) ** 0.7
    owner1[initial] = rng.choice(starters, size=initial.size, p=weights / weights.sum())
    np.add.at(counts, owner1[initial], 1)
    owner = owner1.copy()
    events = sorted(
        [(int(created[t]), 1, int(t)) for t in np.flatnonzero(created > 0)]
        + [(int(death_tick[b]), 0, int(b)) for b in range(n) if death_tick[b] <= ticks]
    )
    for tick, kind, index in events:
        alive = (join_tick <= tick) & (death_tick > tick)
        if kind == 1:
            chosen = _least_loaded(counts, alive)
            owner1[index] = owner[index] = chosen
            counts[chosen] += 1
        else:
            counts[index] = 0
            for topic in np.flatnonzero(owner == index):
                chosen = _least_loaded(counts, alive)
                fail_tick[topic], owner2[topic], owner[topic] = tick, chosen, chosen
                counts[chosen] += 1
    owner2 = np.where(owner2 >= 0, owner2, owner1)

    rank = rng.permutation(m) + 1
    base_rate = TOP_TOPIC_MSG_RATE / rank.astype(float) ** ZIPF_EXPONENT + 0.2
    msg_size = np.round(rng.lognormal(np.log(800), 0.6, m)).clip(64, 64_000)
    growth = np.where(rng.random(m) < GROWING_FRACTION, 3.0, 0.0)
    lag_seconds = rng.lognormal(0.0, 0.8, m)
    backlog_drift = np.where(rng.random(m) < LAGGING_FRACTION, rng.uniform(0.5, 5.0, m), 0.0)
    producers = 1 + rng.poisson(1.5, m)
    consumers = rng.poisson(2.5, m)
    subscriptions = np.maximum(1, (consumers + 1) // 2)

    names = [f"/{NAMESPACES[i % len(NAMESPACES)]}/topic-{i:05d}" for i in range(m)]
    prefix = pa.array([f'{{"topic":"{name}","msg_rate":' for name in names], pa.string())
    cluster_mbps = float((base_rate * msg_size).sum()) / 1e6
    starters_count = max(1, int((join_tick == 0).sum()))
    return _Plan(
        broker_ids=broker_ids,
        join_tick=join_tick,
        death_tick=death_tick,
        jitter_ms=jitter_ms,
        created_tick=created,
        owner1=owner1,
        fail_tick=fail_tick,
        owner2=owner2,
        base_rate=base_rate,
        msg_size=msg_size,
        growth=growth,
        lag_seconds=lag_seconds,
        backlog_drift=backlog_drift,
        producers=producers,
        consumers=consumers,
        subscriptions=subscriptions,
        topic_prefix=prefix,
        topic_names=names,
        throughput_ref=max(1e-6, 1.6 * cluster_mbps / starters_count),
        count_ref=max(1.0, m / starters_count),
    )


def _decimal_strings(scaled: np.ndarray, places: int) -> pa.Array:
    """Format non-negative integers holding value·10^places as Python prints the float.

    `repr(x / 10**places)` is the shortest string that reads back as that float, which
    for these magnitudes is the decimal with trailing zeros removed (at least one digit
    after the point): 12300 at 3 places -> "12.3", 12000 -> "12.0".
    """
    unit = 10**places
    whole = pc.cast(pa.array(scaled // unit), pa.string())
    frac = pc.utf8_lpad(pc.cast(pa.array(scaled % unit), pa.string()), width=places, padding="0")
    frac = pc.utf8_rtrim(frac, characters="0")
    frac = pc.if_else(pc.equal(frac, ""), "0", frac)
    return pc.binary_join_element_wise(whole, ".", frac, "")


def _sequential_sums(
    values: np.ndarray, report_of_row: np.ndarray, starts: np.ndarray, reports: int
) -> np.ndarray:
    """Per-report sums in row order, as `LoadReport` adds them (0.0 + v1 + v2 + ...).

    NumPy's reductions sum pairwise, which can differ in the last bit: pad every report to
    the same length and add column by column instead (adding 0.0 changes nothing).
    """
    position = np.arange(values.size) - starts[report_of_row]
    width = int(position.max()) + 1 if values.size else 0
    padded = np.zeros((reports, width))
    padded[report_of_row, position] = values
    total = np.zeros(reports)
    for column in range(width):
        total += padded[:, column]
    return total


def _hour_lines(
    spec: GeneratorSpec,
    plan: _Plan,
    rng: np.random.Generator,
    ticks: np.ndarray,
    hour_start_ms: int,
    hour_end_ms: int,
) -> tuple[pa.Array, int]:
    """All report lines whose timestamp falls in one hour, in time order."""
    n = spec.brokers
    interval_ms = round(spec.interval_seconds * 1000)
    start_ms = round(spec.start * 1000)
    # Reports: every (tick, broker) alive at that tick whose timestamp is in the hour.
    tick_grid = np.repeat(ticks, n)
    broker_grid = np.tile(np.arange(n), ticks.size)
    ts_ms = start_ms + tick_grid * interval_ms + plan.jitter_ms[broker_grid]
    keep = (
        (plan.join_tick[broker_grid] <= tick_grid)
        & (plan.death_tick[broker_grid] > tick_grid)
        & (ts_ms >= hour_start_ms)
        & (ts_ms < hour_end_ms)
    )
    order = np.lexsort((plan.jitter_ms[broker_grid], tick_grid))
    order = order[keep[order]]
    rep_tick, rep_broker, rep_ts_ms = tick_grid[order], broker_grid[order], ts_ms[order]
    reports = order.size
    if reports == 0:
        return pa.array([], pa.string()), 0

    # Topic rows: each topic at each tick goes to its owner's report (if in this hour).
    uticks = np.unique(rep_tick)
    k = uticks[:, None]
    owner = np.where(
        k < plan.created_tick[None, :],
        -1,
        np.where(k >= plan.fail_tick[None, :], plan.owner2[None, :], plan.owner1[None, :]),
    )
    row_tick_i, row_topic = np.nonzero(owner >= 0)
    row_owner = owner[row_tick_i, row_topic]
    lookup = np.full((uticks.size, n), -1, dtype=np.int64)
    lookup[np.searchsorted(uticks, rep_tick), rep_broker] = np.arange(reports)
    row_report = lookup[row_tick_i, row_owner]
    in_hour = row_report >= 0
    row_report, row_topic, row_tick_i = row_report[in_hour], row_topic[in_hour], row_tick_i[in_hour]
    order = np.lexsort((row_topic, row_report))
    row_report, row_topic = row_report[order], row_topic[order]
    rows = row_report.size

    # Traffic: Zipf base x diurnal cycle x growth x noise, on the milli-message grid.
    t = rep_ts_ms[row_report] / 1000.0
    elapsed = (t - spec.start) / max(1.0, spec.ticks * spec.interval_seconds)
    diurnal = 1.0 + 0.4 * np.sin(2 * np.pi * (t % 86_400) / 86_400 - np.pi / 2)
    noise = rng.lognormal(0.0, 0.15, rows)
    rate = plan.base_rate[row_topic] * diurnal * (1.0 + plan.growth[row_topic] * elapsed) * noise
    msg_milli = np.round(rate * 1000).astype(np.int64)
    byte_rate = np.round(msg_milli / 1000.0 * plan.msg_size[row_topic]).astype(np.int64)
    age = t - (spec.start + plan.created_tick[row_topic] * spec.interval_seconds)
    backlog = np.round(
        msg_milli / 1000.0 * plan.lag_seconds[row_topic] * rng.uniform(0.5, 1.5, rows)
        + plan.backlog_drift[row_topic] * age
    ).astype(np.int64)

    starts = np.searchsorted(row_report, np.arange(reports))
    counts = np.diff(np.append(starts, rows))
    msg_values = msg_milli / 1000.0
    total_msg = _sequential_sums(msg_values, row_report, starts, reports)
    total_bytes = _sequential_sums(byte_rate.astype(float), row_report, starts, reports)
    total_backlog = np.bincount(row_report, weights=backlog, minlength=reports).astype(np.int64)
    connections = np.bincount(
        row_report, weights=plan.producers[row_topic] + plan.consumers[row_topic], minlength=reports
    )
    fanout = np.bincount(
        row_report, weights=byte_rate * plan.consumers[row_topic], minlength=reports
    )

    # Broker resources follow the traffic they carry, plus noise.
    mbps = total_bytes / 1e6
    cpu = 4 + 56 * mbps / plan.throughput_ref + 0.02 * counts + rng.normal(0, 2, reports)
    mem = (
        18
        + 30 * counts / plan.count_ref
        + 8 * mbps / plan.throughput_ref
        + rng.normal(0, 1.5, reports)
    )
    cpu_centi = np.round(np.clip(cpu, 0, 100) * 100).astype(np.int64)
    mem_centi = np.round(np.clip(mem, 0, 100) * 100).astype(np.int64)
    disk = np.round(total_bytes * 1.1 + np.abs(rng.normal(0, 20_000, reports))).astype(np.int64)
    net = np.round(total_bytes + fanout + 0.01 * connections).astype(np.int64)

    topic_json = pc.binary_join_element_wise(
        plan.topic_prefix.take(pa.array(row_topic)),
        _decimal_strings(msg_milli, 3),
        ',"byte_rate":',
        _decimal_strings(byte_rate, 0),
        ',"producers":',
        pc.cast(pa.array(plan.producers[row_topic]), pa.string()),
        ',"consumers":',
        pc.cast(pa.array(plan.consumers[row_topic]), pa.string()),
        ',"subscriptions":',
        pc.cast(pa.array(plan.subscriptions[row_topic]), pa.string()),
        ',"backlog":',
        pc.cast(pa.array(backlog), pa.string()),
        "}",
        "",
    )
    offsets = pa.array(np.append(starts, rows).astype(np.int32))
    topics = pc.binary_join(pa.ListArray.from_arrays(offsets, topic_json), ",")

    ts_str = _decimal_strings(rep_ts_ms, 3).to_pylist()
    cpu_str = _decimal_strings(cpu_centi, 2).to_pylist()
    mem_str = _decimal_strings(mem_centi, 2).to_pylist()
    heads = [
        f'{{"broker_id":"{plan.broker_ids[b]}","timestamp":{ts},"cpu_percent":{c},'
        f'"memory_percent":{mm},"disk_io_bps":{d}.0,"network_io_bps":{nn}.0,"topics":['
        for b, ts, c, mm, d, nn in zip(
            rep_broker.tolist(), ts_str, cpu_str, mem_str, disk.tolist(), net.tolist(), strict=True
        )
    ]
    tails = [
        f'],"topic_count":{c},"total_throughput_mbps":{tb / 1_000_000!r},'
        f'"total_msg_rate":{tm!r},"total_backlog":{bl}}}\n'
        for c, tb, tm, bl in zip(
            counts.tolist(),
            total_bytes.tolist(),
            total_msg.tolist(),
            total_backlog.tolist(),
            strict=True,
        )
    ]
    lines = pc.binary_join_element_wise(pa.array(heads), topics, pa.array(tails), "")
    return lines, rows


def _string_bytes(lines: pa.Array) -> memoryview:
    """The concatenated text of a string array, without copying it."""
    offsets = np.frombuffer(lines.buffers()[1], dtype=np.int32)[
        lines.offset : lines.offset + len(lines) + 1
    ]
    data = lines.buffers()[2]
    return memoryview(data)[int(offsets[0]) : int(offsets[-1])]


def generate_history(
    spec: GeneratorSpec,
    out: str,
    storage_options: dict[str, object] | None = None,
    on_hour: Callable[[int, int], None] | None = None,
) -> GeneratedHistory:
    """Write a synthetic history under `out` (a directory or fsspec URL).

    `on_hour(done, total)` is called after each hour file, for progress displays.
    Raises `GeneratorError` for impossible parameters.
    """
    spec.validate()
    rng = np.random.default_rng(spec.seed)
    plan = _make_plan(spec, rng)
    fs, root = fsspec.core.url_to_fs(out, **(storage_options or {}))
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    interval_ms = round(spec.interval_seconds * 1000)
    start_ms = round(spec.start * 1000)
    end_ms = start_ms + (spec.ticks - 1) * interval_ms + int(plan.jitter_ms.max()) + 1
    first_hour = start_ms // 3_600_000
    last_hour = (end_ms - 1) // 3_600_000
    files: list[str] = []
    reports = rows = 0
    total_hours = last_hour - first_hour + 1
    for done, hour in enumerate(range(first_hour, last_hour + 1), start=1):
        h0, h1 = hour * 3_600_000, (hour + 1) * 3_600_000
        # Ticks whose reports (tick time + jitter < 1 s) can land in this hour.
        lo = max(0, -(-(h0 - 999 - start_ms) // interval_ms))
        hi = min(spec.ticks, -(-(h1 - start_ms) // interval_ms))
        lines, hour_rows = _hour_lines(spec, plan, rng, np.arange(lo, hi, dtype=np.int64), h0, h1)
        if len(lines):
            path = history_path(root, h0 / 1000, "generator")
            fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
            with fs.open(path, "wb") as handle:
                handle.write(_string_bytes(lines))
            files.append(path if protocol in ("file", "local") else f"{protocol}://{path}")
            reports += len(lines)
            rows += hour_rows
        if on_hour is not None:
            on_hour(done, total_hours)
    interval = spec.interval_seconds
    return GeneratedHistory(
        root=out,
        files=tuple(files),
        reports=reports,
        topic_rows=rows,
        brokers=tuple(plan.broker_ids),
        start=spec.start,
        end=(end_ms - 1) / 1000,
        joined={
            plan.broker_ids[b]: spec.start + int(plan.join_tick[b]) * interval
            for b in range(spec.brokers)
            if plan.join_tick[b] > 0
        },
        died={
            plan.broker_ids[b]: spec.start + int(plan.death_tick[b]) * interval
            for b in range(spec.brokers)
            if plan.death_tick[b] <= spec.ticks
        },
        topic_created={
            name: spec.start + int(tick) * interval
            for name, tick in zip(plan.topic_names, plan.created_tick.tolist(), strict=True)
        },
    )
