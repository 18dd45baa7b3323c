-- A deletion requested through the API with an Idempotency-Key: the key's first request is
-- the one published; a retry with the same key and the same body gets the same deletion id
-- back and publishes nothing. Ids and a digest of the body only, never content.
CREATE TABLE api_deletion_requests (
    tenant_id       text        NOT NULL,
    key_id          text        NOT NULL,
    idempotency_key text        NOT NULL,
    body_digest     bytea       NOT NULL,
    deletion_id     text        NOT NULL,
    requested_at    timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, key_id, idempotency_key)
);
