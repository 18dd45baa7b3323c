"""The Redis cache of recall results and context views, indexed for deletion."""
