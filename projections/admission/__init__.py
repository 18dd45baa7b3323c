"""What a memory write must satisfy before it is admitted, or why it is held for review."""
