-- The deletion ledger: every request, the items it covers, the stores that must acknowledge
-- it, and the erasure index that keeps erased data from coming back.

CREATE TABLE deletion_requests (
    tenant_id        text        NOT NULL,
    deletion_id      text        NOT NULL,
    kind             text        NOT NULL CHECK (kind IN ('erasure', 'revocation')),
    target_type      text        NOT NULL,
    target_id        text        NOT NULL,
    subject_type     text,
    reason           text        NOT NULL,
    -- The request's occurred_at: events about the target at or before it are erased.
    cut_off          timestamptz NOT NULL,
    recorded_at      timestamptz NOT NULL DEFAULT now(),
    deadline_at      timestamptz NOT NULL,
    required_stores  text[]      NOT NULL,
    status           text        NOT NULL CHECK (status IN ('pending', 'completed')),
    completed_at     timestamptz,
    verification     jsonb,
    verified_at      timestamptz,
    request_event_id text        NOT NULL,
    -- The tombstone as published (ids only, no personal content), for redelivery.
    tombstone        jsonb       NOT NULL,
    PRIMARY KEY (tenant_id, deletion_id)
);
CREATE INDEX deletion_requests_pending ON deletion_requests (status, recorded_at)
    WHERE status = 'pending' OR verified_at IS NULL;

CREATE TABLE deletion_items (
    tenant_id       text NOT NULL,
    deletion_id     text NOT NULL,
    item_type       text NOT NULL,
    item_id         text NOT NULL,
    conversation_id text NOT NULL DEFAULT '',
    PRIMARY KEY (tenant_id, deletion_id, item_type, conversation_id, item_id)
);

-- The erasure index the projections and stores consult: an event about one of these entities
-- that occurred at or before cut_off is refused as "erased".
CREATE TABLE erased_entities (
    tenant_id    text        NOT NULL,
    entity_type  text        NOT NULL CHECK (entity_type IN ('subject', 'conversation', 'memory')),
    subject_type text        NOT NULL DEFAULT '',
    entity_id    text        NOT NULL,
    cut_off      timestamptz NOT NULL,
    deletion_id  text        NOT NULL,
    PRIMARY KEY (tenant_id, entity_type, subject_type, entity_id, deletion_id)
);

CREATE TABLE deletion_store_acks (
    tenant_id           text        NOT NULL,
    deletion_id         text        NOT NULL,
    store               text        NOT NULL,
    status              text        NOT NULL CHECK (status IN ('pending', 'done', 'failed')),
    deadline_at         timestamptz NOT NULL,
    acked_at            timestamptz,
    removed_count       integer,
    attempts            integer     NOT NULL DEFAULT 0,
    redeliveries        integer     NOT NULL DEFAULT 0,
    last_redelivered_at timestamptz,
    error               text,
    PRIMARY KEY (tenant_id, deletion_id, store)
);
CREATE INDEX deletion_store_acks_open ON deletion_store_acks (store, deadline_at)
    WHERE status <> 'done';

-- Vectors of the erased content, kept only until the verification probe has searched the
-- vector store with them (vectors, never text); deleted by the probe.
CREATE TABLE deletion_probes (
    tenant_id   text   NOT NULL,
    deletion_id text   NOT NULL,
    item_type   text   NOT NULL,
    item_id     text   NOT NULL,
    vector      real[] NOT NULL,
    PRIMARY KEY (tenant_id, deletion_id, item_type, item_id)
);

-- Reads refused by the hydration guard, per store, for memproj_ghost_reads_blocked_total.
CREATE TABLE ghost_reads_blocked (
    store   text   PRIMARY KEY,
    blocked bigint NOT NULL
);
