-- Kafka headers of an outbox message, as [[name, value], ...]: memory.current carries the
-- tenant and memory ids in headers, because its null-valued tombstones have only the key, and
-- "tenant_id:memory_id" cannot be split back when a tenant id holds a colon.
ALTER TABLE outbox ADD COLUMN headers jsonb;
