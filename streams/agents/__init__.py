"""Faust agents: thin loops that hand batches of messages to a runner and acknowledge them."""
