"""Who is asking: ``require_principal`` reads ``Authorization: Bearer mpk_...``, looks the key
up (``projections.access.keys``), refuses a missing, malformed, unknown or revoked key (401)
and spends one unit of the key's rate limit (429). Each refusal spends one unit of the client
address's allowance of failed authentications; an address without any left is refused (429)
before its key is looked up, so guessing keys does not take a database connection per guess.
The principal's tenant is the key's: the server never takes a tenant from the request.

The purpose is the request's (a ``purpose`` query or body field) and must be one of the
key's (403); ``Principal.policy`` loads what that purpose may read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from projections.access import keys, purposes
from projections.access.policy import PolicyRefusal, PurposePolicy, WriteBounds, check_purpose
from streams.api.errors import ApiError
from streams.api.limits import Verdict
from streams.api.services import ApiServices

_bearer = HTTPBearer(
    auto_error=False,
    scheme_name="ApiKey",
    description="an API key, `mpk_<key_id>_<secret>` (memproj keys api create)",
)

UNAUTHENTICATED = {"WWW-Authenticate": "Bearer"}


@dataclass(frozen=True, slots=True)
class Principal:
    key_id: str
    tenant_id: str
    actor: str
    purposes: tuple[str, ...]
    write_bounds: WriteBounds | None = None

    def check_purpose(self, purpose: str) -> None:
        """403 unless ``purpose`` is one of the key's."""
        try:
            check_purpose(purpose, self.purposes)
        except PolicyRefusal as refusal:
            raise ApiError(403, refusal.code, refusal.message) from None


def services_of(request: Request) -> ApiServices:
    services = request.app.state.services
    assert isinstance(services, ApiServices)
    return services


Services = Annotated[ApiServices, Depends(services_of)]


def _rate_limited(verdict: Verdict, message: str) -> ApiError:
    return ApiError(429, "rate_limited", message, {"Retry-After": str(verdict.retry_after_seconds)})


async def require_principal(
    request: Request,
    services: Services,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    # Behind a proxy, the proxy's address unless uvicorn trusts its forwarding headers.
    address = request.client.host if request.client is not None else "unknown"
    failures = services.login_limit
    verdict = await failures.check(address)
    if not verdict.allowed:
        message = f"too many failed authentications from this address (limit {failures.item})"
        raise _rate_limited(verdict, message)
    key = None
    if credentials is not None:
        async with services.pool.connection() as conn:
            key = await keys.authenticate(conn, credentials.credentials)
    if key is None:
        await failures.hit(address)
        message = "an API key is required" if credentials is None else "invalid or revoked API key"
        raise ApiError(401, "unauthenticated", message, UNAUTHENTICATED)
    verdict = await services.rate_limit.hit(key.key_id)
    if not verdict.allowed:
        raise _rate_limited(
            verdict, f"rate limit of {services.rate_limit.item} exceeded for this key"
        )
    return Principal(key.key_id, key.tenant_id, key.actor, key.purposes, key.write_bounds)


CurrentPrincipal = Annotated[Principal, Depends(require_principal)]


async def policy_of(
    services: ApiServices, principal: Principal, purpose: str
) -> PurposePolicy | None:
    """The policy of one of the key's purposes (403 for a purpose the key lacks)."""
    principal.check_purpose(purpose)
    async with services.pool.connection() as conn:
        return await purposes.load_policy(conn, principal.tenant_id, purpose)
