"""Projections: pure reducers over contract events, and the stores that persist their state."""
