-- Dead letters hold no plaintext: each letter's original is sealed under a data key of its
-- own, kept here wrapped by the master key, with the letter's owner as far as it could be read.
-- An erasure of that owner destroys the key (wrapped_key NULL, the owner's ids cleared); the
-- deletion worker deletes every row at expires_at, the end of the DLQ topics' retention.

CREATE TABLE dead_letter_keys (
    key_id          uuid        PRIMARY KEY,
    wrapped_key     bytea,
    -- Where the message came from (what the letter is about, for diagnosis).
    topic           text        NOT NULL,
    "partition"     integer     NOT NULL,
    "offset"        bigint      NOT NULL,
    -- The owner, best effort: read from the message's JSON and key; NULL where unreadable.
    tenant_id       text,
    subject_type    text,
    subject_id      text,
    memory_id       text,
    conversation_id text,
    -- The original key when it could be a contract key: an erasure of "<tenant>:<id>" reaches
    -- a letter keyed by it whatever its value held.
    message_key     text,
    failed_at       timestamptz NOT NULL,
    expires_at      timestamptz NOT NULL,
    erased_by       text,
    erased_at       timestamptz,
    CHECK (wrapped_key IS NOT NULL OR erased_by IS NOT NULL)
);
CREATE INDEX dead_letter_keys_expiry ON dead_letter_keys (expires_at);
CREATE INDEX dead_letter_keys_subject ON dead_letter_keys (tenant_id, subject_type, subject_id)
    WHERE wrapped_key IS NOT NULL;
CREATE INDEX dead_letter_keys_memory ON dead_letter_keys (tenant_id, memory_id)
    WHERE wrapped_key IS NOT NULL;
CREATE INDEX dead_letter_keys_conversation ON dead_letter_keys (tenant_id, conversation_id)
    WHERE wrapped_key IS NOT NULL;
CREATE INDEX dead_letter_keys_message_key ON dead_letter_keys (message_key)
    WHERE wrapped_key IS NOT NULL;
