"""The wire contract: topic registry, event models, codecs and schema versions."""
