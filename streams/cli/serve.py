"""``memproj serve``: the HTTP API under uvicorn (``streams.api``)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import click

from streams.cli.common import settings_of
from streams.settings import Settings

OPENAPI_DOCUMENT = Path(__file__).resolve().parents[2] / "topics" / "api" / "openapi-v1.json"


def openapi_text(settings: Settings) -> str:
    """The committed document's text: the app's OpenAPI document, keys sorted."""
    from streams.api.app import create_app
    from streams.api.services import build_services

    document = create_app(build_services(settings)).openapi()
    return json.dumps(document, indent=2, sort_keys=True) + "\n"


@click.command()
@click.option("--host", help="address to bind (default MEMPROJ_API_HOST)")
@click.option("--port", type=int, help="port (default MEMPROJ_API_PORT)")
@click.option(
    "--print-openapi",
    is_flag=True,
    help="print the OpenAPI 3.1 document (topics/api/openapi-v1.json) and exit",
)
@click.option(
    "--write-openapi", is_flag=True, help="rewrite topics/api/openapi-v1.json from the code"
)
@click.pass_context
def serve(
    ctx: click.Context, host: str | None, port: int | None, print_openapi: bool, write_openapi: bool
) -> None:
    """Serve the HTTP API (/v1: recall, search, memories, conversations; /healthz, /readyz,
    /metrics). Keys: memproj keys api create; purposes: memproj keys purpose set."""
    # Only this command pays for the web stack's imports.
    from streams.api.app import create_app, http_server
    from streams.api.services import build_services

    settings = settings_of(ctx)
    if print_openapi or write_openapi:
        text = openapi_text(settings)
        if write_openapi:
            OPENAPI_DOCUMENT.write_text(text)
            click.echo(f"wrote {OPENAPI_DOCUMENT}")
        else:
            click.echo(text, nl=False)
        return
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(levelname)s %(name)s: %(message)s"
    )
    app = create_app(build_services(settings))
    server = http_server(app, settings, host or settings.api_host, port)
    server.run()
    if not server.started:
        raise SystemExit(3)  # it could not start (the port taken, say), as uvicorn.run exits
