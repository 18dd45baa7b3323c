"""A search embeds its text off the event loop: while one search's embedding is in progress,
the server answers other requests. The server runs in this process, over an embedder that
holds each embedding until the test releases it (no timing: the test sees the embedding start,
asks for another answer, and only then lets the embedding finish)."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from projections.embeddings.embedder import Embedder
from streams.api.services import build_services
from support.api_server import serving_in_process
from support.embedders import embedder_of, vectors_of
from support.environment import Env

pytestmark = pytest.mark.integration

# Long enough for any machine; on a server that embeds on its loop, the probe waits for it.
PATIENCE_SECONDS = 60


class HeldEmbedder:
    """The configured embedder, each embedding held until ``release`` is set."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.name = inner.name
        self.dim = inner.dim
        self.started = threading.Event()
        self.release = threading.Event()

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        self.started.set()
        if not self.release.wait(PATIENCE_SECONDS):
            raise AssertionError("the embedding was never released")
        return self.inner.embed(texts)


def test_other_requests_are_served_while_a_search_embeds(api_env: Env) -> None:
    vectors_of(api_env.settings)  # the table a search reads (the embeddings worker's)
    held = HeldEmbedder(embedder_of(api_env.settings))
    services = dataclasses.replace(build_services(api_env.settings), open_embedder=lambda: held)
    with serving_in_process(api_env, services) as server, ThreadPoolExecutor(1) as pool:
        tenant = server.tenant()
        server.set_purpose(tenant, "support")
        key = server.create_key(tenant, ["support"])
        with server.client(key.token) as client:
            searching = pool.submit(
                client.get,
                "/v1/subjects/user/alice/search",
                params={"purpose": "support", "text": "tea"},
            )
            try:
                assert held.started.wait(PATIENCE_SECONDS), "the search never embedded"
                with httpx.Client(base_url=server.url, timeout=PATIENCE_SECONDS) as other:
                    probe = other.get("/healthz")
                    recall = other.get(
                        "/v1/subjects/user/alice/memories",
                        params={"purpose": "support"},
                        headers={"Authorization": f"Bearer {key.token}"},
                    )
                assert not searching.done()  # the embedding is still held
            finally:
                held.release.set()
            assert probe.status_code == 200
            assert recall.status_code == 200, recall.text
            assert searching.result().status_code == 200, searching.result().text
