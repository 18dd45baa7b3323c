-- A message source's ref is "<conversation_id>/<message_id>" with the conversation id written
-- with '%' as '%25' and '/' as '%2F' (topics.envelope.message_ref): cut at the first '/' and
-- unescaped, a conversation id that holds '/' is found from the memories derived from it.
-- The same rule as topics.envelope.source_conversation (tests/projections/test_memory_store.py
-- holds the two to each other). replace() scans once, left to right, and never rescans what it
-- wrote: '%2F' first, then '%25', is the one-pass decoding of both escapes.
CREATE FUNCTION memproj_source_conversation(source_type text, source_ref text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE RETURN (
    CASE WHEN source_type = 'message' AND split_part(source_ref, '/', 1) <> ''
              AND strpos(source_ref, '/') > 0
         THEN replace(replace(replace(split_part(source_ref, '/', 1), '%2F', '/'), '%2f', '/'),
                      '%25', '%')
    END
);

DROP INDEX memories_by_source_conversation;
ALTER TABLE memories DROP COLUMN source_conversation_id;
ALTER TABLE memories ADD COLUMN source_conversation_id text GENERATED ALWAYS AS (
    memproj_source_conversation(source_type, source_ref)
) STORED;
CREATE INDEX memories_by_source_conversation ON memories (tenant_id, source_conversation_id);

DROP INDEX memory_versions_by_source_conversation;
ALTER TABLE memory_versions DROP COLUMN source_conversation_id;
ALTER TABLE memory_versions ADD COLUMN source_conversation_id text GENERATED ALWAYS AS (
    memproj_source_conversation(source_type, source_ref)
) STORED;
CREATE INDEX memory_versions_by_source_conversation
    ON memory_versions (tenant_id, source_conversation_id);
