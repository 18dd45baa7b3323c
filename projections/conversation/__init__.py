"""The conversation projection: conversations, their messages and summaries with sources, and
the model-ready context view."""
