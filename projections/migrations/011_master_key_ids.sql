-- Master-key rotation: every wrapped key names the master key that wrapped it.
-- Rows from before this migration were wrapped by the one key of MEMPROJ_MASTER_KEY, whose id
-- is 'default'; the default also covers a worker of the previous release still writing during
-- an upgrade (it knows that key only). `memproj keys rotate` re-wraps every row under the
-- newest key; the index finds the rows left for it without reading the others.
ALTER TABLE entity_keys
    ADD COLUMN master_key_id text NOT NULL DEFAULT 'default';
CREATE INDEX entity_keys_master_key ON entity_keys (master_key_id, wrap_format);

-- A dead letter's key the same way; an erased letter's row keeps no key to name.
ALTER TABLE dead_letter_keys
    ADD COLUMN master_key_id text NOT NULL DEFAULT 'default';
CREATE INDEX dead_letter_keys_master_key ON dead_letter_keys (master_key_id)
    WHERE wrapped_key IS NOT NULL;

-- Deletion probes live until their deletion is verified or its deadline passes: they carry no
-- key id; the sealer tries each configured key (newest first) and the rotation re-seals them.
