-- The schemas rebuilds create beside the live one: a shadow (``replay_*``) until it is swapped
-- in or abandoned, then the retired tables (``retired_*``) it replaced. Registered so that
-- erasures, the verification probe and the ghost audit reach their copies, and so that they
-- are dropped after a grace period instead of being kept forever.
CREATE TABLE rebuild_schemas (
    schema_name text        PRIMARY KEY,
    projection  text        NOT NULL,
    role        text        NOT NULL CHECK (role IN ('shadow', 'retired')),
    created_at  timestamptz NOT NULL DEFAULT now()
);
