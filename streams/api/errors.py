"""One JSON error body for every refusal: ``{"error": {"code": ..., "message": ...}}``.

Routes raise ``ApiError``; FastAPI's own refusals (validation, unknown route, wrong method)
and anything unexpected are turned into the same body, so a client parses one shape for
400, 401, 403, 404, 413, 422, 423, 429 and 5xx alike. A 5xx never carries the exception's text
(it can name hosts or values), only its code; the log names the route's template and the
exception's class and code (``streams.failures.loggable``): a path carries ids, and the log is
a place no erasure reaches.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from projections.access.pauses import SubjectPaused
from projections.embeddings.vectors import VectorStoreRefused
from streams.api.metrics import route_template
from streams.failures import loggable

log = logging.getLogger(__name__)


class ErrorDetail(BaseModel):
    code: str
    message: str


class ErrorBody(BaseModel):
    error: ErrorDetail


class ApiError(Exception):
    def __init__(
        self, status: int, code: str, message: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers


def error_response(
    status: int, code: str, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    body = ErrorBody(error=ErrorDetail(code=code, message=message))
    return JSONResponse(body.model_dump(), status_code=status, headers=headers)


# The documented error answers of every route (OpenAPI), by status.
_DESCRIPTIONS = {
    400: "malformed request",
    401: "no valid API key",
    403: "outside the key's tenant, purpose or write bounds",
    404: "not found (or not the key's tenant's)",
    409: "refused: a legal hold is in force on what it would erase (the refusal is recorded)",
    413: "request body too large",
    422: "invalid parameters or body",
    423: "the subject is paused by an operator (code subject_paused): nothing of it is served",
    429: "rate limit exceeded (Retry-After says when to retry)",
    500: "internal error",
    503: "a dependency is unavailable (nothing was accepted or read): retry later",
}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {
        status: {"model": ErrorBody, "description": _DESCRIPTIONS[status]} for status in statuses
    }


_STATUS_CODES = {
    400: "bad_request",
    401: "unauthenticated",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "body_too_large",
    422: "invalid_request",
    429: "rate_limited",
}


def install(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.code, exc.message, exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = _STATUS_CODES.get(exc.status_code, "error")
        headers = dict(exc.headers) if exc.headers else None
        return error_response(exc.status_code, code, str(exc.detail), headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        # Locations and messages only: pydantic's "input" would echo what was sent.
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc'])}: {error['msg']}"
            for error in exc.errors()
        )
        return error_response(422, "invalid_request", problems[:2000])

    @app.exception_handler(SubjectPaused)
    async def _paused(request: Request, exc: SubjectPaused) -> JSONResponse:
        # Audited reads answer it themselves (recording the refusal); any other path too.
        return error_response(423, exc.code, exc.message)

    @app.exception_handler(VectorStoreRefused)
    async def _vectors_refused(request: Request, exc: VectorStoreRefused) -> JSONResponse:
        # Not the request's fault and not a bug: the store needs its worker or a rebuild. The
        # detail (paths, models, the command to run) is for the operator's log.
        log.warning("%s %s: %s", request.method, _route(request), loggable(exc))
        return error_response(
            503,
            "vector_store_unavailable",
            "semantic search is unavailable until the vector store is built or rebuilt",
        )

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("%s %s failed: %s", request.method, _route(request), loggable(exc))
        return error_response(500, "internal_error", f"internal error ({type(exc).__name__})")


def _route(request: Request) -> str:
    return route_template(request.app, request.scope)
