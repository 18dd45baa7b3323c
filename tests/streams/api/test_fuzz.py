"""Property-based fuzzing of the committed OpenAPI document (topics/api/openapi-v1.json)
against the running server and the real stack, with schemathesis: for every operation,
requests generated from the document (valid ones, and ones that break it) must never get a
5xx, and every answer must conform to the document: a documented status code, content type,
headers and body schema; a request that breaks the document must be refused (4xx).

The examples are bounded (``MAX_EXAMPLES`` per operation and phase), so that the whole module
runs in under two minutes. The key holds every purpose, so generated requests reach the
policy, the reads and the writes, not only the 401 and 403 answers: a generated ``purpose``
is replaced by the key's read purpose, and half the generated valid proposals are made the key's
tenant's and actor's, so that the codec and the producer see them too.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator
from typing import Any

import hypothesis
import pytest
import schemathesis
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from projections.access.proposals import DELETE, PROPOSE
from streams.cli.serve import OPENAPI_DOCUMENT
from support.api_server import ApiServer, serving
from support.environment import Env

pytestmark = pytest.mark.integration

MAX_EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "25"))
PURPOSE = "fuzz"
ACTOR = ("agent", "fuzzer")
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
]


@pytest.fixture(scope="module")
def fuzzed(api_env: Env) -> Iterator[tuple[ApiServer, str, str]]:
    """A server of the module's own (the rate limit out of the fuzzer's way), a key with
    every purpose, and its tenant."""
    with serving(api_env, api_rate_limit="1000000/minute") as server:
        tenant = server.tenant()
        server.set_purpose(tenant, PURPOSE, conversations=True)
        key = server.create_key(tenant, [PURPOSE, PROPOSE, DELETE], actor=":".join(ACTOR))
        yield server, key.token, tenant


# The committed document, loaded as the module is collected; the server's address is given
# to each call (schemathesis's fixture-based loader does not run under pytest 9).
schema = schemathesis.openapi.from_path(OPENAPI_DOCUMENT)


def _aimed(case: Any, tenant: str) -> None:
    """Point part of the valid generated requests at what the key may do (see the module
    doc); a request meant to break the document stays as it was generated."""
    if case.meta is not None and case.meta.generation.mode.is_negative:
        return
    if isinstance(case.query, dict) and "purpose" in case.query:
        case.query["purpose"] = PURPOSE
    body = case.body
    if not isinstance(body, dict) or "event_type" not in body:
        return
    event_id = body.get("event_id")
    if isinstance(event_id, str) and zlib.crc32(event_id.encode()) % 2:
        body["tenant_id"] = tenant
        body["actor"] = {"type": ACTOR[0], "id": ACTOR[1]}


@schema.parametrize()
@hypothesis.settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    suppress_health_check=list(hypothesis.HealthCheck),
    derandomize=os.environ.get("FUZZ_RANDOM") is None,
)
def test_no_5xx_and_every_answer_conforms(case: Any, fuzzed: tuple[ApiServer, str, str]) -> None:
    server, token, tenant = fuzzed
    _aimed(case, tenant)
    case.call_and_validate(
        base_url=server.url, headers={"Authorization": f"Bearer {token}"}, checks=CHECKS
    )
