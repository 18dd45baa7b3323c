"""Stream processing: the batch consumer and loop, agents, worker services, read paths and
the ``memproj`` CLI."""
