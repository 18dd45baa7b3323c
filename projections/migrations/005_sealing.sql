-- Crypto-shredding: one data key per memory and per conversation, wrapped by the master key.
-- A deletion deletes the keys of everything it covers; shredded_keys keeps the fact, not the key.

CREATE TABLE entity_keys (
    tenant_id   text        NOT NULL,
    entity_type text        NOT NULL CHECK (entity_type IN ('memory', 'conversation')),
    entity_id   text        NOT NULL,
    wrapped_key bytea       NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, entity_type, entity_id)
);

CREATE TABLE shredded_keys (
    tenant_id   text        NOT NULL,
    entity_type text        NOT NULL,
    entity_id   text        NOT NULL,
    deletion_id text        NOT NULL,
    shredded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, entity_type, entity_id, deletion_id)
);
