"""Stream processing: the Faust app factory, agents, worker services and the ``memproj`` CLI."""
