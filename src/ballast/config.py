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


# The reference document's table: CV threshold, check interval, max moves per hour.
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

    enabled: bool = False
    aggressiveness: AggressivenessField = Aggressiveness.BALANCED
    cv_threshold: float = Field(0.30, gt=0, le=10)
    check_interval_seconds: float = Field(300, gt=0)
    max_moves_per_hour: int = Field(10, ge=0)
    cooldown_seconds: float = Field(60, ge=0)
    min_brokers_for_rebalance: int = Field(2, ge=2)
    min_topic_age_seconds: float = Field(300, ge=0)
    blacklist_topics: tuple[str, ...] = ()
    # Ballast addition: an episode, once started, goes on until CV falls below this.
    target_cv: float = Field(0.10, ge=0, le=10)
    # Pulsar (issue 12): `danube` (the CV rule above) or one of Pulsar's shedders, whose
    # settings are `load_manager.pulsar`.
    policy: PolicyField = RebalancingPolicy.DANUBE
    # Ballast additions against noise and stuck moves (README "Rebalancing"):
    # - a source that has not sealed a moving topic after this many seconds is overruled:
    #   the leader proceeds and records the move as forced (the storage engine's fenced
    #   claim makes a late seal harmless);
    seal_timeout_seconds: float = Field(30, gt=0)
    # - a topic never moves back to the broker it left within this window;
    return_window_seconds: float = Field(3600, ge=0)
    # - no move while the spread of the active brokers' scores (max - min) is below this
    #   absolute floor (score units: topics for fair, points for balanced/weighted_load);
    min_imbalance: float = Field(2.0, ge=0)
    # - resource readings (cpu, memory, disk, network) are smoothed by an exponentially
    #   weighted average seeded with the first sample: u = w * u_prev + (1 - w) * sample.
    smoothing_weight: float = Field(0.9, ge=0, lt=1)

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
    default_number_of_namespace_bundles: int = Field(4, ge=1, le=1 << 16)
    auto_bundle_split_enabled: bool = True
    auto_unload_split_bundles_enabled: bool = True
    default_namespace_bundle_split_algorithm: SplitAlgorithmField = (
        SplitAlgorithm.RANGE_EQUALLY_DIVIDE
    )
    namespace_bundle_max_topics: int = Field(1000, ge=1)
    namespace_bundle_max_sessions: int = Field(1000, ge=0)  # 0 disables the session rule
    namespace_bundle_max_msg_rate: float = Field(30_000, gt=0)
    namespace_bundle_max_bandwidth_mbytes: float = Field(100, gt=0)
    namespace_maximum_bundles: int = Field(128, ge=1, le=1 << 16)
    flow_or_qps_difference_threshold_percentage: float = Field(10, ge=0)
    # Shedding.
    shedding_enabled: bool = True
    shedding_grace_period_minutes: float = Field(30, ge=0)
    broker_threshold_shedder_percentage: float = Field(10, ge=0, le=100)
    broker_overloaded_threshold_percentage: float = Field(85, gt=0, le=100)
    bundle_unload_min_throughput_threshold: float = Field(10, ge=0)  # MB/s
    lower_boundary_shedding_enabled: bool = False
    history_resource_percentage: Fraction = 0.9
    msg_rate_difference_shedder_threshold: float = Field(50, ge=0)  # %, 0 disables
    msg_throughput_multiplier_difference_shedder_threshold: float = Field(4, ge=0)  # ×, 0 off
    max_unload_percentage: Fraction = 0.2
    min_unload_message: float = Field(1000, ge=0)  # msg/s
    min_unload_message_throughput: float = Field(1024 * 1024, ge=0)  # bytes/s
    max_unload_bundle_num_per_shedding: int = Field(-1, ge=-1)  # -1: no limit
    # Resource weights (ThresholdShedder and LeastResourceUsageWithWeight).
    cpu_resource_weight: Fraction = 1.0
    memory_resource_weight: Fraction = 1.0
    direct_memory_resource_weight: Fraction = 1.0
    bandwith_in_resource_weight: Fraction = 1.0
    bandwith_out_resource_weight: Fraction = 1.0
    # Placement (LeastResourceUsageWithWeight).
    average_resource_usage_difference_threshold_percentage: float = Field(10, ge=0, le=100)
    # Ballast reports one network rate per broker; its capacity for bandwidth usage
    # (Pulsar reads the NIC speed, or `loadBalancerOverrideBrokerNicSpeedGbps`).
    nic_speed_gbps: float = Field(1.0, gt=0)

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

    load_report_interval_seconds: float = Field(30, gt=0)
    assignment_strategy: StrategyField = Strategy.BALANCED
    rebalancing: RebalancingConfig = RebalancingConfig()
    # Pulsar (issue 12): place and move single topics (Danube) or whole namespace bundles.
    placement_unit: PlacementUnitField = PlacementUnit.TOPIC
    pulsar: PulsarConfig = PulsarConfig()


class BrokerConfig(_Strict):
    """`broker`: how one broker process identifies and exposes itself."""

    id: str | None = None
    broker_url: str = "127.0.0.1:6650"
    admin_url: str = "127.0.0.1:50051"
    rack: str | None = None
    domain: str | None = None
    registration_ttl_seconds: float = Field(32, gt=0)
    leader_ttl_seconds: float = Field(14, gt=0)


class MetricsConfig(_Strict):
    """`metrics`: the Prometheus endpoint."""

    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = Field(9040, ge=0, le=65535)


class HistoryConfig(_Strict):
    """`history`: where the leader appends every load report for the data pipeline."""

    enabled: bool = True
    directory: str = "./load-history"


# -- the data plane: the client protocol and reliable-topic storage -------------------------

MiB = 1024 * 1024


class DataPlaneConfig(_Strict):
    """`data_plane`: the client-facing gRPC services a broker serves on `broker.broker_url`."""

    enabled: bool = True
    # Payload + attributes + routing key of one message. Below the client's 4 MiB receive
    # limit, with room for the delivered message's other fields: all that is stored is
    # deliverable (see `wire.limits`).
    max_message_bytes: int = Field(4 * MiB - 64 * 1024, gt=0, le=4 * MiB - 64 * 1024)
    # gRPC refuses larger requests (RESOURCE_EXHAUSTED) before parsing them; between
    # `max_message_bytes` and this, the answer is a clear INVALID_ARGUMENT.
    max_request_bytes: int = Field(8 * MiB, ge=4 * MiB, le=64 * MiB)
    # Calls in progress at once (open consumer streams included); more: RESOURCE_EXHAUSTED.
    max_concurrent_rpcs: int = Field(10_000, gt=0)
    # Gateways' batched sends and acks arrive on this TCP port of the broker_url's host
    # (0: a free one; TLS as the gRPC port; each send still checked with its own token);
    # null: none, gateways then use a stream on the gRPC port (more CPU per message).
    link_port: int | None = Field(0, ge=0, le=65535)
    unacked_window: int = Field(1000, gt=0)  # delivered, not yet acked, per consumer
    # Bytes of messages held until stored (reliable: until in object storage), per topic
    # and per broker; a send over either is refused with RESOURCE_EXHAUSTED (the client
    # backs off and retries).
    topic_budget_bytes: int = Field(64 * MiB, gt=0)
    broker_budget_bytes: int = Field(512 * MiB, gt=0)
    # Bytes read ahead for one subscription: a slow (non-reliable) subscription drops its
    # oldest, a reliable one stops reading until its consumers catch up.
    subscription_buffer_bytes: int = Field(16 * MiB, gt=0)
    # A subscription without consumers this long is removed with its cursor (0: never).
    subscription_expiry_seconds: float = Field(0.0, ge=0)
    lookup_wait_seconds: float = Field(3.0, ge=0)  # a lookup waits this long for an owner
    close_handshake_seconds: float = Field(6.0, gt=0)  # a moving consumer's stream lives on
    relay_moving_consumers: bool = True  # feed that stream from the new owner meanwhile
    non_reliable_queue: int = Field(10_000, gt=0)  # per subscription; older messages drop
    auto_create_topics: bool = True
    # Nack: a message delivered this many times (0: no limit) goes to the dead-letter topic
    # `/{ns}/{topic}{dead_letter_suffix}` (a namespace's `/policies/dead_letter/{ns}`
    # record overrides both), carrying its original offset and the nack reason.
    max_deliveries: int = Field(0, ge=0)
    dead_letter_suffix: str = Field("-DLQ", pattern=r"^[A-Za-z0-9_.\-]{1,32}$")

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

    data_dir: str = "./ballast-data"  # the WAL goes to {data_dir}/wal/{broker_id}
    object_store: str = ""  # a directory or s3://bucket/prefix; default {data_dir}/objects
    # fsspec options, e.g. {key, secret, client_kwargs: {endpoint_url: ...}} for s3.
    object_store_options: dict[str, Any] = Field(default_factory=dict)
    # When a reliable topic acknowledges a send: "durable" once it is committed to the
    # object store (survives the loss of the host), "local" once it is in the local WAL
    # (faster; loses the not yet uploaded tail with the host, see the README).
    ack: str = Field("durable", pattern="^(durable|local)$")
    # With ack "durable" the WAL is a buffer and read cache, so fsyncing it protects nothing
    # acknowledged; with "local" it is the only copy until the upload: "batch" survives a
    # power loss, "never" only a process crash.
    fsync_policy: str = Field("never", pattern="^(batch|interval|never)$")
    # How long a busy topic gathers sends into one object before writing it (the latency a
    # send pays at most for batching), and the largest object.
    commit_linger_seconds: float = Field(0.003, ge=0, le=1.0)
    max_object_bytes: int = Field(16 * MiB, ge=64 * 1024)
    # Object writes per second of the whole broker, across its topics (object stores bill
    # and throttle per request): beyond it objects get fuller, not more numerous.
    max_object_writes_per_second: float = Field(500.0, gt=0)
    upload_interval_seconds: float = Field(30.0, gt=0)
    cursor_flush_seconds: float = Field(5.0, gt=0)
    # Each reliable topic's WAL read cache, in bytes (payload + key; 8-16 k records at most).
    wal_cache_bytes: int = Field(32 * MiB, gt=0)
    # An object several topics share that none of them refers to any more (its parts merged
    # or released after a move or a restart) is deleted by its writer's sweep this long
    # after it was written (the sweep runs every quarter of it).
    shared_object_grace_seconds: float = Field(3600.0, ge=60.0)

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

    enabled: bool = False
    cert_file: str | None = None
    key_file: str | None = None
    ca_file: str | None = None
    require_client_cert: bool = False

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

    mode: str = Field("none", pattern="^(none|jwt)$")
    algorithm: str = Field("HS256", pattern="^(HS256|RS256)$")
    secret: str | None = None
    secret_file: str | None = None
    public_key_file: str | None = None
    private_key_file: str | None = None
    issuer: str = "ballast"
    # The token brokers present to each other (relay, dead letters). Without it a broker
    # signs its own with the key above; a broker that only verifies (RS256 with
    # public_key_file alone) needs one with admin on "*".
    cluster_token_file: str | None = None

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

    listen: str = "127.0.0.1:6600"
    advertise: str | None = None  # what lookups name as connect_url (default: the bound address)
    # A lookup waits this long for a live owner (a dead owner is replaced once its
    # registration lease expires: keep it above broker.registration_ttl_seconds).
    lookup_wait_seconds: float = Field(45.0, ge=0)
    forward_timeout_seconds: float = Field(30.0, gt=0)  # a forwarded unary call's deadline
    # A consumer stream whose broker vanished is held open until the health check has
    # answered CLOSE (at most this long), so the client re-subscribes without a reopen spin.
    close_hold_seconds: float = Field(12.0, gt=0)
    # While a topic moves or its owner is replaced, sends wait in the gateway (at most
    # this many, of at most this many payload bytes in all; beyond, UNAVAILABLE as before).
    held_sends_max: int = Field(10_000, ge=0)
    held_bytes_max: int = Field(64 * 1024 * 1024, ge=0)
    # Sends to a broker go batched on one stream (off: one unary call per send, as a
    # plain proxy would; costs the gateway and the broker more CPU per message).
    batch_sends: bool = True
    # Prometheus series (ballast_gateway_*) on this port of the listen host; 0: none.
    metrics_port: int = Field(0, ge=0, le=65535)


class WireSettings(_Strict):
    """`wire`: the HTTP/2 front of every client-facing port (a gateway's and a broker's
    `broker_url`). Each limit protects the process from one known HTTP/2 abuse; what it
    refuses is counted (`ballast_wire_events`)."""

    # Calls open at once on one connection (SETTINGS_MAX_CONCURRENT_STREAMS; each consumer
    # holds one); more are refused with REFUSED_STREAM.
    max_concurrent_streams: int = Field(4096, gt=0, le=2**31 - 1)
    # Streams a client may reset per second on one connection (and as many at once);
    # beyond, GOAWAY with ENHANCE_YOUR_CALM (rapid reset, CVE-2023-44487).
    max_resets_per_second: int = Field(200, gt=0)
    # Entries of one SETTINGS frame, and SETTINGS frames per connection per second;
    # beyond either, GOAWAY with ENHANCE_YOUR_CALM.
    max_settings_entries: int = Field(32, gt=0, le=4096)
    max_settings_per_second: int = Field(20, gt=0)
    # Bytes written and not yet taken by a client: above `high`, the connection is not
    # read (a client that never reads cannot make answers pile up); above `max`, closed.
    write_buffer_high_bytes: int = Field(1024 * 1024, ge=16 * 1024)
    write_buffer_max_bytes: int = Field(64 * MiB, ge=64 * 1024)
    # Bytes of unfinished requests held across ALL connections of the port: flow-control
    # credit is given only while there is room, and a request past it is refused
    # (RESOURCE_EXHAUSTED).
    request_budget_bytes: int = Field(256 * MiB, ge=MiB)
    # Connections open at once, in all and from one peer address; more are closed at once.
    max_connections: int = Field(10_000, gt=0)
    max_connections_per_peer: int = Field(2_000, gt=0)
    # A connection that has sent no whole request this long after it opened is closed
    # (slowloris); one without calls this long is sent GOAWAY and closed (0: never).
    handshake_timeout_seconds: float = Field(10.0, gt=0)
    idle_timeout_seconds: float = Field(600.0, ge=0)
    # Bytes of one request's decoded header list (SETTINGS_MAX_HEADER_LIST_SIZE).
    max_header_list_bytes: int = Field(64 * 1024, ge=4096, le=16 * MiB)

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
