-- Lexical search over the vector store in PostgreSQL (projections.embeddings.postgres): the
-- search terms of an entry's text (projections.embeddings.lexical: its words case-folded, an
-- id like INV-2024-0042 also whole and without its separators), written with the entry by the
-- same statement and derived from its text column alone. A row's terms go with the row: an
-- erasure's DELETE removes them in the same transaction as the vector, a rebuild writes them
-- with the vectors. Entries written before this column have none (NULL): semantic search
-- still finds them, lexical search once `memproj replay embeddings` rebuilt them.
ALTER TABLE vector_entries ADD COLUMN terms tsvector;

-- The entries holding one of a query's terms. A search is confined to one subject's entries
-- (vector_entries_subject) as well: the planner reads through either index or both.
CREATE INDEX vector_entries_terms ON vector_entries USING gin (terms);
