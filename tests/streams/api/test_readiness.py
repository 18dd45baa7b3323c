"""/readyz says which dependency is unreachable or refuses the API (503), while /healthz still
answers, and recovers with it; search without a vector store is a 503 too."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
import orjson
import pytest
from pydantic import SecretStr

from projections.access.proposals import PROPOSE
from projections.embeddings.vectors import VectorStoreMissing
from streams.api.app import create_app
from streams.api.services import build_services
from streams.kafka_security import SaslMechanism, SecurityProtocol
from streams.sample import EventFactory
from streams.services import open_vector_store
from streams.settings import Settings
from support.api_server import ApiServer
from support.deletion_scenario import ALICE
from support.environment import Env
from support.kafka_users import scram_user, secure_environment


def test_readyz_names_the_unreachable_dependencies() -> None:
    settings = Settings(
        postgres_dsn="postgresql://nobody@127.0.0.1:1/none?connect_timeout=2",
        kafka_bootstrap="127.0.0.1:1",
        environment="local",
    )
    services = build_services(settings)
    app = create_app(services)

    async def probe() -> tuple[httpx.Response, httpx.Response]:
        await services.pool.open(wait=False)  # the lifespan would wait for the database
        try:
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
                return await client.get("/healthz"), await client.get("/readyz")
        finally:
            await services.aclose()

    health, ready = asyncio.run(probe())
    assert health.status_code == 200
    assert ready.status_code == 503
    body = ready.json()
    assert body["status"] == "not_ready"
    assert body["checks"]["postgres"].startswith("unreachable (")
    assert body["checks"]["kafka"].startswith("unreachable (")
    assert "127.0.0.1" not in ready.text  # the class of the error only, never a host


@pytest.mark.integration
def test_search_before_the_vector_store_exists_is_a_503_and_recall_still_answers(
    env: Env, serve_api: Callable[..., ApiServer]
) -> None:
    # No embeddings worker has run on this env's data directory: there is no vector table,
    # and the API (which never writes the store) does not create one.
    server = serve_api(env)
    tenant = server.tenant()
    server.set_purpose(tenant, "support")
    key = server.create_key(tenant, ["support"])
    with server.client(key.token) as client:
        search = client.get(
            "/v1/subjects/user/alice/search", params={"purpose": "support", "text": "email"}
        )
        recall = client.get("/v1/subjects/user/alice/memories", params={"purpose": "support"})
    assert search.status_code == 503, search.text
    assert search.json()["error"]["code"] == "vector_store_unavailable"
    assert str(env.settings.data_dir) not in search.text  # the detail is the operator's log
    assert recall.status_code == 200, recall.text
    with pytest.raises(VectorStoreMissing):
        open_vector_store(env.settings, create=False)


@pytest.mark.integration
def test_readiness_follows_kafka_refusing_then_accepting_the_api_and_writes_resume(
    env: Env, serve_api: Callable[..., ApiServer], events: EventFactory
) -> None:
    """The API's own SASL user, with a password the broker does not know yet: readiness is
    503 naming the refusal (and a proposal a 503); the broker then takes that password (the
    stack's admin tools): readiness recovers and a proposal is delivered, by the same
    delivery thread, which never died."""
    secure = secure_environment("memproj")
    with scram_user(
        env.settings.kafka_bootstrap, "the-old-password", env.settings.topic_prefix
    ) as user:
        server = serve_api(
            env,
            kafka_bootstrap=secure["MEMPROJ_KAFKA_BOOTSTRAP"],
            kafka_security_protocol=SecurityProtocol.SASL_SSL,
            kafka_sasl_mechanism=SaslMechanism(secure["MEMPROJ_KAFKA_SASL_MECHANISM"]),
            kafka_username=user.name,
            kafka_password=SecretStr("the-new-password"),
            kafka_ca_file=secure["MEMPROJ_KAFKA_CA_FILE"],
            api_delivery_timeout_seconds=5.0,
        )
        tenant = server.tenant()
        key = server.create_key(tenant, [PROPOSE], actor="agent:support_agent")

        def readiness() -> httpx.Response:
            with server.client() as client:
                return client.get("/readyz")

        refused = server.wait_for(
            lambda: (
                (answer := readiness()).json()["checks"]["kafka"].startswith("refused") and answer
            ),
            "readiness to name Kafka's refusal",
            seconds=30,
        )
        assert refused.status_code == 503
        assert refused.json()["checks"]["kafka"] == (
            "refused (authentication failed (wrong username or password?))"
        )
        early = post(server, key.token, events.proposed(tenant, "mem_early", ALICE))
        assert early.status_code == 503, early.text

        user.set_password("the-new-password")
        server.wait_for(lambda: readiness().status_code == 200, "readiness to recover", 60)
        accepted = post(server, key.token, events.proposed(tenant, "mem_later", ALICE))
        assert accepted.status_code == 202, accepted.text
    log = server.log_path.read_text(errors="replace")
    assert "Traceback" not in log and "Exception in" not in log, log[-3000:]
    assert "the-new-password" not in log


def post(server: ApiServer, token: str, event: dict[str, Any]) -> httpx.Response:
    with server.client(token) as client:
        return client.post(
            "/v1/memory-events",
            content=orjson.dumps(event),
            headers={"Content-Type": "application/json"},
        )
