-- Retention: the classes' periods per tenant, legal holds, the deletions the retention
-- scheduler issued, and each conversation's last message time (its period runs from it).

ALTER TABLE conversations ADD COLUMN last_message_at timestamptz;
UPDATE conversations c SET last_message_at = m.last_message_at
  FROM (SELECT tenant_id, conversation_id, max(occurred_at) AS last_message_at
          FROM conversation_messages GROUP BY tenant_id, conversation_id) m
 WHERE m.tenant_id = c.tenant_id AND m.conversation_id = c.conversation_id;
CREATE INDEX conversations_by_retention_class ON conversations (tenant_id, retention_class);
CREATE INDEX memories_expiring ON memories (expires_at) WHERE expires_at IS NOT NULL;

-- A class's period after the conversation's last message; NULL period: kept ("keep").
-- The class '*' is the tenant's default for classes it does not name.
CREATE TABLE retention_classes (
    tenant_id       text        NOT NULL,
    retention_class text        NOT NULL,
    period_seconds  bigint      CHECK (period_seconds IS NULL OR period_seconds >= 0),
    updated_at      timestamptz NOT NULL,
    updated_by      text        NOT NULL,
    PRIMARY KEY (tenant_id, retention_class)
);

-- Legal holds: never deleted, a release is a time, so that a rebuild of the ledger decides
-- every request under the holds in force when it occurred.
CREATE TABLE legal_holds (
    tenant_id    text        NOT NULL,
    hold_id      text        NOT NULL,
    target_type  text        NOT NULL CHECK (target_type IN ('subject', 'conversation')),
    subject_type text        NOT NULL DEFAULT '',
    target_id    text        NOT NULL,
    reason       text        NOT NULL,
    held_by      text        NOT NULL,
    held_at      timestamptz NOT NULL,
    released_by  text,
    released_at  timestamptz,
    PRIMARY KEY (tenant_id, hold_id)
);
CREATE INDEX legal_holds_by_target ON legal_holds (tenant_id, target_type, subject_type, target_id);

-- Every deletion the scheduler issued (the schedule's memory: a replica that lost the race
-- finds the row and publishes nothing).
CREATE TABLE retention_issued (
    tenant_id       text        NOT NULL,
    deletion_id     text        NOT NULL,
    reason          text        NOT NULL CHECK (reason IN ('retention', 'expired')),
    target_type     text        NOT NULL CHECK (target_type IN ('conversation', 'memory')),
    target_id       text        NOT NULL,
    retention_class text,
    due_at          timestamptz NOT NULL,
    requested_at    timestamptz NOT NULL,
    issued_at       timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, deletion_id)
);
CREATE INDEX retention_issued_by_target ON retention_issued (tenant_id, target_type, target_id);

-- A retention erasure covers a conversation's content only: its own erasure index entry, which
-- covers the conversation's rows and not the memories whose source points into it.
ALTER TABLE erased_entities DROP CONSTRAINT erased_entities_entity_type_check;
ALTER TABLE erased_entities ADD CONSTRAINT erased_entities_entity_type_check
    CHECK (entity_type IN ('subject', 'conversation', 'conversation_content', 'memory'));

-- The source key of a conversation (seal format 4): it seals, with a memory's key, the values
-- taken from the conversation, and only a full erasure of the conversation destroys it.
ALTER TABLE entity_keys DROP CONSTRAINT entity_keys_entity_type_check;
ALTER TABLE entity_keys ADD CONSTRAINT entity_keys_entity_type_check
    CHECK (entity_type IN ('memory', 'conversation', 'conversation_source'));
