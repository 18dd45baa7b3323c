"""Turning memories and messages into vectors. Pure and deterministic.

Every embedder names its model (``name``, stored with the vectors by the vector store: a model
change is a rebuild, never a silent mix) and returns L2-normalised float32 vectors, the same
for the same text in every process, so a replay of the topics rebuilds exactly the vectors it
built the first time. The default is a sentence-embedding model (``wordllama``); the hashing
embedder here needs no dependency at all: it hashes words and word pairs into a fixed number
of dimensions, so it finds shared words but not meaning.
"""

from __future__ import annotations

import hashlib
import math
import re
from array import array
from collections.abc import Iterator, Mapping, Sequence
from itertools import pairwise
from typing import Any, Protocol

_WORD = re.compile(r"\w+")
# Binary media in a tool's result carries no words, only kilobytes of base64.
_MEDIA_BLOCK_TYPES = frozenset({"image"})


class Embedder(Protocol):
    @property
    def name(self) -> str:
        """The model and its dimension, e.g. ``hashing/256``: what the vector store records."""
        ...

    @property
    def dim(self) -> int: ...

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One L2-normalised float32 vector (as Python floats) per text, in order."""
        ...


# wordllama's model, named here so that naming it does not import it (numpy, tokenizers).
WORDLLAMA_CONFIG = "l2_supercat"
WORDLLAMA_DIM = 256  # the only dimension whose weights the wheel ships
WORDLLAMA_NAME = f"wordllama/{WORDLLAMA_CONFIG}/{WORDLLAMA_DIM}"


def hashing_name(dim: int) -> str:
    return f"hashing/{dim}"


class HashingEmbedder:
    """Signed feature hashing of lowercase words and word bigrams, L2-normalised.

    The values are float32 numbers (as Python floats): the vector stores keep float32, so a
    vector read back equals the vector that was embedded.
    """

    __slots__ = ("dim", "name")

    def __init__(self, dim: int = 256) -> None:
        if dim < 1:
            raise ValueError(f"an embedding needs at least one dimension, got {dim}")
        self.dim = dim
        self.name = hashing_name(dim)

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return [self._embed_one(text) for text in texts]

    def _embed_one(self, text: str) -> list[float]:
        vector = [0.0] * self.dim
        for token in tokens(text):
            value = int.from_bytes(hashlib.blake2b(token.encode(), digest_size=8).digest(), "big")
            # The index comes from the low bits and the sign from the top bit, so they are
            # independent for any dim below 2**63.
            sign = -1.0 if value >> 63 else 1.0
            vector[value % self.dim] += sign
        norm = math.sqrt(sum(component * component for component in vector))
        if norm == 0.0:
            # No words (or colliding signs that cancel out).
            return wordless_vector(self.dim)
        return _float32([component / norm for component in vector])


def wordless_vector(dim: int) -> list[float]:
    """The vector of a text without words, whatever the embedder: a fixed unit vector keeps
    cosine distance defined, and every wordless text lands on the same point."""
    return _float32([1.0] + [0.0] * (dim - 1))


def tokens(text: str) -> list[str]:
    """Lowercase words (any script) followed by every pair of adjacent words."""
    words = _WORD.findall(text.lower())
    return words + [f"{first} {second}" for first, second in pairwise(words)]


def _float32(values: list[float]) -> list[float]:
    return array("f", values).tolist()


def memory_text(value: Mapping[str, Any], kind: str) -> str:
    """The kind, then every string and number in the memory's JSON value.

    Keys are visited in sorted order: PostgreSQL's jsonb and the producers order keys
    differently, and the same memory must always give the same text.
    """
    return _join([kind, *_strings(value, numbers=True)])


def message_text(content: Sequence[Mapping[str, Any]]) -> str:
    """The words of a message's content blocks: texts, tool results, tool names and inputs."""
    parts: list[str] = []
    for block in content:
        block_type = block.get("type")
        if block_type == "text":
            parts.extend(_strings(block.get("text"), numbers=False))
        elif block_type == "tool_result":
            parts.extend(_result_strings(block.get("content")))
        elif block_type == "tool_use":
            parts.extend(_strings(block.get("name"), numbers=False))
            parts.extend(_strings(block.get("input"), numbers=False))
    return _join(parts)


def _result_strings(content: Any) -> Iterator[str]:
    if isinstance(content, str):
        yield content
    elif isinstance(content, list):
        for item in content:
            if isinstance(item, str):
                yield item
            elif isinstance(item, Mapping):
                if item.get("type") in _MEDIA_BLOCK_TYPES:
                    continue
                if item.get("type") == "text":
                    yield from _strings(item.get("text"), numbers=False)
                else:
                    # Other blocks are a tool's own JSON: its words, not the block's type tag.
                    fields = {key: field for key, field in item.items() if key != "type"}
                    yield from _strings(fields, numbers=False)


def _strings(value: Any, *, numbers: bool) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, bool) or value is None:
        return
    elif isinstance(value, int | float):
        if numbers:
            yield str(value)
    elif isinstance(value, Mapping):
        for key in sorted(value, key=str):
            yield from _strings(value[key], numbers=numbers)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings(item, numbers=numbers)


def _join(parts: list[str]) -> str:
    return " ".join(part for part in parts if part)
