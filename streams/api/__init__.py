"""The HTTP API: ``create_app(ApiServices)`` builds the FastAPI application that
``memproj serve`` runs under uvicorn. The read rules are those of ``streams.reads``; who may
read what is ``projections.access``."""
