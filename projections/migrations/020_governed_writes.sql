-- Governed writes: admission policies by version, versions held for review, the policy version
-- each version was decided under, and the memories whose cited evidence was erased later.

-- A tenant's admission policy, one row per version, never updated: an event is decided under
-- the version stamped on it when it was sealed, by every rebuild. Clearing a policy is a new
-- version without rules. Owned by projections/admission/store.py.
CREATE TABLE admission_policies (
    tenant_id  text        NOT NULL,
    version    integer     NOT NULL CHECK (version >= 1),
    rules      jsonb       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    created_by text        NOT NULL,
    PRIMARY KEY (tenant_id, version)
);

-- A memory's row is its served version; when its latest version (the head) is held for review
-- or was rejected above a served one, the head's version and status are named here and its
-- content is in memory_versions.
ALTER TABLE memories DROP CONSTRAINT memories_status_check;
ALTER TABLE memories ADD CONSTRAINT memories_status_check
    CHECK (status IN ('proposed', 'verified', 'revoked', 'erased', 'pending_review', 'rejected'));
ALTER TABLE memories ADD COLUMN head_version integer;
ALTER TABLE memories ADD COLUMN head_status text
    CHECK (head_status IN ('pending_review', 'rejected'));
CREATE INDEX memories_held ON memories (tenant_id) WHERE head_status = 'pending_review'
    OR status = 'pending_review';

ALTER TABLE memory_versions ADD COLUMN policy_version integer NOT NULL DEFAULT 0;
ALTER TABLE memory_versions ADD COLUMN review_rule text;

-- The sealer's evidence look-ups, by the cited event ids.
CREATE INDEX conversation_messages_by_event ON conversation_messages (tenant_id, event_id);
CREATE INDEX memory_versions_by_event ON memory_versions (tenant_id, event_id);

-- Memories that cited evidence an erasure removed afterwards: flagged, not silently kept as
-- they were. Owned by projections/admission/flags.py.
CREATE TABLE memory_evidence_flags (
    tenant_id   text        NOT NULL,
    memory_id   text        NOT NULL,
    event_id    text        NOT NULL,
    deletion_id text        NOT NULL,
    flagged_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, memory_id, event_id)
);
-- Which memories cite an erased event.
CREATE INDEX memories_by_evidence ON memories USING gin (evidence_event_ids);
