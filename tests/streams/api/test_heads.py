"""Over-long requests are answered with an HTTP status, never a dropped connection: a request
line past MEMPROJ_API_MAX_HEAD_BYTES is a 414, a head past it a 431 (whether the head arrives
in one piece or in many), and a parameter past its own bound a 422 that names it. Each is read
from a raw socket, so that what the server writes back, or a reset, is seen as it is."""

from __future__ import annotations

import socket

import orjson
import pytest

from support.api_server import ApiServer

pytestmark = pytest.mark.integration

SEARCH = "/v1/subjects/user/alice/search?purpose=support&text="


def exchange(server: ApiServer, request: bytes, piece: int | None = None) -> tuple[int, bytes]:
    """Send ``request`` (whole, or ``piece`` bytes at a time), then read the answer to its end:
    the status and the body. A reset fails the test (ConnectionResetError)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        step = piece or len(request)
        for start in range(0, len(request), step):
            sock.sendall(request[start : start + step])
        return answer_of(sock)


def answer_of(sock: socket.socket) -> tuple[int, bytes]:
    answer = b""
    while chunk := sock.recv(65536):
        answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0]
    assert status_line.startswith(b"HTTP/1.1 "), answer[:200]
    return int(status_line.split()[1]), body


def get(target: str, *headers: str) -> bytes:
    lines = [f"GET {target} HTTP/1.1", "Host: memproj", "Connection: close", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


@pytest.mark.parametrize("piece", [None, 4096], ids=["whole", "in-pieces"])
def test_a_200_kb_query_string_is_a_414(api: ApiServer, piece: int | None) -> None:
    status, body = exchange(api, get(SEARCH + "a" * 200_000), piece)
    assert status == 414
    error = orjson.loads(body)["error"]
    assert error["code"] == "uri_too_long"
    assert str(api.settings.api_max_head_bytes) in error["message"]


@pytest.mark.parametrize("piece", [None, 4096], ids=["whole", "in-pieces"])
def test_a_100_kb_header_is_a_431(api: ApiServer, piece: int | None) -> None:
    status, body = exchange(api, get("/healthz", "X-Padding: " + "a" * 100_000), piece)
    assert status == 431
    assert orjson.loads(body)["error"]["code"] == "headers_too_large"


def test_a_head_refused_while_it_arrives_is_answered_and_the_rest_is_read(api: ApiServer) -> None:
    """Past the bound and still incomplete, the head is refused at once (414); what the client
    sends after that is read, not answered with a reset."""
    request = get(SEARCH + "a" * 200_000)
    first = api.settings.api_max_head_bytes + 4096
    with socket.create_connection(("127.0.0.1", api.port), timeout=30) as sock:
        sock.sendall(request[:first])
        status, body = answer_of(sock)
        sock.sendall(request[first:])
    assert status == 414
    assert orjson.loads(body)["error"]["code"] == "uri_too_long"


def test_many_headers_past_the_bound_are_a_431(api: ApiServer) -> None:
    headers = [f"X-Padding-{n}: {'a' * 100}" for n in range(1000)]
    status, _ = exchange(api, get("/healthz", *headers), 1024)
    assert status == 431


def test_a_head_within_the_bound_is_served_on(api: ApiServer) -> None:
    status, body = exchange(api, get("/healthz", "X-Padding: " + "a" * 30_000), 4096)
    assert (status, orjson.loads(body)["status"]) == (200, "ok")


def test_a_search_text_past_its_bound_is_a_422_naming_it(api: ApiServer) -> None:
    tenant = api.tenant()
    api.set_purpose(tenant, "support")
    key = api.create_key(tenant, ["support"])
    with api.client(key.token) as client:
        answer = client.get(
            "/v1/subjects/user/alice/search", params={"purpose": "support", "text": "a" * 5000}
        )
    assert answer.status_code == 422
    error = answer.json()["error"]
    assert error["code"] == "invalid_request"
    assert "text" in error["message"] and "4096" in error["message"]
