"""Crypto-shredding: personal fields sealed with per-entity data keys, so that destroying a key
makes every copy of those fields in the long-retention log unreadable."""
