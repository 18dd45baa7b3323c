-- The HTTP API's access control: API keys, the purpose policy, the read audit, and
-- the proposals accepted once. Nothing here holds memory or message content.

-- A key is `mpk_<key_id>_<secret>`: only the SHA-256 of the secret is stored.
CREATE TABLE api_keys (
    key_id        text        PRIMARY KEY,
    tenant_id     text        NOT NULL,
    actor         text        NOT NULL,
    purposes      text[]      NOT NULL,
    secret_sha256 bytea       NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    revoked_at    timestamptz
);
CREATE INDEX api_keys_by_tenant ON api_keys (tenant_id);

-- What a purpose may read, per tenant: memories of these kinds and scopes ('*': any), and
-- (conversations) the tenant's messages, summaries and context views. A purpose without a row
-- reads nothing.
CREATE TABLE api_purposes (
    tenant_id     text        NOT NULL,
    purpose       text        NOT NULL,
    kinds         text[]      NOT NULL DEFAULT '{}',
    scopes        text[]      NOT NULL DEFAULT '{}',
    conversations boolean     NOT NULL DEFAULT false,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, purpose)
);

-- One row per read: the policy decision, by ids only. Trimmed past MEMPROJ_API_AUDIT_RETENTION_SECONDS.
CREATE TABLE api_read_audit (
    id           bigserial   PRIMARY KEY,
    at           timestamptz NOT NULL,
    key_id       text        NOT NULL,
    tenant_id    text        NOT NULL,
    actor        text        NOT NULL,
    purpose      text        NOT NULL,
    route        text        NOT NULL,
    subject      text,
    returned_ids text[]      NOT NULL DEFAULT '{}',
    filtered_ids text[]      NOT NULL DEFAULT '{}',
    decision     text        NOT NULL
);
CREATE INDEX api_read_audit_by_at ON api_read_audit (at);
CREATE INDEX api_read_audit_by_key ON api_read_audit (tenant_id, key_id, at);

-- A proposal (memory or conversation event) accepted through the API, once per event id.
CREATE TABLE api_proposals (
    tenant_id   text        NOT NULL,
    event_id    text        NOT NULL,
    accepted_at timestamptz NOT NULL,
    topic       text        NOT NULL,
    PRIMARY KEY (tenant_id, event_id)
);
