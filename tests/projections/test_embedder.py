"""The hashing embedder and the texts it embeds, with no services."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from projections.embeddings.embedder import (
    Embedder,
    HashingEmbedder,
    memory_text,
    message_text,
    tokens,
)

REPO = Path(__file__).resolve().parents[2]
TEXTS = [
    "The user prefers window seats on long flights",
    "Ünïcödé wörds, 東京 and emoji ☃ count too",
    "",
]


def cosine_distance(first: list[float], second: list[float]) -> float:
    return 1.0 - sum(a * b for a, b in zip(first, second, strict=True))


def test_it_is_an_embedder_of_256_dimensions_by_default() -> None:
    embedder: Embedder = HashingEmbedder()
    assert embedder.dim == 256
    assert all(len(vector) == 256 for vector in embedder.embed(TEXTS))
    assert len(HashingEmbedder(dim=8).embed(["a b c"])[0]) == 8


def test_a_dimension_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one dimension"):
        HashingEmbedder(dim=0)


def test_the_same_text_gives_the_same_vector_every_time() -> None:
    embedder = HashingEmbedder()
    assert embedder.embed(TEXTS) == embedder.embed(TEXTS)
    assert HashingEmbedder().embed(TEXTS) == embedder.embed(TEXTS)


def test_the_same_text_gives_the_same_vector_in_another_interpreter() -> None:
    # Another interpreter has another PYTHONHASHSEED: this fails if hash() sneaks in.
    script = (
        "import json, sys\n"
        "from projections.embeddings.embedder import HashingEmbedder\n"
        "print(json.dumps(HashingEmbedder().embed(json.loads(sys.argv[1]))))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, json.dumps(TEXTS)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "12345"},
    )
    assert json.loads(result.stdout) == HashingEmbedder().embed(TEXTS)


def test_vectors_have_unit_length() -> None:
    for vector in HashingEmbedder().embed([*TEXTS, "a", "word " * 500]):
        assert math.isclose(math.sqrt(sum(x * x for x in vector)), 1.0, rel_tol=1e-6)


def test_similar_texts_are_closer_than_unrelated_ones() -> None:
    base, similar, unrelated = HashingEmbedder().embed(
        [
            "the user is allergic to peanuts and tree nuts",
            "the user has a peanut allergy and is allergic to tree nuts",
            "quarterly revenue grew in the european market",
        ]
    )
    assert cosine_distance(base, similar) < cosine_distance(base, unrelated)
    assert cosine_distance(base, similar) < 0.6


def test_word_order_and_case_matter_only_through_bigrams() -> None:
    embedder = HashingEmbedder()
    upper, lower, reordered = embedder.embed(["Window Seat", "window seat", "seat window"])
    assert upper == lower
    assert reordered != lower
    assert cosine_distance(lower, reordered) < 1.0


def test_text_without_words_gives_one_fixed_unit_vector() -> None:
    empty, punctuation, spaces = HashingEmbedder(dim=16).embed(["", "?!… --", "   \n"])
    assert empty == punctuation == spaces == [1.0] + [0.0] * 15


def test_tokens_are_lowercase_unicode_words_then_bigrams() -> None:
    assert tokens("Hello, Wörld! 東京") == ["hello", "wörld", "東京", "hello wörld", "wörld 東京"]
    assert tokens("") == []


def test_memory_text_is_the_kind_then_the_values_in_key_order() -> None:
    value = {
        "seat": "window",
        "airline": {"name": "Lufthansa", "alliances": ["Star", "Alliance"]},
        "legroom_cm": 81,
        "ratio": 0.5,
        "confirmed": True,
        "note": None,
        "empty": "",
    }
    assert memory_text(value, "travel_preference") == (
        "travel_preference Star Alliance Lufthansa 81 0.5 window"
    )
    # The same memory with its keys in another order (as jsonb returns them) has the same text.
    assert memory_text(dict(reversed(list(value.items()))), "travel_preference") == memory_text(
        value, "travel_preference"
    )
    assert memory_text({}, "note") == "note"


def test_message_text_takes_texts_tool_results_and_tool_calls() -> None:
    content: list[dict[str, Any]] = [
        {"type": "text", "text": "What's the weather in Oslo?"},
        {
            "type": "tool_use",
            "id": "toolu_1",
            "name": "get_weather",
            "input": {"units": "metric", "city": "Oslo", "days": 3, "detailed": True},
        },
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "Rain, 7 degrees"},
        {
            "type": "tool_result",
            "tool_use_id": "toolu_2",
            "content": [
                {"type": "text", "text": "Wind from the north"},
                {"type": "image", "source": {"type": "base64", "data": "iVBORw0KGgo="}},
                {"type": "forecast", "summary": "clearing up", "hours": 6},
                "plain string",
            ],
        },
    ]
    assert message_text(content) == (
        "What's the weather in Oslo? get_weather Oslo metric Rain, 7 degrees"
        " Wind from the north clearing up plain string"
    )


def test_message_text_of_no_words_is_empty() -> None:
    assert message_text([]) == ""
    assert message_text([{"type": "tool_result", "tool_use_id": "t", "content": []}]) == ""
