-- A deletion's second milestone, purged: no copy of what it erased is left anywhere memproj
-- writes (the compacted topic rewritten past the null, raw input trimmed past the request,
-- dead tuples vacuumed, each derived store's copies purged). One row per place a copy can
-- remain (projections.deletion.purge), written when the deletion is completed; the request's
-- purged_at once every place is purged. Ids, offsets and transaction ids only.
-- purge_due_at: when the places' rows were written (the deletion's completion, seen by the
-- purge duty).
ALTER TABLE deletion_requests ADD COLUMN purge_due_at timestamptz,
                              ADD COLUMN purged_at timestamptz;
CREATE INDEX deletion_requests_unpurged ON deletion_requests (completed_at)
    WHERE status = 'completed' AND purged_at IS NULL;

CREATE TABLE deletion_purges (
    tenant_id   text        NOT NULL,
    deletion_id text        NOT NULL,
    place       text        NOT NULL,
    -- What the place's check noted when the deletion became due: a transaction horizon to
    -- pass, the offsets raw input must be trimmed past.
    mark        jsonb       NOT NULL,
    due_at      timestamptz NOT NULL,
    purged_at   timestamptz,
    PRIMARY KEY (tenant_id, deletion_id, place)
);
CREATE INDEX deletion_purges_open ON deletion_purges (place, due_at) WHERE purged_at IS NULL;
