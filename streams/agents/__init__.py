"""The derived stores' handlers: what each store worker's agents do with a batch (tombstones,
index updates, cache invalidation); the batch loop (``streams.loop``) runs them."""
