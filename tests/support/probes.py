"""Asking a worker's probe endpoint (/healthz, /readyz, /metrics) from a test."""

from __future__ import annotations

import http.client
import urllib.error
import urllib.request
from typing import Any

import orjson

Answer = tuple[int, dict[str, Any] | None]


def probe(port: int, path: str) -> Answer | None:
    """(status, JSON body or None), or None while nothing listens (or the process exits
    mid-answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
            return response.status, json_or_none(response.read())
    except urllib.error.HTTPError as error:
        try:
            body = error.read()
        except (ConnectionError, http.client.HTTPException):
            body = b""  # the process exited while sending its 503
        return error.code, json_or_none(body)
    except (urllib.error.URLError, ConnectionError, http.client.HTTPException):
        return None


def json_or_none(body: bytes) -> dict[str, Any] | None:
    try:
        loaded = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return loaded if isinstance(loaded, dict) else None


def wait_probe(env: Any, port: int, path: str, status: int, **check_ok: bool) -> dict[str, Any]:
    """Poll ``path`` until it answers ``status`` with each named check as given."""

    def answered() -> dict[str, Any] | None:
        found = probe(port, path)
        if found is None or found[0] != status or found[1] is None:
            return None
        named = {name: found[1]["checks"][name]["ok"] for name in check_ok}
        return found[1] if named == check_ok else None

    body: dict[str, Any] = env.wait_until(answered, f"{path} answering {status} with {check_ok}")
    return body


def metric_values(port: int, name: str, **labels: str) -> list[float]:
    """The values of ``name``'s samples whose labels include ``labels``."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    wanted = [f'{key}="{value}"' for key, value in labels.items()]
    return [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{") and all(label in line for label in wanted)
    ]


def metric_total(port: int, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    return sum(metric_values(port, name, **labels))


def metric_sample(port: int, name: str, **labels: str) -> bool:
    """Whether ``name`` has a sample with ``labels`` (whatever its value)."""
    return bool(metric_values(port, name, **labels))
