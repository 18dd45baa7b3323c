"""Retention: per-tenant classes, legal holds, the schedule that erases conversations past
their period and memories past their expiry through the deletion ledger, and its receipt."""
