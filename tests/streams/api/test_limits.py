"""The API's limits and probes against the running server: 429 with Retry-After past a
key's rate, 413 past the body bound, /healthz, /readyz and /metrics."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest

from streams.settings import Settings
from support.api_server import ApiServer
from support.environment import Env

pytestmark = pytest.mark.integration


def test_a_key_past_its_rate_gets_429_with_retry_after(api_env: Env, serve_api: Any) -> None:
    server: ApiServer = serve_api(api_env, api_rate_limit="3/minute")
    tenant = server.tenant()
    server.set_purpose(tenant, "support")
    key = server.create_key(tenant, ["support"])
    other = server.create_key(tenant, ["support"])
    path = "/v1/subjects/user/alice/memories"
    with server.client(key.token) as client:
        answers = [client.get(path, params={"purpose": "support"}) for _ in range(4)]
    assert [a.status_code for a in answers] == [200, 200, 200, 429]
    limited = answers[-1]
    assert limited.json()["error"]["code"] == "rate_limited"
    assert 1 <= int(limited.headers["Retry-After"]) <= 60
    with server.client(other.token) as client:  # per key: the other's allowance is whole
        assert client.get(path, params={"purpose": "support"}).status_code == 200


def test_failed_authentications_are_limited_per_client_address(
    api_env: Env, serve_api: Any
) -> None:
    """Past MEMPROJ_API_LOGIN_RATE_LIMIT failures, an address is refused (429) before its key
    is looked up, a valid key included; another address is not."""
    server: ApiServer = serve_api(api_env, api_login_rate_limit="3/minute")
    tenant = server.tenant()
    server.set_purpose(tenant, "support")
    key = server.create_key(tenant, ["support"])
    wrong = key.token[:-6] + ("A" if key.token[-6] != "A" else "B") + key.token[-5:]
    path, params = "/v1/subjects/user/alice/memories", {"purpose": "support"}
    with httpx.Client(base_url=server.url, timeout=30) as client:
        failed = [
            client.get(path, params=params, headers={"Authorization": f"Bearer {token}"})
            for token in (wrong, "mpk_not_a_key", wrong)
        ]
        assert [answer.status_code for answer in failed] == [401, 401, 401]
        for token in (wrong, key.token):
            limited = client.get(path, params=params, headers={"Authorization": f"Bearer {token}"})
            assert limited.status_code == 429, limited.text
            assert limited.json()["error"]["code"] == "rate_limited"
            assert 1 <= int(limited.headers["Retry-After"]) <= 60
        assert client.get(path, params=params).status_code == 429  # no key at all
    elsewhere = httpx.HTTPTransport(local_address="127.0.0.2")
    with httpx.Client(base_url=server.url, timeout=30, transport=elsewhere) as client:
        answer = client.get(path, params=params, headers={"Authorization": f"Bearer {key.token}"})
        assert answer.status_code == 200, answer.text


def test_an_oversized_body_gets_413(api: ApiServer) -> None:
    too_big = b"x" * (api.settings.api_max_body_bytes + 1)
    with api.client() as client:
        answer = client.post(
            "/v1/subjects/user/alice/memories",
            content=too_big,
            headers={"Content-Type": "application/json"},
        )
    assert answer.status_code == 413
    assert answer.json()["error"]["code"] == "body_too_large"


def test_probes_and_metrics(api: ApiServer) -> None:
    with api.client() as client:
        assert client.get("/healthz").json() == {"status": "ok", "checks": {}}
        ready = client.get("/readyz")
        assert ready.status_code == 200
        assert ready.json() == {"status": "ready", "checks": {"postgres": "ok", "kafka": "ok"}}
        client.get("/v1/subjects/user/alice/memories", params={"purpose": "x"})  # a 401
        metrics = client.get("/metrics").text
    assert (
        'memproj_api_requests_total{method="GET",route="/v1/subjects/{subject_type}/{subject_id}'
        '/memories",status="401"}' in metrics
    )
    assert 'memproj_api_request_seconds_bucket{le="0.001",method="GET",route="/healthz"' in metrics


def test_replicas_share_a_keys_rate_in_redis(api_env: Env, serve_api: Any) -> None:
    """MEMPROJ_API_RATE_LIMIT_STORAGE=redis: two servers count one key's requests together."""
    overrides = {"api_rate_limit": "3/minute", "api_rate_limit_storage": "redis"}
    first: ApiServer = serve_api(api_env, **overrides)
    second: ApiServer = serve_api(api_env, **overrides)
    tenant = first.tenant()
    first.set_purpose(tenant, "support")
    key = first.create_key(tenant, ["support"])
    path = "/v1/subjects/user/alice/memories"
    statuses = []
    for server in (first, second, first, second):
        with server.client(key.token) as client:
            statuses.append(client.get(path, params={"purpose": "support"}).status_code)
    assert statuses == [200, 200, 200, 429]


def test_replicas_share_a_keys_rate_on_a_redis_cluster(
    api_env: Env, serve_api: Any, redis_cluster: Settings
) -> None:
    """The same with MEMPROJ_REDIS_CLUSTER: the windows, and the cache, on a cluster."""
    overrides = {
        "api_rate_limit": "3/minute",
        "api_rate_limit_storage": "redis",
        "redis_url": redis_cluster.redis_url,
        "redis_cluster": True,
    }
    first: ApiServer = serve_api(api_env, **overrides)
    second: ApiServer = serve_api(api_env, **overrides)
    tenant = first.tenant()
    first.set_purpose(tenant, "support")
    key, other = (first.create_key(tenant, ["support"]) for _ in range(2))
    path = "/v1/subjects/user/alice/memories"
    statuses = []
    for server, token in [(first, key), (second, key), (first, key), (second, key), (first, other)]:
        with server.client(token.token) as client:
            statuses.append(client.get(path, params={"purpose": "support"}).status_code)
    assert statuses == [200, 200, 200, 429, 200]


def test_invented_methods_are_one_label_value(api_env: Env, serve_api: Any) -> None:
    """The server accepts any token as a method; without a key, a thousand invented ones must
    not make a thousand series."""
    server: ApiServer = serve_api(api_env)
    paths = ["/healthz", "/v1/memories/m1", "/nowhere"]
    with server.client() as client:
        for n in range(1000):
            client.request(f"INVENTED{n}", paths[n % len(paths)])
        client.get("/healthz")
        metrics = client.get("/metrics").text
    methods = set(re.findall(r'^memproj_api_requests_total\{method="([^"]*)"', metrics, re.M))
    assert methods == {"GET", "other"}
    counted = re.findall(r'^memproj_api_requests_total\{method="other".*\} (\S+)$', metrics, re.M)
    assert sum(float(count) for count in counted) == 1000
