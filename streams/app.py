"""The Faust app factory: one app (and consumer group) per worker kind that still consumes
through faust (``streams.worker.BATCH_CONSUMER_KINDS`` do not), built on demand."""

from __future__ import annotations

import faust

from streams import transport
from streams.settings import Settings


def build_app(settings: Settings, worker: str) -> faust.App:
    datadir = settings.data_dir / "faust" / worker
    datadir.mkdir(parents=True, exist_ok=True)
    app = faust.App(
        settings.group_id(worker),
        broker=f"kafka://{settings.kafka_bootstrap}",
        # TLS/SASL of faust's aiokafka clients: the same security as every other client.
        broker_credentials=settings.kafka.faust_credentials(),
        # Agents take the raw bytes: the contract codec decodes them, so that a bad message
        # becomes a dead letter with a reason instead of a faust deserialisation crash.
        key_serializer="raw",
        value_serializer="raw",
        # Topics are created from the registry by ``memproj topics create``, never implicitly.
        topic_allow_declare=False,
        topic_disable_leader=True,
        web_enabled=False,
        autodiscover=False,
        datadir=str(datadir),
        consumer_auto_offset_reset="earliest",
        broker_commit_interval=1.0,
        # A killed worker's partitions move to the others after this, not faust's 60 s.
        broker_session_timeout=settings.kafka_session_timeout_seconds,
        broker_heartbeat_interval=min(3.0, settings.kafka_session_timeout_seconds / 3),
        broker_max_poll_records=settings.batch_max_events,
        stream_buffer_maxsize=settings.batch_max_events * 4,
        # Acknowledgement is the agents' job, after the batch is committed and published.
        stream_ack_exceptions=False,
        stream_ack_cancelled_tasks=False,
        # Do not wait for in-flight events at stop or rebalance: they were not acknowledged,
        # so they are redelivered, and the tracking offsets in PostgreSQL make that harmless.
        # (Waiting would hang forever after an agent crash left events unacknowledged.)
        stream_wait_empty=False,
    )
    transport.install(app)
    return app
