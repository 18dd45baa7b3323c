"""Deletion: the ledger of requests and acknowledgements, and the erasure guard."""
