-- Tenant-first keys: every table sharded by tenant on a Citus cluster
-- (projections/distribution.py) has tenant_id as the first column of its primary key, so that
-- the key, and every unique constraint, holds within one tenant's shard. The rows keep their
-- columns; only the keys change.
ALTER TABLE processed_events DROP CONSTRAINT processed_events_pkey,
                             ADD PRIMARY KEY (tenant_id, projection, event_id);
ALTER TABLE rejections DROP CONSTRAINT rejections_pkey, ADD PRIMARY KEY (tenant_id, id);
ALTER TABLE api_read_audit DROP CONSTRAINT api_read_audit_pkey, ADD PRIMARY KEY (tenant_id, id);
ALTER TABLE subject_pause_log DROP CONSTRAINT subject_pause_log_pkey,
                              ADD PRIMARY KEY (tenant_id, id);
