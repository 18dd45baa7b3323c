"""Lexical ranking: the words of an entry's text as search terms, one score per entry, and
the fusion of a lexical and a semantic ranking. Pure: every vector store tokenises and scores
through here, so that each ranks a query's candidates alike (PostgreSQL keeps the terms in a
``tsvector`` and selects the matching entries through its GIN index; the fake and LanceDB
tokenise the candidates' texts as they rank them).

Exact words matter where an embedding blurs them: invoice numbers, ticket ids, product codes,
names. PostgreSQL's parser (its ``simple`` configuration included) reads ``INV-2024-0042`` as
``inv``, ``-2024``, ``-0042``: the id's digits become signed numbers that ``INV-2023-0042``
shares half of, and ``INV20240042`` matches nothing. Here a run of letters and digits joined
by ``- _ . / : #`` is kept whole (``inv-2024-0042``), without its separators
(``inv20240042``) and as its parts (``inv``, ``2024``, ``0042``): the id written any of those
ways finds it, and its parts still find it among others (ops/decisions/hybrid-retrieval.md).
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

# A word: letters and digits, optionally joined by one separator at a time (``AB-12-X``,
# ``a.b``, ``10:30``). A separator at a word's end (a full stop, a dash) is no part of it.
SEPARATORS = "-_./:#"
_COMPOUND = re.compile(rf"[^\W_]+(?:[{re.escape(SEPARATORS)}][^\W_]+)*")
_PART = re.compile(r"[^\W_]+")
# Longer runs (an encoded blob, a hash) are no search terms, and PostgreSQL refuses a lexeme of
# 2 KB or more.
MAX_TERM_CHARS = 64
# Terms kept per text, first seen first: a long message's terms stay well under the 1 MB a
# tsvector holds (4,096 terms of at most 64 characters).
MAX_TERMS = 4096


def terms(text: str) -> tuple[str, ...]:
    """The search terms of ``text``, each once, sorted: its words case-folded (NFKC), each
    joined word also whole and without its separators."""
    normalised = unicodedata.normalize("NFKC", text).casefold()
    found: dict[str, None] = {}
    for compound in _COMPOUND.finditer(normalised):
        parts = _PART.findall(compound.group())
        words = parts if len(parts) == 1 else [compound.group(), "".join(parts), *parts]
        for word in words:
            if len(word) <= MAX_TERM_CHARS:
                found[word] = None
        if len(found) >= MAX_TERMS:
            break
    return tuple(sorted(list(found)[:MAX_TERMS]))


# English function words: a query's ``the``, ``by`` or ``of`` carries no subject, and in a
# subject of a few dozen memories its weight is no lower than an id's part (measured: with them
# the lexical ranking proposed memories sharing only ``by`` with a paraphrase, and hybrid lost
# recall on paraphrases; ops/decisions/hybrid-retrieval.md). Entries keep every term.
FUNCTION_WORDS = frozenset(
    [
        "a", "about", "after", "all", "also", "am", "an", "and", "any", "are", "as", "at", "be",
        "been", "before", "being", "but", "by", "can", "could", "did", "do", "does", "doing",
        "during", "each", "for", "from", "had", "has", "have", "having", "he", "her", "here",
        "hers", "him", "his", "how", "i", "if", "in", "into", "is", "it", "its", "just", "me",
        "more", "most", "my", "no", "nor", "not", "now", "of", "off", "on", "once", "only", "or",
        "other", "our", "out", "over", "own", "same", "she", "should", "so", "some", "such", "than",
        "that", "the", "their", "them", "then", "there", "these", "they", "this", "those",
        "through", "to", "too", "under", "until", "up", "very", "was", "we", "were", "what", "when",
        "where", "which", "while", "who", "whom", "why", "will", "with", "would", "you", "your"
    ]
)  # fmt: skip


def query_terms(text: str) -> tuple[str, ...]:
    """The terms a search looks for: ``terms`` without the function words, unless the query
    is nothing but function words."""
    found = terms(text)
    return tuple(term for term in found if term not in FUNCTION_WORDS) or found


def without_separators(term: str) -> str:
    """``term`` with the separators of a joined word taken out. Every term of a text, so
    squeezed, is a substring of the text case-folded and so squeezed: a scan can leave out a
    text that holds no query term without taking its terms (an ASCII query term: case-folding
    and NFKC leave ASCII text as lowercasing does)."""
    return term.translate(_SQUEEZE)


_SQUEEZE = str.maketrans("", "", SEPARATORS)


def inverse_frequency(matching: int, total: int) -> float:
    """How much a term weighs when ``matching`` of the ``total`` candidates hold it (BM25's
    idf, never negative): a rare term (an id) outweighs a common one (a function word)."""
    total = max(total, matching)
    return math.log(1.0 + (total - matching + 0.5) / (matching + 0.5))


def term_weights(frequency: Mapping[str, int], total: int) -> dict[str, float]:
    """The weight of each query term held by ``frequency[term]`` of ``total`` candidates."""
    return {term: inverse_frequency(count, total) for term, count in frequency.items() if count}


def score(weights: Mapping[str, float], held: Iterable[str]) -> float:
    """A candidate's score: the weights of the query terms it holds, summed in term order (a
    sum in another order may differ in the last bit, and ties go by id)."""
    return sum(weights[term] for term in sorted(set(held)) if term in weights)


def lexical_ranking(
    query: Iterable[str],
    documents: Sequence[tuple[str, Iterable[str]]],
    total: int,
    limit: int,
) -> list[tuple[float, str]]:
    """The ``limit`` best of ``documents`` (id, terms) for the ``query`` terms: (score, id),
    best first, ties by id. A document's ``score`` sums the weights of the query terms it
    holds (``term_weights`` among ``total`` candidates; ``documents`` must hold every
    candidate that has one of the terms); one that holds none is left out."""
    wanted = frozenset(query)
    if limit < 1 or not wanted:
        return []
    held = [(entry_id, wanted.intersection(words)) for entry_id, words in documents]
    weights = term_weights(Counter(term for _, found in held for term in found), total)
    scored = [(score(weights, found), entry_id) for entry_id, found in held if found]
    scored.sort(key=lambda hit: (-hit[0], hit[1]))
    return scored[:limit]


# Reciprocal rank fusion's constant: a hit's share is 1 / (k + its rank). 60 is the value of
# the method's paper; measured on the labelled set (tests/projections/test_hybrid_retrieval.py).
RRF_K = 60


def fuse(rankings: Sequence[Sequence[str]], k: int = RRF_K) -> list[str]:
    """Reciprocal rank fusion: the ids of every ranking (best first), ordered by the sum over
    rankings of 1 / (k + rank), rank counted from 1; ties by id. An id twice in one ranking
    counts at its best rank."""
    scores: dict[str, float] = {}
    for ranking in rankings:
        for rank, entry_id in enumerate(dict.fromkeys(ranking), start=1):
            scores[entry_id] = scores.get(entry_id, 0.0) + 1.0 / (k + rank)
    return sorted(scores, key=lambda entry_id: (-scores[entry_id], entry_id))
