"""Configuration: environment variables ``MEMPROJ_*`` with documented defaults.

Built once by the CLI and passed to whatever needs it; nothing reads the environment at import
time. The defaults match the local stack started by ``ops/stack up``.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from projections.conversation.context import ContextSettings
from streams.loop import BatchLimits, BreakerSettings
from topics.registry import TopicNames


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MEMPROJ_", frozen=True, extra="ignore")

    kafka_bootstrap: str = Field(
        "127.0.0.1:9092", description="Kafka bootstrap servers (host:port, comma separated)"
    )
    topic_prefix: str = Field("", description="prefix for every topic name, e.g. 'staging.'")
    group_prefix: str = Field(
        "memproj", description="prefix of consumer group ids (one group per worker)"
    )
    kafka_session_timeout_seconds: float = Field(
        10.0,
        description="a worker that stops heartbeating is replaced in its group after this long",
    )
    postgres_dsn: str = Field(
        "postgresql://memproj:memproj@127.0.0.1:55432/memproj",
        description="PostgreSQL connection string for projections and the ledger",
    )
    postgres_pool_size: int = Field(4, description="connections per worker process")
    redis_url: str = Field("redis://127.0.0.1:56379/0", description="Redis for the cache store")
    data_dir: Path = Field(
        Path(".stack/data"), description="worker-local state (vector store, faust data)"
    )
    max_memory_value_bytes: int = Field(
        65536, description="largest accepted memory value, in bytes of JSON"
    )
    batch_max_events: int = Field(2000, description="most events applied in one transaction")
    batch_max_wait_seconds: float = Field(
        0.25, description="longest a partial batch waits before it is applied"
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
        3600.0, description="a deletion's deadline when the request names none (its SLO)"
    )
    deletion_redelivery_seconds: float = Field(
        30.0, description="an overdue tombstone is redelivered to its store this often"
    )
    deletion_check_interval_seconds: float = Field(
        1.0, description="how often the deletion worker checks deadlines and verifications"
    )
    rebuild_grace_seconds: float = Field(
        7 * 24 * 3600.0,
        description="rebuild shadows (replay_*) and retired tables (retired_*) are dropped "
        "this long after they were created; until then every erasure reaches them too",
    )
    # -- topic lifetimes (issue 15: raw input trimmed once sealed, memory.current compaction)
    raw_input_trim_seconds: float = Field(
        5.0,
        description="the most time between the sealer committing a batch and the deletion of "
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
    embedding_dim: int = Field(256, description="dimensions of the default hashing embedder")
    metrics_host: str = Field("127.0.0.1", description="address the /metrics endpoint binds")
    metrics_port: int | None = Field(
        None,
        description="port of the worker's /metrics endpoint; unset: the kind's own port "
        "(memory 9101), 0: disabled",
    )
    log_level: str = Field("info", description="worker log level")
    master_key: str = Field(
        "bWVtcHJvai1kZXZlbG9wbWVudC1vbmx5LWtleS0wMDE=",
        description="base64 of the 32-byte key that wraps every data key (crypto-shredding). "
        "The default is for local development only: set your own everywhere else",
    )
    failpoint: str = Field(
        "",
        description="testing aid: '<projection>:after_commit' kills the worker (SIGKILL) right "
        "after that projection commits a batch and before it publishes the outbox",
    )

    @property
    def topics(self) -> TopicNames:
        return TopicNames(self.topic_prefix)

    @property
    def batch_limits(self) -> BatchLimits:
        return BatchLimits(self.batch_max_events, self.batch_max_wait_seconds, self.batch_max_bytes)

    @property
    def breaker(self) -> BreakerSettings:
        return BreakerSettings(
            self.breaker_failure_ratio, self.breaker_min_failures, self.breaker_window
        )

    @property
    def vector_store_path(self) -> Path:
        return self.data_dir / "lancedb"

    @property
    def context(self) -> ContextSettings:
        return ContextSettings(self.context_budget_tokens, self.context_tool_result_max_chars)

    def group_id(self, worker: str) -> str:
        return f"{self.group_prefix}-{worker}"
