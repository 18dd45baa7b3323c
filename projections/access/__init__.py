"""Who may read what through the HTTP API: API keys, the purpose policy, and the
read audit. The rules are pure (``keys.parse_key``, ``policy``); the stores beside them hold
only hashes, ids and policy rows, never content."""
