-- The conversation projection: conversations, messages (redacted), summaries with their
-- sources, and the context view. Rows carry the owner (the subject) for the deletion ledger.

CREATE TABLE conversations (
    tenant_id                 text        NOT NULL,
    conversation_id           text        NOT NULL,
    owner_type                text        NOT NULL,
    owner_id                  text        NOT NULL,
    channel                   text        NOT NULL,
    retention_class           text        NOT NULL,
    provider_conversation_ref text,
    started_at                timestamptz NOT NULL,
    updated_at                timestamptz NOT NULL,
    last_event_id             text        NOT NULL,
    message_count             integer     NOT NULL,
    summary_version           integer     NOT NULL,
    PRIMARY KEY (tenant_id, conversation_id)
);
CREATE INDEX conversations_by_owner ON conversations (tenant_id, owner_type, owner_id);

CREATE TABLE conversation_messages (
    tenant_id       text        NOT NULL,
    conversation_id text        NOT NULL,
    message_id      text        NOT NULL,
    seq             integer     NOT NULL,
    role            text        NOT NULL CHECK (role IN ('user', 'assistant')),
    content         jsonb       NOT NULL,
    occurred_at     timestamptz NOT NULL,
    event_id        text        NOT NULL,
    redactions      jsonb       NOT NULL,
    owner_type      text        NOT NULL,
    owner_id        text        NOT NULL,
    PRIMARY KEY (tenant_id, conversation_id, message_id),
    UNIQUE (tenant_id, conversation_id, seq)
);
CREATE INDEX conversation_messages_by_owner ON conversation_messages (tenant_id, owner_type, owner_id);

CREATE TABLE conversation_summaries (
    tenant_id          text        NOT NULL,
    conversation_id    text        NOT NULL,
    summary_version    integer     NOT NULL,
    text               text        NOT NULL,
    source_message_ids text[]      NOT NULL,
    occurred_at        timestamptz NOT NULL,
    event_id           text        NOT NULL,
    redactions         jsonb       NOT NULL,
    owner_type         text        NOT NULL,
    owner_id           text        NOT NULL,
    PRIMARY KEY (tenant_id, conversation_id, summary_version)
);
CREATE INDEX conversation_summaries_by_owner ON conversation_summaries (tenant_id, owner_type, owner_id);

-- Derived from the messages and the latest summary after every batch; never the source of
-- anything, so it can be dropped and rebuilt at will.
CREATE TABLE conversation_context (
    tenant_id          text        NOT NULL,
    conversation_id    text        NOT NULL,
    owner_type         text        NOT NULL,
    owner_id           text        NOT NULL,
    view               jsonb       NOT NULL,
    token_estimate     integer     NOT NULL,
    budget_tokens      integer     NOT NULL,
    through_message_id text,
    built_at           timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, conversation_id)
);
CREATE INDEX conversation_context_by_owner ON conversation_context (tenant_id, owner_type, owner_id);

-- A memory whose source is a message ("<conversation_id>/<message_id>") can be found from
-- its conversation, so that deleting the conversation reaches the memories derived from it.
ALTER TABLE memories ADD COLUMN source_conversation_id text GENERATED ALWAYS AS (
    CASE WHEN source_type = 'message' AND strpos(source_ref, '/') > 0
         THEN split_part(source_ref, '/', 1) END
) STORED;
CREATE INDEX memories_by_source_conversation ON memories (tenant_id, source_conversation_id);
ALTER TABLE memory_versions ADD COLUMN source_conversation_id text GENERATED ALWAYS AS (
    CASE WHEN source_type = 'message' AND strpos(source_ref, '/') > 0
         THEN split_part(source_ref, '/', 1) END
) STORED;
CREATE INDEX memory_versions_by_source_conversation ON memory_versions (tenant_id, source_conversation_id);
