"""Configuration: environment variables ``MEMPROJ_*`` with documented defaults.

Built once by the CLI and passed to whatever needs it; nothing reads the environment at import
time. The defaults match the local stack started by ``ops/stack up``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal
from urllib.parse import unquote, urlsplit, urlunsplit

from psycopg.conninfo import conninfo_to_dict, make_conninfo
from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from projections.conversation.context import ContextSettings
from projections.embeddings.factory import EmbedderIdentity, EmbedderKind, embedder_identity
from projections.embeddings.vectors import SearchMode, VectorStoreKind
from projections.sealing.crypto import MasterKeys, parse_master_key, parse_master_keys
from projections.sql import KeyLookups
from streams.consumer import GroupConsumerSettings
from streams.kafka_security import KafkaCluster, KafkaSecurity, SaslMechanism, SecurityProtocol
from streams.loop import BatchLimits, BreakerSettings
from topics.registry import DELETION_REQUESTS, TopicNames, TopicReplication, TopicSpec

# The workers whose commit makes an event visible to the reads (recall, context): their
# batches wait less (ops/decisions/freshness.md).
PROJECTION_KINDS = frozenset({"memory", "conversation"})

# The inputs whose every message someone waits for, and which are few: a deletion request
# (an erasure's deadline runs from it). An agent that reads only these gathers as briefly as
# the projections, whatever its worker kind (ops/decisions/erasure-latency.md).
LATENCY_BOUND_INPUTS = frozenset({DELETION_REQUESTS.base_name})

# -- secrets --------------------------------------------------------------------------------

# Published in this repository: it protects nothing, so only local development may use it.
DEVELOPMENT_MASTER_KEY = "bWVtcHJvai1kZXZlbG9wbWVudC1vbmx5LWtleS0wMDE="
# The secret settings of this block, each also readable from the file <NAME>_FILE names.
SECRET_FILE_SETTINGS = ("master_key", "master_keys", "postgres_password", "kafka_password")


class DevelopmentKeyRefused(ValueError):
    """The published development master key, outside local development."""


def read_secret_file(setting: str, path: str | Path) -> str:
    """A mounted secret: the file's text without one trailing newline (editors and
    ``kubectl create secret --from-file`` add one)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ValueError(
            f"MEMPROJ_{setting.upper()}_FILE={path}: cannot read it ({exc.strerror})"
        ) from None
    return text[:-1] if text.endswith("\n") else text


def split_dsn_password(dsn: str) -> tuple[str, str | None]:
    """The DSN without its password, and the password (None: it has none). A URL stays a URL
    (callers append ``?options=...`` to it); a ``key=value`` DSN is rebuilt without it."""
    if "://" in dsn:
        parts = urlsplit(dsn)
        userinfo, at, host = parts.netloc.rpartition("@")
        user, colon, password = userinfo.partition(":")
        if not at or not colon:
            return dsn, None
        return urlunsplit(parts._replace(netloc=f"{user}@{host}")), unquote(password)
    fields = conninfo_to_dict(dsn)
    secret = fields.pop("password", None)
    if secret is None:
        return dsn, None
    return make_conninfo(**{k: str(v) for k, v in fields.items()}), str(secret)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="MEMPROJ_",
        frozen=True,
        extra="ignore",
        # A rejected value may be a secret: errors name the setting, never its value.
        hide_input_in_errors=True,
    )

    kafka_bootstrap: str = Field(
        "127.0.0.1:9092", description="Kafka bootstrap servers (host:port, comma separated)"
    )
    # -- Kafka client security: every client memproj builds uses it (``kafka``)
    kafka_security_protocol: SecurityProtocol = Field(
        SecurityProtocol.PLAINTEXT,
        description="how clients connect to Kafka: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL",
    )
    kafka_sasl_mechanism: SaslMechanism = Field(
        SaslMechanism.SCRAM_SHA_512,
        description="SASL mechanism (SASL_* protocols): PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512",
    )
    kafka_username: str | None = Field(None, description="SASL username")
    kafka_password: SecretStr | None = Field(
        None, description="SASL password (never logged); or MEMPROJ_KAFKA_PASSWORD_FILE"
    )
    kafka_password_file: Path | None = Field(
        None,
        description="a file holding MEMPROJ_KAFKA_PASSWORD (a mounted secret)",
    )
    kafka_ca_file: Path | None = Field(
        None,
        description="PEM CA bundle that signs the brokers' certificates (SSL, SASL_SSL); "
        "unset: the system's trusted CAs",
    )
    kafka_cert_file: Path | None = Field(
        None, description="PEM client certificate for mutual TLS (with MEMPROJ_KAFKA_KEY_FILE)"
    )
    kafka_key_file: Path | None = Field(None, description="PEM private key of the certificate")
    kafka_check_hostname: bool = Field(
        True, description="verify that the broker's certificate names the host connected to"
    )
    # -- end of Kafka client security
    topic_prefix: str = Field("", description="prefix for every topic name, e.g. 'staging.'")
    topic_replication_factor: int = Field(
        1,
        ge=1,
        description="replicas of each partition of the topics memproj creates (3 on a "
        "production cluster: one broker may fail without losing a write)",
    )
    topic_min_insync_replicas: int = Field(
        1,
        ge=1,
        description="replicas that must have a write before Kafka acknowledges it (producers "
        "use acks=all; 2 with a replication factor of 3); set on every topic memproj creates",
    )
    group_prefix: str = Field(
        "memproj",
        description="prefix of consumer group ids: each worker kind's group is <prefix>-<kind>",
    )
    kafka_session_timeout_seconds: float = Field(
        10.0,
        description="a worker that stops heartbeating is replaced in its group after this long",
    )
    rebalance_drain_seconds: float = Field(
        10.0,
        description="at a rebalance, the batches already taken from a revoked partition get "
        "this long to be applied and their offsets committed before the partition is given "
        "up; past it they are abandoned (redelivered to the next owner, which skips what was "
        "applied)",
    )
    postgres_dsn: str = Field(
        "postgresql://memproj:memproj@127.0.0.1:55432/memproj",
        description="PostgreSQL connection string for projections and the ledger; a password "
        "in it is moved to MEMPROJ_POSTGRES_PASSWORD at start (so this one is safe to show): "
        "outside local development give it there, or in MEMPROJ_POSTGRES_PASSWORD_FILE",
    )
    postgres_pool_size: int = Field(4, description="connections per worker process")
    lookups_per_tenant: bool = Field(
        False,
        description="look up a batch's keys with one statement per tenant, each naming its "
        "tenant (pipelined: one round trip for all), rather than one statement for all the "
        "batch's tenants: on Citus each then runs on its tenant's shard alone, not on every "
        "shard. On plain PostgreSQL leave it off: one statement is cheaper "
        "(ops/decisions/citus.md)",
    )
    redis_url: str = Field(
        "redis://127.0.0.1:56379/0",
        description="Redis for the cache store (and the rate limits' windows with "
        "MEMPROJ_API_RATE_LIMIT_STORAGE=redis); with MEMPROJ_REDIS_CLUSTER, any node of the "
        "cluster (database 0)",
    )
    redis_cluster: bool = Field(
        False,
        description="MEMPROJ_REDIS_URL names a node of a Redis Cluster: the client finds the "
        "other nodes and sends each key to its slot's master (every key of a tenant shares "
        "one slot; docs/operations.md)",
    )
    vector_store: VectorStoreKind = Field(
        "postgres",
        description="where the vectors of memories and messages are kept: postgres (the "
        "vector_entries table beside the rest of the data: any number of embeddings workers "
        "and API replicas on any node, an erasure visible at its commit) or lancedb (an "
        "embedded LanceDB directory in <data dir>/lancedb: one embeddings worker, and every "
        "process that opens the store on its node). A change starts from an empty store: "
        "rebuild it with `memproj replay embeddings`",
    )
    search_mode: SearchMode = Field(
        "hybrid",
        description="how a search by text (the API's search, recall --query) ranks a "
        "subject's memories: hybrid (both rankings below fused by reciprocal rank: meaning "
        "and exact words such as invoice numbers, ticket ids, product codes and names), "
        "semantic (by the embedder's vectors only) or lexical (by the words shared with the "
        "query only, an id like INV-2024-0042 kept whole). Entries indexed before the vector "
        "store kept search terms are found by words once `memproj replay embeddings` rebuilt "
        "them",
    )
    data_dir: Path = Field(
        Path(".stack/data"),
        description="worker-local state: with MEMPROJ_VECTOR_STORE=lancedb, the LanceDB "
        "vector store, in <data dir>/lancedb, which whatever opens the vector store shares: "
        "the embeddings, deletion and monitor workers, the API's search, recall --query, "
        "audit ghosts and replay embeddings",
    )
    max_memory_value_bytes: int = Field(
        65536, description="largest accepted memory value, in bytes of JSON"
    )
    # A deletion waits for the projections' transactions that hold its tenants' locks: 500
    # keeps erasure under load within 2 s for about 15% more CPU per event than 2000
    # (ops/decisions/erasure-latency.md).
    batch_max_events: int = Field(500, description="most events applied in one transaction")
    batch_max_wait_seconds: float = Field(
        0.25,
        description="longest a partial batch of the derived-store and deletion workers waits "
        "before it is applied (the memory and conversation workers and the deletion worker's "
        "requests: MEMPROJ_PROJECTION_BATCH_MAX_WAIT_SECONDS)",
    )
    projection_batch_max_wait_seconds: float = Field(
        0.05,
        description="longest a partial batch of the memory and conversation workers (and the "
        "deletion worker's requests) waits before it is applied: part of how soon recall and "
        "context see an event and an erasure begins; batches that arrive while one is "
        "applied are applied together, so a busy worker's transactions grow with its load "
        "whatever this is",
    )
    batch_max_bytes: int = Field(
        32 * 1024 * 1024,
        description="most bytes (keys and values) applied in one transaction; also bounds "
        "an outbox drain (a larger message is applied alone)",
    )
    breaker_failure_ratio: float = Field(
        0.5,
        description="the circuit breaker stops a worker when more than this share of the "
        "messages just seen failed the same way (same stage and exception class)",
    )
    breaker_min_failures: int = Field(
        5, description="fewest failures of one kind that can trip the circuit breaker"
    )
    breaker_window: int = Field(
        20,
        description="the breaker judges a batch topped up with the messages before it to "
        "this many (a trickle of one-message batches is judged together)",
    )
    context_budget_tokens: int = Field(
        4000, description="context view budget, in approximate tokens (4 characters each)"
    )
    context_tool_result_max_chars: int = Field(
        2000, description="a tool result longer than this is replaced by a notice in the view"
    )
    deletion_deadline_seconds: float = Field(
        3600.0,
        description="a deletion's deadline when the request names none (the alerts' SLOs "
        "per store are shorter: README, Alerts)",
    )
    deletion_redelivery_seconds: float = Field(
        30.0,
        description="an overdue tombstone is redelivered to its store this often (the first"
        " time no sooner than this after it was published)",
    )
    deletion_check_interval_seconds: float = Field(
        1.0, description="how often the deletion worker checks deadlines and verifications"
    )
    deletion_purge_check_seconds: float = Field(
        30.0,
        description="how often the deletion worker checks whether completed deletions left a "
        "copy anywhere (memory.current before compaction, raw input, PostgreSQL dead tuples, "
        "a store's old versions), vacuuming the tables they deleted from once the "
        "transaction horizon allows; 0: never (no deletion reaches purged)",
    )
    rebuild_grace_seconds: float = Field(
        7 * 24 * 3600.0,
        description="rebuild shadows (replay_*) and retired tables (retired_*) are dropped "
        "this long after they were created; until then every erasure reaches them too",
    )
    # -- retention (classes, expiry, legal holds: projections.retention)
    retention_default_seconds: float = Field(
        0.0,
        ge=0,
        description="the retention period of a conversation whose class its tenant does not "
        "configure (nor a tenant default, class '*'), after its last message; 0: kept",
    )
    retention_check_seconds: float = Field(
        60.0,
        gt=0,
        description="how often the deletion worker looks for conversations past their "
        "retention period and memories past their expiry and grace, and issues their erasure",
    )
    expiry_grace_seconds: float = Field(
        24 * 3600.0,
        ge=0,
        description="a memory past its expires_at (no longer served at once) is erased this "
        "long after it, with reason 'expired'",
    )
    retention_batch_size: int = Field(
        500, gt=0, description="the most erasures one retention round issues"
    )
    # -- topic lifetimes (raw input trimmed once sealed, memory.current compaction)
    raw_input_trim_seconds: float = Field(
        5.0,
        description="the most time between the memory or conversation worker committing a "
        "batch (which seals it) and the deletion of "
        "its raw input records (memory.events, conversation.events) with DeleteRecords; "
        "0: never trim (retention alone then bounds the raw plaintext window)",
    )
    compaction_roll_check_seconds: float = Field(
        60.0,
        description="how often the deletion worker checks memory.current for a quiet "
        "partition whose active segment must be rolled so that compaction can reach it",
    )
    # -- end of topic lifetimes
    monitor_interval_seconds: float = Field(
        5.0, description="how often the monitor worker measures consumer lag"
    )
    audit_interval_seconds: float = Field(
        60.0, description="how often the monitor worker audits every derived store for ghosts"
    )
    cache_ttl_seconds: int = Field(300, description="lifetime of recall and context cache entries")
    cache_namespace: str = Field("memproj", description="prefix of every Redis key memproj writes")
    embedder: EmbedderKind = Field(
        "wordllama",
        description="the vector store's embedder: wordllama (the l2_supercat sentence-embedding "
        "model, 256 dimensions, weights in the wheel, loaded offline) or hashing (words and "
        "word pairs hashed, no dependency; finds shared words, not meaning). Vectors record "
        "their model: after a change, stop the embeddings worker and rebuild them with "
        "`memproj replay embeddings`",
    )
    embedding_dim: int = Field(
        256, description="dimensions of the hashing embedder (wordllama's are its model's: 256)"
    )
    metrics_host: str = Field("127.0.0.1", description="address the /metrics endpoint binds")
    metrics_port: int | None = Field(
        None,
        description="port of the worker's /metrics endpoint; unset: the kind's own port "
        "(memory 9101), 0: disabled",
    )
    # -- probes and shutdown (/healthz, /readyz, graceful SIGTERM)
    shutdown_timeout_seconds: float = Field(
        30.0,
        description="the most a worker's stop takes after SIGTERM: the batch in progress "
        "finishes or is rolled back, offsets are committed and the group left; past it the "
        "process exits (Kubernetes' terminationGracePeriodSeconds must be longer)",
    )
    probe_stale_seconds: float = Field(
        5.0,
        description="/healthz fails when the event loop has not ticked its one-second "
        "heartbeat for this long",
    )
    probe_database_timeout_seconds: float = Field(
        2.0,
        description="how long /readyz waits for PostgreSQL to answer SELECT 1 (whole "
        "seconds, at least 2)",
    )
    # -- end of probes and shutdown
    # -- the HTTP API (memproj serve)
    api_host: str = Field("127.0.0.1", description="address memproj serve binds")
    api_port: int = Field(8080, description="port memproj serve listens on (0: any free port)")
    api_rate_limit: str = Field(
        "1200/minute",
        description="requests one API key may make, a moving window in the limits library's "
        "notation ('100/second', '1200/minute', '10 per 1 second'); past it 429 with Retry-After",
    )
    api_login_rate_limit: str = Field(
        "60/minute",
        description="failed authentications (a missing, unknown or revoked key) one client "
        "address may make, a moving window; past it every request from that address is "
        "429 with Retry-After, before its key is looked up",
    )
    api_rate_limit_storage: Literal["memory", "redis"] = Field(
        "memory",
        description="where the rate limits' windows are kept: 'memory', per process; 'redis' "
        "(MEMPROJ_REDIS_URL), shared by every replica of the API",
    )
    api_max_body_bytes: int = Field(
        262144, description="largest request body the API reads; a larger one is refused (413)"
    )
    api_max_head_bytes: int = Field(
        65536,
        ge=1024,
        description="longest request line, and longest head (request line and headers), the "
        "API reads; past it 414 (the line) or 431 (the head)",
    )
    api_delivery_timeout_seconds: float = Field(
        30.0,
        gt=0,
        description="how long a proposal or deletion request waits for Kafka to take it; past "
        "it the answer is 503 and nothing is recorded (the client retries)",
    )
    api_audit_retention_seconds: float = Field(
        90 * 24 * 3600.0,
        description="read audit rows (api_read_audit) older than this are deleted by the "
        "deletion worker's maintenance; 0: kept forever",
    )
    # -- end of the HTTP API
    log_level: str = Field("info", description="worker log level")
    # -- secrets and master keys (SecretStr, *_FILE, rotation) ---------------------------------
    environment: Literal["production", "local"] = Field(
        "production",
        description="'local' (development: ops/stack env, the demo, the tests) lets workers use "
        "the published development master key; 'production' refuses it",
    )
    master_key: SecretStr = Field(
        SecretStr(DEVELOPMENT_MASTER_KEY),
        description="base64 of the 32-byte key that wraps every data key (crypto-shredding), "
        "id 'default'. The default is the published development key, refused unless "
        "MEMPROJ_ENVIRONMENT=local",
    )
    master_key_file: Path | None = Field(
        None, description="a file holding MEMPROJ_MASTER_KEY (a mounted secret)"
    )
    master_keys: SecretStr | None = Field(
        None,
        description="several master keys for a rotation, newest first: 'id:base64' entries "
        "separated by commas or newlines (e.g. 'k2:...,default:...'); the newest wraps new "
        "keys, each opens what it wrapped. Replaces MEMPROJ_MASTER_KEY (set one of them)",
    )
    master_keys_file: Path | None = Field(
        None, description="a file holding MEMPROJ_MASTER_KEYS (a mounted secret)"
    )
    postgres_password: SecretStr | None = Field(
        None, description="the PostgreSQL password, merged into MEMPROJ_POSTGRES_DSN"
    )
    postgres_password_file: Path | None = Field(
        None, description="a file holding MEMPROJ_POSTGRES_PASSWORD (a mounted secret)"
    )
    # -- end of secrets and master keys
    projection_source: Literal["raw", "sealed"] = Field(
        "raw",
        description="what the memory and conversation workers read: 'raw', their raw input "
        "topic, sealed and projected in one stage (the sealed log is one of their outputs); "
        "'sealed', the sealed log another deployment's workers write, projected only (a "
        "second projection of the same data, in its own schema)",
    )
    failpoint: str = Field(
        "",
        description="testing aid: '<projection>:after_commit' kills the worker (SIGKILL) right "
        "after that projection commits a batch and before it publishes the outbox",
    )

    @property
    def kafka(self) -> KafkaCluster:
        """The one client configuration every Kafka client memproj builds starts from. Not
        cached: ``model_copy(update=...)`` would copy a cached value along with the old
        settings; callers take it once, when they build their clients."""
        security = KafkaSecurity(
            protocol=self.kafka_security_protocol,
            mechanism=self.kafka_sasl_mechanism,
            username=self.kafka_username,
            password=self.kafka_password,
            ca_file=self.kafka_ca_file,
            cert_file=self.kafka_cert_file,
            key_file=self.kafka_key_file,
            check_hostname=self.kafka_check_hostname,
        )
        return KafkaCluster(self.kafka_bootstrap, security)

    # -- secrets and master keys --------------------------------------------------------------
    @model_validator(mode="before")
    @classmethod
    def _read_secrets(cls, data: Any) -> Any:
        """Each ``<secret>_FILE`` read into its setting (and cleared: the value is the
        setting, whatever its source); the DSN's password moved to its own secret."""
        if not isinstance(data, dict):
            return data
        # An empty secret is an unset one (MEMPROJ_MASTER_KEY= in a shell or a manifest).
        data = {k: v for k, v in data.items() if not (k in SECRET_FILE_SETTINGS and v == "")}
        for name in SECRET_FILE_SETTINGS:
            path = data.pop(f"{name}_file", None)
            if path is None or path == "":
                continue
            if data.get(name) is not None:
                upper = name.upper()
                raise ValueError(f"set MEMPROJ_{upper} or MEMPROJ_{upper}_FILE, not both")
            data[name] = read_secret_file(name, path)
        if data.get("master_key") is not None and data.get("master_keys") is not None:
            raise ValueError("set MEMPROJ_MASTER_KEY or MEMPROJ_MASTER_KEYS, not both")
        given = "postgres_dsn" in data
        dsn = data.get("postgres_dsn", cls.model_fields["postgres_dsn"].default)
        if isinstance(dsn, str):
            data["postgres_dsn"], password = split_dsn_password(dsn)
            if password is not None:
                if data.get("postgres_password") is None:
                    data["postgres_password"] = password
                elif given:
                    raise ValueError(
                        "MEMPROJ_POSTGRES_DSN holds a password and MEMPROJ_POSTGRES_PASSWORD is"
                        " set: give it once"
                    )
        return data

    @model_validator(mode="after")
    def _check_master_keys(self) -> Settings:
        _ = self.master_keyring  # a malformed key fails at start, naming the setting only
        return self

    @model_validator(mode="after")
    def _check_topic_replication(self) -> Settings:
        _ = self.topic_replication  # more in-sync replicas than replicas fails at start
        return self

    @property
    def master_keyring(self) -> MasterKeys:
        """Every configured master key by id, newest first (MEMPROJ_MASTER_KEY alone: id
        'default'). Not cached: ``model_copy(update=...)`` would copy a stale one."""
        if self.master_keys is not None:
            return parse_master_keys(self.master_keys)
        return MasterKeys.single(parse_master_key(self.master_key))

    @property
    def uses_development_key(self) -> bool:
        return parse_master_key(DEVELOPMENT_MASTER_KEY) in self.master_keyring

    def worker_master_keys(self) -> MasterKeys:
        """The master keys a worker or command may use: the published development key only in
        local development."""
        if self.uses_development_key and self.environment != "local":
            raise DevelopmentKeyRefused(
                "the master key is the published development key (MEMPROJ_MASTER_KEY unset?):"
                " set your own (MEMPROJ_MASTER_KEY or MEMPROJ_MASTER_KEY_FILE), or"
                " MEMPROJ_ENVIRONMENT=local for local development"
            )
        return self.master_keyring

    @property
    def postgres_conninfo(self) -> str:
        """The connection string to connect with: the DSN and the password. Never print it."""
        if self.postgres_password is None:
            return self.postgres_dsn
        return make_conninfo(self.postgres_dsn, password=self.postgres_password.get_secret_value())

    def as_environment(self) -> dict[str, str]:
        """The settings as a child process's ``MEMPROJ_*`` environment, secrets as their values
        (the child needs them: never print it). A key list replaces the single key: the
        single one is given empty (unset), whatever the parent's environment holds."""
        environment = {
            f"MEMPROJ_{name.upper()}": (
                value.get_secret_value() if isinstance(value, SecretStr) else str(value)
            )
            for name, value in self.model_dump().items()
            if value is not None
        }
        if self.master_keys is not None:
            environment["MEMPROJ_MASTER_KEY"] = ""
        return environment

    # -- end of secrets and master keys

    @property
    def topics(self) -> TopicNames:
        return TopicNames(self.topic_prefix)

    @property
    def topic_replication(self) -> TopicReplication:
        return TopicReplication(self.topic_replication_factor, self.topic_min_insync_replicas)

    @property
    def batch_limits(self) -> BatchLimits:
        return BatchLimits(self.batch_max_events, self.batch_max_wait_seconds, self.batch_max_bytes)

    def group_consumer(
        self, worker: str, inputs: Sequence[TopicSpec] = ()
    ) -> GroupConsumerSettings:
        """The consumer group settings of a worker kind's batch consumer of ``inputs``."""
        limits = self.batch_limits
        latency_bound = bool(inputs) and all(s.base_name in LATENCY_BOUND_INPUTS for s in inputs)
        if worker in PROJECTION_KINDS or latency_bound:
            limits = dataclasses.replace(
                limits, max_wait_seconds=self.projection_batch_max_wait_seconds
            )
        return GroupConsumerSettings(
            self.group_id(worker),
            limits,
            self.kafka_session_timeout_seconds,
            self.rebalance_drain_seconds,
        )

    @property
    def breaker(self) -> BreakerSettings:
        return BreakerSettings(
            self.breaker_failure_ratio, self.breaker_min_failures, self.breaker_window
        )

    @property
    def embedder_identity(self) -> EmbedderIdentity:
        """The model the vector store must hold, named without loading it."""
        return embedder_identity(self.embedder, self.embedding_dim)

    @property
    def vector_store_path(self) -> Path:
        return self.data_dir / "lancedb"

    @property
    def api_audit_retention(self) -> timedelta | None:
        """How long the API's read audit is kept (None: forever)."""
        seconds = self.api_audit_retention_seconds
        return timedelta(seconds=seconds) if seconds > 0 else None

    @property
    def retention_default(self) -> timedelta | None:
        """The deployment's default retention period (None: kept)."""
        seconds = self.retention_default_seconds
        return timedelta(seconds=seconds) if seconds > 0 else None

    @property
    def key_lookups(self) -> KeyLookups:
        return KeyLookups(per_tenant=self.lookups_per_tenant)

    @property
    def context(self) -> ContextSettings:
        return ContextSettings(self.context_budget_tokens, self.context_tool_result_max_chars)

    def group_id(self, worker: str) -> str:
        return f"{self.group_prefix}-{worker}"


# The settings reference (docs/settings.md, ``memproj deploy settings-doc``) groups the settings
# in the order they are declared: each group runs from its first setting, named here, to the
# next group's first.
SETTING_GROUPS: dict[str, str] = {
    "kafka_bootstrap": "Kafka",
    "kafka_security_protocol": "Kafka client security",
    "topic_prefix": "Topics and consumer groups",
    "postgres_dsn": "PostgreSQL, Redis and local state",
    "max_memory_value_bytes": "Batches",
    "breaker_failure_ratio": "The circuit breaker",
    "context_budget_tokens": "The context view",
    "deletion_deadline_seconds": "Deletion",
    "retention_default_seconds": "Retention",
    "raw_input_trim_seconds": "Topic lifetimes",
    "monitor_interval_seconds": "The monitor",
    "cache_ttl_seconds": "The cache",
    "embedder": "The embedder",
    "metrics_host": "Metrics",
    "shutdown_timeout_seconds": "Probes and shutdown",
    "api_host": "The HTTP API",
    "log_level": "Logs",
    "environment": "Secrets and master keys",
    "projection_source": "What the projections read",
    "failpoint": "Testing",
}
