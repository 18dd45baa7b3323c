"""Helpers that several test modules share: scenarios and builders, no tests."""
