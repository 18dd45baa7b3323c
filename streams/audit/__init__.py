"""Audits an operator runs by hand: where a marker string is still readable (``plaintext``)."""
