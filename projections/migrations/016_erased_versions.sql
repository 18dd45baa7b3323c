-- A memory version whose content was taken from an erased conversation, while the memory itself
-- is not erased, is kept as its place in the history without its value: status 'erased', never
-- served (topics.outputs.MemoryStatus).
ALTER TABLE memories DROP CONSTRAINT memories_status_check;
ALTER TABLE memories ADD CONSTRAINT memories_status_check
    CHECK (status IN ('proposed', 'verified', 'revoked', 'erased'));
