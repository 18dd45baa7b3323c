-- Integrity of the sealing: unambiguous key wrapping, and probes nobody without the
-- master key can test a guess against.

-- How each data key is wrapped (projections/sealing/keys.py): 1 for every key created before
-- this migration (associated data "<tenant>:<type>:<id>"), 2 for every key created since
-- (derived wrapping key, associated data a JSON array). The default stays 1: a worker of the
-- previous release, still running during an upgrade, writes format 1 without naming it.
ALTER TABLE entity_keys
    ADD COLUMN wrap_format smallint NOT NULL DEFAULT 1 CHECK (wrap_format IN (1, 2));

-- A probe's vector is stored sealed (AES-GCM under a key derived from the master key, bound to
-- tenant, deletion and item). Plaintext vectors written before this migration (or by a worker
-- of the previous release during the upgrade) stay readable for the verification they were
-- kept for, and are deleted with it or at the deletion's deadline like every probe.
ALTER TABLE deletion_probes
    ADD COLUMN sealed_vector bytea,
    ALTER COLUMN vector DROP NOT NULL,
    ADD CONSTRAINT deletion_probes_one_form CHECK ((vector IS NULL) <> (sealed_vector IS NULL));
