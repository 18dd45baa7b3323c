-- The memory projection, its history, and the bookkeeping every projection shares.
-- Every row that holds personal data carries tenant, subject and source ids, so that the
-- deletion ledger can find every copy of an item.

CREATE TABLE memories (
    tenant_id          text        NOT NULL,
    memory_id          text        NOT NULL,
    subject_type       text        NOT NULL,
    subject_id         text        NOT NULL,
    scope              text        NOT NULL,
    kind               text        NOT NULL,
    value              jsonb       NOT NULL,
    source_type        text        NOT NULL,
    source_ref         text        NOT NULL,
    status             text        NOT NULL CHECK (status IN ('proposed', 'verified', 'revoked')),
    version            integer     NOT NULL,
    observed_at        timestamptz NOT NULL,
    expires_at         timestamptz,
    verification       text,
    evidence_event_ids text[]      NOT NULL DEFAULT '{}',
    created_at         timestamptz NOT NULL,
    updated_at         timestamptz NOT NULL,
    last_event_id      text        NOT NULL,
    revoked_reason     text,
    PRIMARY KEY (tenant_id, memory_id)
);
CREATE INDEX memories_by_subject ON memories (tenant_id, subject_type, subject_id);
CREATE INDEX memories_by_source ON memories (tenant_id, source_type, source_ref);

-- One row per version; version N is superseded by N + 1 when it exists.
CREATE TABLE memory_versions (
    tenant_id          text        NOT NULL,
    memory_id          text        NOT NULL,
    version            integer     NOT NULL,
    subject_type       text        NOT NULL,
    subject_id         text        NOT NULL,
    scope              text        NOT NULL,
    kind               text        NOT NULL,
    value              jsonb       NOT NULL,
    source_type        text        NOT NULL,
    source_ref         text        NOT NULL,
    status             text        NOT NULL,
    observed_at        timestamptz NOT NULL,
    expires_at         timestamptz,
    verification       text,
    evidence_event_ids text[]      NOT NULL DEFAULT '{}',
    revoked_reason     text,
    event_id           text        NOT NULL,
    event_type         text        NOT NULL,
    occurred_at        timestamptz NOT NULL,
    actor_type         text        NOT NULL,
    actor_id           text        NOT NULL,
    PRIMARY KEY (tenant_id, memory_id, version)
);
CREATE INDEX memory_versions_by_subject ON memory_versions (tenant_id, subject_type, subject_id);

-- Idempotency: every event a projection has decided on (applied or refused), by event_id.
CREATE TABLE processed_events (
    projection text  NOT NULL,
    tenant_id  text  NOT NULL,
    event_id   text  NOT NULL,
    body_hash  bytea NOT NULL,
    PRIMARY KEY (projection, tenant_id, event_id)
);

-- Tracking: the next offset to apply per input partition, written in the same transaction
-- as the projection, so a redelivered message is recognised and skipped.
CREATE TABLE projection_offsets (
    projection  text        NOT NULL,
    topic       text        NOT NULL,
    partition   integer     NOT NULL,
    next_offset bigint      NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (projection, topic, partition)
);

-- Refused events, for operators; the same records are published on the rejections topic.
CREATE TABLE rejections (
    id           bigserial   PRIMARY KEY,
    projection   text        NOT NULL,
    tenant_id    text        NOT NULL,
    entity_id    text        NOT NULL,
    subject_type text,
    subject_id   text,
    event_id     text        NOT NULL,
    event_type   text        NOT NULL,
    reason       text        NOT NULL,
    details      text        NOT NULL,
    occurred_at  timestamptz NOT NULL,
    topic        text        NOT NULL,
    partition    integer     NOT NULL,
    "offset"     bigint      NOT NULL,
    recorded_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX rejections_by_tenant ON rejections (tenant_id, entity_id);

-- Transactional outbox: messages decided in a projection transaction, published after it
-- commits and deleted (by batch) once the broker has them. A crash in between republishes them.
CREATE TABLE outbox (
    id         bigserial   PRIMARY KEY,
    producer   text        NOT NULL,
    batch_id   uuid        NOT NULL,
    topic      text        NOT NULL,
    key        bytea,
    value      bytea,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX outbox_by_producer ON outbox (producer, id);
CREATE INDEX outbox_by_batch ON outbox (batch_id);
