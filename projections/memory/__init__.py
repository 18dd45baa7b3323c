"""The memory projection: the current eligible version of each memory, with its history."""
