-- The latest reconciliation audit per derived store: deleted items found still readable.
CREATE TABLE ghost_audits (
    store       text        PRIMARY KEY,
    ghost_items integer     NOT NULL,
    examples    jsonb       NOT NULL,
    audited_at  timestamptz NOT NULL
);
