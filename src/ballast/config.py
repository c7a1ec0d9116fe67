"""Configuration: the `load_manager` section of Danube's broker YAML, plus Ballast's additions.

Unknown keys and wrong types are rejected with the key's full path and the allowed values.
Aggressiveness presets fill every rebalancing value the file does not set explicitly.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError, model_validator


class ConfigError(ValueError):
    """An invalid configuration; the message lists every offending key by path."""


class Strategy(StrEnum):
    FAIR = "fair"
    BALANCED = "balanced"
    WEIGHTED_LOAD = "weighted_load"
    # Pulsar's placement strategies (balance/pulsar/strategies.py).
    LEAST_LONG_TERM_MESSAGE_RATE = "least_long_term_message_rate"
    LEAST_RESOURCE_USAGE_WITH_WEIGHT = "least_resource_usage_with_weight"


class Aggressiveness(StrEnum):
    CONSERVATIVE = "conservative"
    BALANCED = "balanced"
    AGGRESSIVE = "aggressive"


# Danube's aggressiveness table (docs/design/danube-load-manager.md): CV threshold, check
# interval, max moves per hour.
PRESETS: dict[Aggressiveness, dict[str, float | int]] = {
    Aggressiveness.CONSERVATIVE: {
        "cv_threshold": 0.40,
        "check_interval_seconds": 600,
        "max_moves_per_hour": 5,
    },
    Aggressiveness.BALANCED: {
        "cv_threshold": 0.30,
        "check_interval_seconds": 300,
        "max_moves_per_hour": 10,
    },
    Aggressiveness.AGGRESSIVE: {
        "cv_threshold": 0.20,
        "check_interval_seconds": 120,
        "max_moves_per_hour": 20,
    },
}


# --- Pulsar's load balancing (issue 12): enums -------------------------------------------


class RebalancingPolicy(StrEnum):
    """Who decides what moves: Danube's CV rule or one of Pulsar's shedders."""

    DANUBE = "danube"
    THRESHOLD = "threshold"
    OVERLOAD = "overload"
    UNIFORM = "uniform"


class PlacementUnit(StrEnum):
    """What the leader places and moves: single topics (Danube) or namespace bundles."""

    TOPIC = "topic"
    BUNDLE = "bundle"


class SplitAlgorithm(StrEnum):
    """Pulsar's namespace-bundle split algorithms."""

    RANGE_EQUALLY_DIVIDE = "range_equally_divide"
    TOPIC_COUNT_EQUALLY_DIVIDE = "topic_count_equally_divide"
    SPECIFIED_POSITIONS_DIVIDE = "specified_positions_divide"  # admin only
    FLOW_OR_QPS_EQUALLY_DIVIDE = "flow_or_qps_equally_divide"


# Enums arrive as strings from YAML: let those (only those) be coerced.
StrategyField = Annotated[Strategy, Strict(False)]
AggressivenessField = Annotated[Aggressiveness, Strict(False)]
PolicyField = Annotated[RebalancingPolicy, Strict(False)]
PlacementUnitField = Annotated[PlacementUnit, Strict(False)]
SplitAlgorithmField = Annotated[SplitAlgorithm, Strict(False)]
Fraction = Annotated[float, Field(ge=0, le=1)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class RebalancingConfig(_Strict):
    """`load_manager.rebalancing`: when and how fast the leader moves topics."""

    enabled: bool = Field(False, description="Whether the leader moves topics at all.")
    aggressiveness: AggressivenessField = Field(
        Aggressiveness.BALANCED,
        description="Preset for `cv_threshold`, `check_interval_seconds` and "
        "`max_moves_per_hour`; a value set explicitly overrides the preset.",
    )
    cv_threshold: float = Field(
        0.30,
        gt=0,
        le=10,
        description="An episode of moves starts when the coefficient of variation of the "
        "brokers' scores exceeds this (default from `aggressiveness`).",
    )
    check_interval_seconds: float = Field(
        300,
        gt=0,
        description="How often the leader checks the balance (default from `aggressiveness`).",
    )
    max_moves_per_hour: int = Field(
        10,
        ge=0,
        description="Moves allowed in any hour, counted from the persisted move history "
        "(default from `aggressiveness`).",
    )
    cooldown_seconds: float = Field(
        60,
        ge=0,
        description="No move this soon after the previous one, and a topic moved within it "
        "does not move again.",
    )
    min_brokers_for_rebalance: int = Field(
        2, ge=2, description="No rebalancing with fewer active brokers than this."
    )
    min_topic_age_seconds: float = Field(
        300, ge=0, description="A topic younger than this (from its creation) never moves."
    )
    blacklist_topics: tuple[str, ...] = Field(
        (),
        description='Globs of topics that never move, e.g. `"/system/*"`, `"/default/critical-*"`.',
    )
    target_cv: float = Field(
        0.10,
        ge=0,
        le=10,
        description="Ballast: an episode, once started, goes on until the CV falls below "
        "this; must not exceed `cv_threshold`.",
    )
    policy: PolicyField = Field(
        RebalancingPolicy.DANUBE,
        description="Who decides the moves: `danube` (the CV rule) or one of Pulsar's "
        "shedders, whose settings are `load_manager.pulsar`.",
    )
    # Ballast's additions against noise and stuck moves (the balancing rules page).
    seal_timeout_seconds: float = Field(
        30,
        gt=0,
        description="Ballast: a source that has not sealed a moving topic this long after "
        "the leader first saw the marker is overruled and the move recorded as forced (the "
        "new owner's fenced claim makes a late seal harmless).",
    )
    return_window_seconds: float = Field(
        3600,
        ge=0,
        description="Ballast: a topic never moves back to the broker it left within this window.",
    )
    min_imbalance: float = Field(
        2.0,
        ge=0,
        description="Ballast: no move while the spread (max - min) of the active brokers' "
        "scores is below this (score units: topics for fair, points for balanced and "
        "weighted_load).",
    )
    smoothing_weight: float = Field(
        0.9,
        ge=0,
        lt=1,
        description="Ballast: weight w of the moving average of CPU, memory, disk and "
        "network readings, seeded with the first sample: u = w * u_prev + (1 - w) * sample.",
    )

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        level = data.get("aggressiveness", Aggressiveness.BALANCED.value)
        try:
            preset = PRESETS[Aggressiveness(level)]
        except ValueError:
            return data  # the field validator reports the bad level with its path
        return {**preset, **data}

    @model_validator(mode="after")
    def _target_below_threshold(self) -> RebalancingConfig:
        if self.target_cv > self.cv_threshold:
            raise ValueError(
                f"target_cv ({self.target_cv}) must not exceed cv_threshold "
                f"({self.cv_threshold}): an episode would never start or never end"
            )
        return self


class PulsarConfig(_Strict):
    """`load_manager.pulsar`: Pulsar's `loadBalancer*` settings, with the defaults of the
    Pulsar 4.0 documentation (names in snake_case, percentages as Pulsar writes them)."""

    # Namespace bundles and splitting.
    default_number_of_namespace_bundles: int = Field(
        4, ge=1, le=1 << 16, description="Bundles of a namespace that has no stored layout."
    )
    auto_bundle_split_enabled: bool = Field(
        True,
        description="With `placement_unit: bundle`, each check first splits the bundles "
        "over a `namespace_bundle_max_*` threshold.",
    )
    auto_unload_split_bundles_enabled: bool = Field(
        True,
        description="After an automatic split, unload the split bundles' topics so the new "
        "bundles place them.",
    )
    default_namespace_bundle_split_algorithm: SplitAlgorithmField = Field(
        SplitAlgorithm.RANGE_EQUALLY_DIVIDE,
        description="How an automatic split cuts a bundle (`specified_positions_divide` is "
        "admin-only and refused here).",
    )
    namespace_bundle_max_topics: int = Field(
        1000, ge=1, description="Split threshold: topics in one bundle."
    )
    namespace_bundle_max_sessions: int = Field(
        1000,
        ge=0,
        description="Split threshold: producers plus consumers of one bundle (0 disables "
        "the rule).",
    )
    namespace_bundle_max_msg_rate: float = Field(
        30_000, gt=0, description="Split threshold: messages per second in plus out."
    )
    namespace_bundle_max_bandwidth_mbytes: float = Field(
        100, gt=0, description="Split threshold: MB/s in plus out."
    )
    namespace_maximum_bundles: int = Field(
        128, ge=1, le=1 << 16, description="No automatic split beyond this many bundles."
    )
    flow_or_qps_difference_threshold_percentage: float = Field(
        10,
        ge=0,
        description="`flow_or_qps_equally_divide`: tolerated difference between halves, in %.",
    )
    # Shedding.
    shedding_enabled: bool = Field(True, description="Whether a Pulsar shedder runs at all.")
    shedding_grace_period_minutes: float = Field(
        30,
        ge=0,
        description="A unit moved within this many minutes (from the persisted history) is "
        "not shed again.",
    )
    broker_threshold_shedder_percentage: float = Field(
        10,
        ge=0,
        le=100,
        description="ThresholdShedder: shed from brokers this many points above the average usage.",
    )
    broker_overloaded_threshold_percentage: float = Field(
        85,
        gt=0,
        le=100,
        description="OverloadShedder and placement: a broker above this usage % is overloaded.",
    )
    bundle_unload_min_throughput_threshold: float = Field(
        10, ge=0, description="ThresholdShedder: no shedding below this throughput, in MB/s."
    )
    lower_boundary_shedding_enabled: bool = Field(
        False,
        description="ThresholdShedder: also shed towards brokers far below the average.",
    )
    history_resource_percentage: Fraction = Field(
        0.9, description="Weight of the previous smoothed usage in ThresholdShedder's average."
    )
    msg_rate_difference_shedder_threshold: float = Field(
        50,
        ge=0,
        description="UniformLoadShedder: message-rate difference between brokers, in % "
        "(0 disables).",
    )
    msg_throughput_multiplier_difference_shedder_threshold: float = Field(
        4,
        ge=0,
        description="UniformLoadShedder: throughput ratio between brokers (0 disables).",
    )
    max_unload_percentage: Fraction = Field(
        0.2, description="UniformLoadShedder: share of the difference moved per decision."
    )
    min_unload_message: float = Field(
        1000, ge=0, description="UniformLoadShedder: no shedding below this msg/s difference."
    )
    min_unload_message_throughput: float = Field(
        1024 * 1024,
        ge=0,
        description="UniformLoadShedder: no shedding below this bytes/s difference.",
    )
    max_unload_bundle_num_per_shedding: int = Field(
        -1, ge=-1, description="Units one decision may shed (-1: no limit)."
    )
    # Resource weights (ThresholdShedder and LeastResourceUsageWithWeight).
    cpu_resource_weight: Fraction = Field(1.0, description="Weight of CPU usage.")
    memory_resource_weight: Fraction = Field(1.0, description="Weight of memory usage.")
    direct_memory_resource_weight: Fraction = Field(
        1.0, description="Weight of direct memory usage (Ballast reports 0)."
    )
    bandwith_in_resource_weight: Fraction = Field(
        1.0, description="Weight of inbound bandwidth usage (Pulsar's spelling)."
    )
    bandwith_out_resource_weight: Fraction = Field(
        1.0, description="Weight of outbound bandwidth usage (Pulsar's spelling)."
    )
    # Placement (LeastResourceUsageWithWeight).
    average_resource_usage_difference_threshold_percentage: float = Field(
        10,
        ge=0,
        le=100,
        description="LeastResourceUsageWithWeight: candidates are the brokers this many "
        "points below the average weighted usage.",
    )
    nic_speed_gbps: float = Field(
        1.0,
        gt=0,
        description="Ballast reports one network rate per broker; its bandwidth usage is "
        "measured against this capacity (Pulsar reads the NIC speed, or "
        "`loadBalancerOverrideBrokerNicSpeedGbps`).",
    )

    @model_validator(mode="after")
    def _auto_split_algorithm(self) -> PulsarConfig:
        if (
            self.default_namespace_bundle_split_algorithm
            is SplitAlgorithm.SPECIFIED_POSITIONS_DIVIDE
        ):
            raise ValueError(
                "default_namespace_bundle_split_algorithm: 'specified_positions_divide' is "
                "admin-only (it needs positions); use range_equally_divide, "
                "topic_count_equally_divide or flow_or_qps_equally_divide"
            )
        return self


class LoadManagerConfig(_Strict):
    """`load_manager`: the section of Danube's `danube_broker.yml`, same defaults."""

    load_report_interval_seconds: float = Field(
        30, gt=0, description="How often each broker reports its load."
    )
    assignment_strategy: StrategyField = Field(
        Strategy.BALANCED,
        description="How brokers are scored for placement: Danube's three rankings or "
        "Pulsar's two strategies.",
    )
    rebalancing: RebalancingConfig = Field(
        RebalancingConfig(), description="When and how fast the leader moves topics."
    )
    placement_unit: PlacementUnitField = Field(
        PlacementUnit.TOPIC,
        description="What the leader places and moves: single topics (Danube) or whole "
        "namespace bundles (Pulsar).",
    )
    pulsar: PulsarConfig = Field(PulsarConfig(), description="Pulsar's `loadBalancer*` settings.")


class BrokerConfig(_Strict):
    """`broker`: how one broker process identifies and exposes itself."""

    id: str | None = Field(None, description="The broker's id (`--id` overrides it).")
    broker_url: str = Field(
        "127.0.0.1:6650",
        description="HOST:PORT where the broker serves clients (port 0: a free one).",
    )
    admin_url: str = Field("127.0.0.1:50051", description="Registered for operators' tools.")
    rack: str | None = Field(None, description="The broker's rack, registered with it.")
    domain: str | None = Field(
        None, description="The broker's failure domain (anti-affinity placement)."
    )
    registration_ttl_seconds: float = Field(
        32,
        gt=0,
        description="TTL of the registration lease: a broker silent this long is dead and "
        "its topics fail over.",
    )
    leader_ttl_seconds: float = Field(14, gt=0, description="TTL of the leader key's lease.")


class MetricsConfig(_Strict):
    """`metrics`: the Prometheus endpoint."""

    enabled: bool = Field(True, description="Whether the broker serves Prometheus metrics.")
    host: str = Field("127.0.0.1", description="Address the metrics endpoint binds.")
    port: int = Field(
        9040,
        ge=0,
        le=65535,
        description="Port of the metrics endpoint (0: none registered, left out of discovery).",
    )


class HistoryConfig(_Strict):
    """`history`: where the leader appends every load report for the data pipeline."""

    enabled: bool = Field(True, description="Whether the leader writes the load history.")
    directory: str = Field(
        "./load-history",
        description="Where JSON lines go, as `date=YYYY-MM-DD/hour=HH/` (the pipeline's input).",
    )


# -- the data plane: the client protocol and reliable-topic storage -------------------------

MiB = 1024 * 1024


class DataPlaneConfig(_Strict):
    """`data_plane`: the client-facing gRPC services a broker serves on `broker.broker_url`."""

    enabled: bool = Field(True, description="Whether the broker serves clients at all.")
    # The bound keeps every stored message deliverable (see `wire.limits`).
    max_message_bytes: int = Field(
        4 * MiB - 64 * 1024,
        gt=0,
        le=4 * MiB - 64 * 1024,
        description="Payload + attributes + routing key of one message; kept below the "
        "client's 4 MiB receive limit, with room for the delivered message's other fields, "
        "so all that is stored is deliverable.",
    )
    max_request_bytes: int = Field(
        8 * MiB,
        ge=4 * MiB,
        le=64 * MiB,
        description="Larger requests are refused (RESOURCE_EXHAUSTED) before parsing; "
        "between `max_message_bytes` and this the answer is INVALID_ARGUMENT.",
    )
    max_concurrent_rpcs: int = Field(
        10_000,
        gt=0,
        description="Calls in progress at once, open consumer streams included; more get "
        "RESOURCE_EXHAUSTED.",
    )
    link_port: int | None = Field(
        0,
        ge=0,
        le=65535,
        description="TCP port (on the `broker_url` host) for gateways' batched sends and "
        "acks: 0 a free one, null none (gateways then use a stream on the gRPC port, more "
        "CPU per message). TLS as the gRPC port; each send still checked with its own token.",
    )
    unacked_window: int = Field(
        1000, gt=0, description="Messages delivered and not yet acked, per consumer."
    )
    topic_budget_bytes: int = Field(
        64 * MiB,
        gt=0,
        description="Bytes of messages held until stored (reliable: until in object "
        "storage) per topic; a send over it gets RESOURCE_EXHAUSTED and the client retries.",
    )
    broker_budget_bytes: int = Field(
        512 * MiB, gt=0, description="The same budget for the whole broker."
    )
    subscription_buffer_bytes: int = Field(
        16 * MiB,
        gt=0,
        description="Read-ahead of one subscription: past it a non-reliable subscription "
        "drops its oldest, a reliable one stops reading until its consumers catch up.",
    )
    subscription_expiry_seconds: float = Field(
        0.0,
        ge=0,
        description="A subscription without consumers this long is removed with its cursor "
        "(0: never).",
    )
    lookup_wait_seconds: float = Field(
        3.0, ge=0, description="A lookup of a topic between owners waits this long."
    )
    close_handshake_seconds: float = Field(
        6.0,
        gt=0,
        description="How long a moving consumer's stream is kept open for the close handshake.",
    )
    relay_moving_consumers: bool = Field(
        True, description="Meanwhile, feed that stream from the new owner."
    )
    non_reliable_queue: int = Field(
        10_000,
        gt=0,
        description="Messages queued per non-reliable subscription; older ones drop.",
    )
    auto_create_topics: bool = Field(
        True,
        description="A producer's first CreateProducer creates the topic (a namespace quota "
        "can override it).",
    )
    max_deliveries: int = Field(
        0,
        ge=0,
        description="A message nacked until delivered this many times goes to the "
        "dead-letter topic, with its original offset and the nack reason (0: no limit; "
        "`/policies/dead_letter/{ns}` overrides).",
    )
    dead_letter_suffix: str = Field(
        "-DLQ",
        pattern=r"^[A-Za-z0-9_.\-]{1,32}$",
        description="The dead-letter topic is `/{ns}/{topic}{dead_letter_suffix}`.",
    )

    @model_validator(mode="before")
    @classmethod
    def _old_names(cls, data: Any) -> Any:
        """`max_payload_bytes` (before the whole message counted) is read as the new name."""
        if isinstance(data, dict) and "max_payload_bytes" in data:
            if "max_message_bytes" in data:
                raise ValueError(
                    "max_payload_bytes is the old name of max_message_bytes: give only one"
                )
            data = dict(data)
            data["max_message_bytes"] = data.pop("max_payload_bytes")
        return data


class StorageSettings(_Strict):
    """`storage`: where reliable topics keep their WAL (local) and objects (shared)."""

    data_dir: str = Field(
        "./ballast-data", description="Local data; the WAL goes to `{data_dir}/wal/{broker_id}`."
    )
    object_store: str = Field(
        "",
        description="A directory or `s3://bucket/prefix`, the same for every broker "
        "(empty: `{data_dir}/objects`).",
    )
    object_store_options: dict[str, Any] = Field(
        default_factory=dict,
        description="fsspec options, e.g. `{key, secret, client_kwargs: {endpoint_url: ...}}` "
        "for s3.",
    )
    ack: str = Field(
        "durable",
        pattern="^(durable|local)$",
        description="When a reliable topic acknowledges a send: `durable` once committed to "
        "the object store (survives the loss of the host), `local` once in the local WAL "
        "(faster; loses the not yet uploaded tail with the host).",
    )
    fsync_policy: str = Field(
        "never",
        pattern="^(batch|interval|never)$",
        description="WAL fsyncs. With `ack: durable` the WAL is a buffer and read cache and "
        "fsyncing protects nothing acknowledged; with `local` it is the only copy until the "
        "upload: `batch` survives a power loss, `never` only a process crash.",
    )
    commit_linger_seconds: float = Field(
        0.003,
        ge=0,
        le=1.0,
        description="How long a topic with concurrent senders gathers sends into one object "
        "(the most a send waits for batching).",
    )
    stream_linger_seconds: float = Field(
        0.001,
        ge=0,
        le=1.0,
        description="While several topics send together, how long the broker's shared "
        "object and its shared transaction wait for the other topics' parts and commits.",
    )
    max_object_bytes: int = Field(16 * MiB, ge=64 * 1024, description="The largest object.")
    max_object_writes_per_second: float = Field(
        500.0,
        gt=0,
        description="Object writes per second of the whole broker, all topics together "
        "(object stores bill and throttle per request): beyond it objects get fuller, not "
        "more numerous.",
    )
    upload_interval_seconds: float = Field(
        30.0,
        gt=0,
        description="How often small committed objects are merged and retention is applied.",
    )
    cursor_flush_seconds: float = Field(
        5.0, gt=0, description="How often subscription cursors are written."
    )
    wal_cache_bytes: int = Field(
        32 * MiB,
        gt=0,
        description="Each reliable topic's WAL read cache (payload + key; 8-16 k records at most).",
    )
    shared_object_grace_seconds: float = Field(
        3600.0,
        ge=60.0,
        description="An object shared by several topics that none refers to any more is "
        "deleted by its writer's sweep this long after it was written (the sweep runs every "
        "quarter of it).",
    )

    def object_store_url(self) -> str:
        """The object store URL (the default shares `data_dir` between local brokers)."""
        return self.object_store or str(Path(self.data_dir) / "objects")


# -- security and the gateway --------------------------------------------------------------


class TlsSettings(_Strict):
    """`tls`: TLS on the client-facing gRPC port (a broker's `broker_url`, a gateway's).

    `ca_file` is the trust anchor: it verifies client certificates when
    `require_client_cert` is on (mTLS), and a gateway uses it (with its own certificate as
    the client certificate) to dial brokers that serve TLS.
    """

    enabled: bool = Field(False, description="Serve TLS (needs `cert_file` and `key_file`).")
    cert_file: str | None = Field(None, description="The server certificate (PEM).")
    key_file: str | None = Field(None, description="Its private key (PEM).")
    ca_file: str | None = Field(
        None,
        description="CA that verifies client certificates; a gateway trusts brokers by it.",
    )
    require_client_cert: bool = Field(
        False, description="mTLS: refuse clients without a certificate (needs `ca_file`)."
    )

    @model_validator(mode="after")
    def _files_given(self) -> TlsSettings:
        if self.enabled and not (self.cert_file and self.key_file):
            raise ValueError("tls.enabled needs cert_file and key_file (PEM files)")
        if self.require_client_cert and not self.ca_file:
            raise ValueError("tls.require_client_cert needs ca_file (the CA of client certs)")
        return self


class AuthSettings(_Strict):
    """`auth`: JWT bearer tokens (``authorization: Bearer …``) with per-namespace permissions.

    HS256 verifies with a shared `secret` (or `secret_file`); RS256 with `public_key_file`
    and issues with `private_key_file`. ``mode: none`` lets every request through.
    """

    mode: str = Field(
        "none",
        pattern="^(none|jwt)$",
        description="`jwt`: every call needs a bearer token with the permission; `none` lets "
        "every request through.",
    )
    algorithm: str = Field(
        "HS256", pattern="^(HS256|RS256)$", description="The tokens' signature algorithm."
    )
    secret: str | None = Field(None, description="HS256: the shared secret.")
    secret_file: str | None = Field(None, description="HS256: a file holding the secret.")
    public_key_file: str | None = Field(None, description="RS256: the key that verifies.")
    private_key_file: str | None = Field(
        None, description="RS256: the key that signs (to issue tokens)."
    )
    issuer: str = Field("ballast", description="The `iss` claim issued and required.")
    cluster_token_file: str | None = Field(
        None,
        description="The token brokers present to each other (relay, dead letters). Without "
        "it a broker signs its own; a broker that only verifies (RS256 with "
        '`public_key_file` alone) needs one with `admin` on `"*"`.',
    )

    @model_validator(mode="after")
    def _keys_given(self) -> AuthSettings:
        if self.mode != "jwt":
            return self
        if self.algorithm == "HS256" and not (self.secret or self.secret_file):
            raise ValueError("auth: HS256 needs secret or secret_file")
        if self.algorithm == "RS256" and not (self.public_key_file or self.private_key_file):
            raise ValueError("auth: RS256 needs public_key_file (and private_key_file to issue)")
        return self


class GatewaySettings(_Strict):
    """`gateway`: the stateless front door clients use as their `service_url`."""

    listen: str = Field("127.0.0.1:6600", description="HOST:PORT the gateway serves clients on.")
    advertise: str | None = Field(
        None,
        description="What lookups name as `connect_url` (default: the bound address); with "
        "several gateways, their shared address.",
    )
    lookup_wait_seconds: float = Field(
        45.0,
        ge=0,
        description="A lookup (or a held call) waits this long for a live owner; keep it "
        "above `broker.registration_ttl_seconds`, after which a dead owner is replaced.",
    )
    forward_timeout_seconds: float = Field(
        30.0, gt=0, description="A forwarded unary call's deadline."
    )
    close_hold_seconds: float = Field(
        12.0,
        gt=0,
        description="A consumer stream whose broker vanished is held open until the health "
        "check has answered CLOSE (at most this long), so the client re-subscribes without "
        "a reopen spin.",
    )
    held_sends_max: int = Field(
        10_000,
        ge=0,
        description="Sends held in the gateway while a topic moves or its owner is replaced; "
        "beyond, UNAVAILABLE.",
    )
    held_bytes_max: int = Field(
        64 * 1024 * 1024, ge=0, description="Payload bytes of those held sends, in all."
    )
    batch_sends: bool = Field(
        True,
        description="Sends and acks to a broker travel batched on one link (off: one unary "
        "call per send, more CPU per message in the gateway and the broker).",
    )
    metrics_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="Prometheus series (`ballast_gateway_*`) on this port of the listen "
        "host; 0: none.",
    )


class WireSettings(_Strict):
    """`wire`: the HTTP/2 front of every client-facing port (a gateway's and a broker's
    `broker_url`). Each limit protects the process from one known HTTP/2 abuse; what it
    refuses is counted (`ballast_wire_events`)."""

    max_concurrent_streams: int = Field(
        4096,
        gt=0,
        le=2**31 - 1,
        description="Calls open at once on one connection (SETTINGS_MAX_CONCURRENT_STREAMS; "
        "each consumer holds one); more are refused with REFUSED_STREAM.",
    )
    max_resets_per_second: int = Field(
        200,
        gt=0,
        description="Streams a client may reset per second on one connection (and as many "
        "at once); beyond, GOAWAY ENHANCE_YOUR_CALM (rapid reset, CVE-2023-44487).",
    )
    max_settings_entries: int = Field(
        32,
        gt=0,
        le=4096,
        description="Entries of one SETTINGS frame; beyond, GOAWAY ENHANCE_YOUR_CALM.",
    )
    max_settings_per_second: int = Field(
        20,
        gt=0,
        description="SETTINGS frames per connection per second; beyond, GOAWAY ENHANCE_YOUR_CALM.",
    )
    write_buffer_high_bytes: int = Field(
        1024 * 1024,
        ge=16 * 1024,
        description="Bytes written and not yet taken by a client above which its connection "
        "is not read (a client that never reads cannot make answers pile up).",
    )
    write_buffer_max_bytes: int = Field(
        64 * MiB,
        ge=64 * 1024,
        description="Above this the connection is closed; must exceed "
        "`write_buffer_high_bytes` and the largest message a consumer receives.",
    )
    request_budget_bytes: int = Field(
        256 * MiB,
        ge=MiB,
        description="Bytes of unfinished requests across all connections of the port: "
        "flow-control credit is given only while there is room, and a request past it is "
        "refused (RESOURCE_EXHAUSTED).",
    )
    max_connections: int = Field(
        10_000, gt=0, description="Connections open at once; more are closed at once."
    )
    max_connections_per_peer: int = Field(
        2_000, gt=0, description="Connections open at once from one peer address."
    )
    handshake_timeout_seconds: float = Field(
        10.0,
        gt=0,
        description="A connection (or TLS handshake) that has sent no whole request this "
        "long after it opened is closed (slowloris).",
    )
    idle_timeout_seconds: float = Field(
        600.0,
        ge=0,
        description="A connection without calls this long is sent GOAWAY and closed (0: never).",
    )
    max_header_list_bytes: int = Field(
        64 * 1024,
        ge=4096,
        le=16 * MiB,
        description="Bytes of one request's decoded header list "
        "(SETTINGS_MAX_HEADER_LIST_SIZE; HPACK bombs).",
    )

    @model_validator(mode="after")
    def _ordered(self) -> WireSettings:
        if self.write_buffer_max_bytes <= self.write_buffer_high_bytes:
            raise ValueError("wire: write_buffer_max_bytes must be above write_buffer_high_bytes")
        return self


class ConnectionSettings(_Strict):
    """`connections`: how every long-lived connection of a process (to etcd, gateway to
    broker, broker to broker) notices that its peer went silent (packets dropped, a hung
    host) instead of waiting on a connection that will never answer (docs/gray-failures.md)."""

    keepalive_seconds: float = Field(
        2.0,
        gt=0,
        description="A connection with nothing received for this long is pinged (etcd's "
        "minimum of 5 s applies to its connections).",
    )
    keepalive_timeout_seconds: float = Field(
        3.0,
        gt=0,
        description="A ping not answered within this long drops the connection (counted in "
        "*_connection_timeouts_total) and it is dialed again; unacknowledged TCP data is given "
        "up after keepalive_seconds + keepalive_timeout_seconds (TCP_USER_TIMEOUT).",
    )


class ReachabilitySettings(_Strict):
    """`reachability`: a broker that every gateway fails to reach while etcd sees it alive
    (an asymmetric partition) is drained by the leader until gateways reach it again
    (`ballast.leader.reachability`, docs/gray-failures.md)."""

    enabled: bool = Field(
        True, description="Gateways report unreachable brokers and the leader drains them."
    )
    report_after_seconds: float = Field(
        1.0,
        gt=0,
        description="A gateway reports a broker whose connection has not been ready for this long.",
    )
    clear_after_seconds: float = Field(
        3.0,
        ge=0,
        description="A gateway withdraws its report once the broker was reachable for this "
        "long (hysteresis).",
    )
    evict_after_seconds: float = Field(
        1.0,
        ge=0,
        description="The leader drains a broker once every counting gateway has reported "
        "it for this long.",
    )
    min_gateways: int = Field(
        1, ge=1, description="Gateways that must count (and all report) before a drain."
    )
    check_interval_seconds: float = Field(
        0.5, gt=0, description="How often gateways probe and the leader applies the rule."
    )


class BallastConfig(_Strict):
    """The whole broker configuration file."""

    load_manager: LoadManagerConfig = LoadManagerConfig()
    broker: BrokerConfig = BrokerConfig()
    metrics: MetricsConfig = MetricsConfig()
    history: HistoryConfig = HistoryConfig()
    data_plane: DataPlaneConfig = DataPlaneConfig()
    storage: StorageSettings = StorageSettings()
    tls: TlsSettings = TlsSettings()
    auth: AuthSettings = AuthSettings()
    gateway: GatewaySettings = GatewaySettings()
    wire: WireSettings = WireSettings()
    connections: ConnectionSettings = ConnectionSettings()
    reachability: ReachabilitySettings = ReachabilitySettings()


def _allowed_keys(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """Field names allowed at the parent of `loc` (for unknown-key errors)."""
    current: Any = model
    for part in loc[:-1]:
        fields = getattr(current, "model_fields", None)
        if not fields or part not in fields:
            return []
        current = fields[part].annotation
    return sorted(getattr(current, "model_fields", {}))


def explain_validation_error(exc: ValidationError, root: type[BaseModel]) -> str:
    lines = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        path = ".".join(str(p) for p in loc) or "<root>"
        if err["type"] == "extra_forbidden":
            allowed = ", ".join(_allowed_keys(root, loc))
            lines.append(f"{path}: unknown key (allowed: {allowed})")
        else:
            lines.append(f"{path}: {err['msg']} (got {err.get('input')!r})")
    return "invalid configuration:\n  " + "\n  ".join(lines)


def parse_config(data: Any, source: str = "<config>") -> BallastConfig:
    """Validate a decoded YAML/JSON document; raise `ConfigError` listing every problem."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level")
    try:
        # YAML gives lists; strict mode wants tuples for the blacklist.
        return BallastConfig.model_validate(lists_to_tuples(data))
    except ValidationError as exc:
        raise ConfigError(f"{source}: {explain_validation_error(exc, BallastConfig)}") from None


def load_config(path: str | Path | None) -> BallastConfig:
    """Load a YAML file (or the defaults when `path` is None)."""
    if path is None:
        return BallastConfig()
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read configuration ({exc.strerror})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: malformed YAML: {exc}") from None
    return parse_config(data, str(p))


def lists_to_tuples(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: lists_to_tuples(v) for k, v in value.items()}
    if isinstance(value, list):
        return tuple(lists_to_tuples(v) for v in value)
    return value
