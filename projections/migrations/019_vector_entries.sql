-- The vector store in PostgreSQL (projections.embeddings.postgres): the embeddings of memories
-- and messages beside the rest of a tenant's data, written by any number of embeddings workers
-- and read by every API replica, an erasure visible at its commit.
--
-- A collection is one vector table: 'embeddings' is the live one, the others are the rebuilds
-- of `memproj replay embeddings` (embeddings_replay_<stamp>_<hex>). Each records the embedder
-- of its vectors and the version of its columns, as LanceDB's table metadata does.
CREATE TABLE vector_collections (
    name text PRIMARY KEY,
    model text NOT NULL,
    dim integer NOT NULL CHECK (dim > 0),
    schema_version integer NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- One entry per tenant, collection and id. The vector is float32, little-endian, back to
-- back (dim * 4 bytes); a search reads a subject's candidates through the subject index and
-- ranks them exactly, in the process that asked.
CREATE TABLE vector_entries (
    tenant_id text NOT NULL,
    collection text NOT NULL,
    id text NOT NULL,
    kind text NOT NULL CHECK (kind IN ('memory', 'message')),
    subject_type text NOT NULL,
    subject_id text NOT NULL,
    memory_id text,
    conversation_id text,
    message_id text,
    source_type text NOT NULL,
    source_ref text NOT NULL,
    text text NOT NULL,
    version bigint NOT NULL,
    occurred_at timestamptz NOT NULL,
    memory_kind text,
    scope text,
    vector bytea NOT NULL,
    PRIMARY KEY (tenant_id, collection, id),
    CHECK (kind = 'message' OR (memory_kind IS NOT NULL AND scope IS NOT NULL))
);

-- A search's candidates: one subject's entries, then of the kinds and scopes asked for.
CREATE INDEX vector_entries_subject
    ON vector_entries (tenant_id, collection, subject_type, subject_id, kind, memory_kind, scope);
-- An erasure's: a memory's entry, a conversation's messages.
CREATE INDEX vector_entries_memory
    ON vector_entries (tenant_id, collection, memory_id) WHERE memory_id IS NOT NULL;
CREATE INDEX vector_entries_conversation
    ON vector_entries (tenant_id, collection, conversation_id) WHERE conversation_id IS NOT NULL;
