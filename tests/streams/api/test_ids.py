"""Every id the contract accepts (1 to 128 characters, any but NUL) is addressable on every API
route and every CLI read, round-tripping: ids with ``/``, ``%``, ``:``, dot segments, unicode,
whitespace and the full 128 characters are proposed through the API (or, for deletion ids a
producer chooses, through Kafka), applied by the workers, and read back by the id they were
given. Ids travel in paths as one percent-encoded segment (``streams.api.paths``)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import httpx
import orjson
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from projections.access.proposals import DELETE, PROPOSE
from streams.cli import cli
from streams.sample import EventFactory
from streams.settings import Settings
from support.api_server import ApiServer, serving
from support.environment import Env, isolated_env, settings_environment
from topics.api.paths import encode_segment
from topics.envelope import IDENTIFIER_MAX_LENGTH
from topics.registry import CONVERSATION_EVENTS, DELETION_REQUESTS, MEMORY_EVENTS

pytestmark = pytest.mark.integration

WORKERS = ("memory", "conversation", "embeddings", "context", "deletion")
ACTOR = ("agent", "support_agent")  # the factory's events' actor
PURPOSE = "support"

# Any character the codec lets through (NUL is refused: PostgreSQL cannot store it; a lone
# surrogate is no UTF-8), and an alphabet of the characters paths, keys and shells treat
# specially, so that most generated ids hold several of them.
ANY_CHARACTER = st.characters(exclude_categories=["Cs"], exclude_characters="\x00")
HOSTILE = st.sampled_from([*"/%:.?#&+= \t\n\\-~ü\u200b😀", "%2F", "%25", "..", "%2E"])
IDS = st.one_of(
    st.text(ANY_CHARACTER, min_size=1, max_size=IDENTIFIER_MAX_LENGTH),
    st.lists(HOSTILE, min_size=1, max_size=40)
    .map("".join)
    .map(lambda text: text[:IDENTIFIER_MAX_LENGTH]),
    st.sampled_from([".", "..", "/", "%", "-", "--help"]),
)
BATCHES = st.lists(IDS, min_size=4, max_size=6, unique=True)

NAMED = [
    "m/../x%2F:y ü",
    "al/ice",
    ".",
    "..",
    "/",
    " padded ",
    "tab\tand\nnewline",
    "-looks-like-an-option",
    "x" * (IDENTIFIER_MAX_LENGTH - 1) + "/",
    "ü" * IDENTIFIER_MAX_LENGTH,
]


@pytest.fixture(scope="module")
def ids_env(stack: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with isolated_env(stack, tmp_path_factory.mktemp("ids")) as env:
        env.start(*WORKERS)
        yield env


@pytest.fixture(scope="module")
def ids_api(ids_env: Env) -> Iterator[ApiServer]:
    with serving(ids_env, api_rate_limit="1000000/minute") as server:
        yield server


def memory_path(memory_id: str) -> str:
    return f"/v1/memories/{encode_segment(memory_id)}"


def subject_path(subject: tuple[str, str], what: str) -> str:
    return f"/v1/subjects/{encode_segment(subject[0])}/{encode_segment(subject[1])}/{what}"


def conversation_path(conversation_id: str, what: str = "") -> str:
    return f"/v1/conversations/{encode_segment(conversation_id)}{what}"


def ok(answer: httpx.Response) -> Any:
    assert answer.status_code in (200, 202), (answer.request.url, answer.text)
    return answer.json()


def memory_ids(answer: httpx.Response) -> list[str]:
    return [memory["memory_id"] for memory in ok(answer)["memories"]]


def run_cli(env: Env, command: str, *args: str) -> Any:
    """A CLI read's JSON answer; ids are given as ``--option=value`` (or after ``--``), so
    that one starting with ``-`` stays a value."""
    argv = [*command.split(), "--json", *args]
    environment = settings_environment(env.settings)
    result = CliRunner().invoke(cli, argv, env=environment, catch_exceptions=False)
    assert result.exit_code == 0, (argv, result.output)
    return orjson.loads(result.output)


def propose_everything(
    client: httpx.Client, events: EventFactory, tenant: str, ids: Sequence[str]
) -> None:
    """Each id is a memory about the subject (id, id), and a conversation that subject owns."""
    for each in ids:
        subject = (each, each)
        memory = events.proposed(tenant, each, subject, {"text": f"likes tea {len(each)}"})
        ok(client.post("/v1/memory-events", json=memory))
        for event in (
            events.started(tenant, each, subject),
            events.message(tenant, each, "m1", "user", "hello there"),
        ):
            ok(client.post("/v1/conversation-events", json=event))


def check_api_reads(client: httpx.Client, each: str) -> None:
    subject = (each, each)
    params = {"purpose": PURPOSE}
    assert memory_ids(client.get(subject_path(subject, "memories"), params=params)) == [each]
    searched = client.get(subject_path(subject, "search"), params={**params, "text": "tea"})
    assert memory_ids(searched) == [each]
    detail = ok(client.get(memory_path(each), params=params))
    assert detail["memory"]["memory_id"] == each
    assert [version["version"] for version in detail["history"]] == [1]
    conversation = ok(client.get(conversation_path(each), params=params))
    assert conversation["conversation"]["conversation_id"] == each
    assert [m["message_id"] for m in conversation["messages"]] == ["m1"]
    context = ok(client.get(conversation_path(each, "/context"), params=params))
    assert context["conversation_id"] == each


def check_cli_reads(env: Env, tenant: str, each: str) -> None:
    subject = [f"--subject-type={each}", f"--subject-id={each}"]
    recalled = run_cli(env, "recall", f"--tenant={tenant}", *subject)
    assert [memory["memory_id"] for memory in recalled] == [each]
    searched = run_cli(env, "recall", f"--tenant={tenant}", *subject, "--query=tea")
    assert [memory["memory_id"] for memory in searched] == [each]
    shown = run_cli(env, "memory show", f"--tenant={tenant}", f"--memory-id={each}")
    assert shown["current"]["memory_id"] == each
    conversation = run_cli(env, "conversation show", f"--tenant={tenant}", f"--conversation={each}")
    assert conversation["conversation"]["conversation_id"] == each
    context = run_cli(
        env, "conversation show", f"--tenant={tenant}", f"--conversation={each}", "--context"
    )
    assert [item["role"] for item in context["items"]] == ["user"]


def check_deletions(
    env: Env,
    server: ApiServer,
    client: httpx.Client,
    events: EventFactory,
    tenant: str,
    ids: Sequence[str],
) -> None:
    """A deletion id a producer chose is followed by it through the API and the CLI; a
    deletion of the API, by its status_url. Each erases the memory of that id."""
    env.produce_events(
        [events.deletion(tenant, each, {"type": "memory", "id": each}) for each in ids],
        DELETION_REQUESTS,
    )
    for each in ids:
        status_path = f"/v1/deletions/{encode_segment(each)}"
        wait_found(server, client, status_path)
        progress = ok(client.get(status_path))
        assert progress["deletion_id"] == each
        status = run_cli(env, "deletion status", f"--tenant={tenant}", "--", each)
        assert status["deletion_id"] == each
    target = {"type": "subject", "subject_type": ids[0], "id": ids[0]}
    accepted = ok(client.post("/v1/deletions", json={"target": target}))
    wait_found(server, client, accepted["status_url"])


def wait_found(
    server: ApiServer, client: httpx.Client, path: str, params: dict[str, str] | None = None
) -> None:
    """Until ``path`` answers 200 (a worker has applied what it reads)."""

    def found() -> bool:
        return client.get(path, params=params).status_code == 200

    server.wait_for(found, path)


@settings(
    max_examples=4,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ids=BATCHES)
@example(ids=NAMED)
def test_every_contract_id_round_trips_through_every_route_and_cli_read(
    ids_env: Env, ids_api: ApiServer, ids: list[str]
) -> None:
    server = ids_api
    tenant = server.tenant()
    server.set_purpose(tenant, PURPOSE, conversations=True)
    key = server.create_key(tenant, [PURPOSE, PROPOSE, DELETE], actor=":".join(ACTOR))
    events = EventFactory(id_prefix=f"e-{tenant}")
    with server.client(key.token) as client:
        propose_everything(client, events, tenant, ids)
        ids_env.wait_caught_up(MEMORY_EVENTS, "memory")
        ids_env.wait_caught_up(CONVERSATION_EVENTS, "conversation")
        for each in ids:
            server.wait_indexed(tenant, (each, each), 1)
            wait_found(server, client, conversation_path(each, "/context"), {"purpose": PURPOSE})
        for each in ids:
            check_api_reads(client, each)
            check_cli_reads(ids_env, tenant, each)
        check_deletions(ids_env, server, client, events, tenant, ids)
