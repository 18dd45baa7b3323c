-- The context view is rebuilt after every batch from the active turn, the newest finished
-- turns that fit the budget and counts kept beside the view, not from every message of the
-- conversation (projections/conversation/context.py ``advance_context``).

-- The finished turn whose kept items (its question, its final answer) this message is; null
-- for every other message. Derived, like the view: a full rebuild rewrites it.
ALTER TABLE conversation_messages ADD COLUMN context_turn integer;
CREATE INDEX conversation_messages_by_context_turn
    ON conversation_messages (tenant_id, conversation_id, context_turn)
    WHERE context_turn IS NOT NULL;

-- What the rebuild knows of the turns before the active one (``TurnIndex``); null until the
-- conversation's next batch rebuilds its view from all its messages once.
ALTER TABLE conversation_context ADD COLUMN turn_index jsonb;

-- Where a tool_use id occurs in a conversation: a new tool result for a tool_use before the
-- active turn reopens finished turns, and the rebuild must then start over. One key per
-- (tenant, conversation, tool_use id), length-prefixed so that no two triples share a key.
CREATE FUNCTION conversation_tool_use_keys(tenant_id text, conversation_id text, content jsonb)
RETURNS text[] LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT coalesce(array_agg(
        length(tenant_id) || ':' || tenant_id || length(conversation_id) || ':'
        || conversation_id || ':' || (block ->> 'id')
    ), '{}')
    FROM jsonb_array_elements(content) AS block
    WHERE block ->> 'type' = 'tool_use'
$$;
CREATE INDEX conversation_messages_by_tool_use
    ON conversation_messages USING gin (conversation_tool_use_keys(tenant_id, conversation_id, content));
