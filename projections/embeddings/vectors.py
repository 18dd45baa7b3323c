"""The vector store port: embeddings of memories and messages, searchable per tenant and
removable for deletion requests.

``VectorStore`` is the port; ``projections.embeddings.lance`` keeps it in an embedded LanceDB
table on disk. Its methods are synchronous (LanceDB's are): callers run them in a worker
thread.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

from topics.registry import escape_id

EntryKind = Literal["memory", "message"]
KINDS: tuple[EntryKind, ...] = ("memory", "message")

# Where the vectors are kept (``MEMPROJ_VECTOR_STORE``): PostgreSQL's ``vector_entries``
# (``projections.embeddings.postgres``), shared by every process, or an embedded LanceDB
# directory on one node's disk (``projections.embeddings.lance``).
VectorStoreKind = Literal["postgres", "lancedb"]

# How a search by text ranks a subject's memories (``MEMPROJ_SEARCH_MODE``): by meaning (the
# embedder's vectors), by the words it shares with them (``lexical``: ids, codes, names kept
# whole), or both fused by reciprocal rank (``hybrid``).
SearchMode = Literal["hybrid", "semantic", "lexical"]
SEARCH_MODES: tuple[SearchMode, ...] = ("hybrid", "semantic", "lexical")

# The version of a vector table's columns. 2: a memory's kind and scope (``memory_kind``,
# ``scope``), which search filters by before ranking. Each store records it with its vectors
# and refuses a table of another version (``VectorSchemaOutdated``) until it is rebuilt.
SCHEMA_VERSION = 2

# The tables ``memproj replay embeddings`` rebuilds into, beside the live one: named
# ``embeddings_replay_<%Y%m%d%H%M%S>_<hex>`` so that their age can be read from the name.
REPLAY_PREFIX = "embeddings_replay_"


def replay_table_name(now: datetime) -> str:
    return f"{REPLAY_PREFIX}{now.strftime('%Y%m%d%H%M%S')}_{uuid.uuid4().hex[:6]}"


def _part(text: str) -> str:
    """One id part escaped (``topics.registry.escape_id``), so that joined parts split back one
    way only: tenant ``acme:x`` with memory ``m1`` and tenant ``acme`` with memory ``x:m1``
    were one entry, and one tenant's upsert overwrote the other's. An id without either
    character is unchanged, so the entries indexed before stay where they are."""
    return escape_id(text)


def memory_entry_id(tenant_id: str, memory_id: str) -> str:
    return f"memory:{_part(tenant_id)}:{_part(memory_id)}"


def message_entry_id(tenant_id: str, conversation_id: str, message_id: str) -> str:
    return f"message:{_part(tenant_id)}:{_part(conversation_id)}:{_part(message_id)}"


@dataclass(frozen=True, slots=True)
class VectorEntry:
    """One embedded memory or message. The store keeps the vector as float32.

    A memory's entry also carries its kind and scope (a message's: None): what a search is
    confined to before ranking (``MemoryOnly``). Both are fixed for a memory's whole life (no
    event changes them), so an entry's never goes stale; its status and age do change without
    a new vector, and stay the hydration's to judge."""

    id: str
    kind: EntryKind
    tenant_id: str
    subject_type: str
    subject_id: str
    memory_id: str | None
    conversation_id: str | None
    message_id: str | None
    source_type: str
    source_ref: str
    text: str
    version: int
    occurred_at: datetime  # timezone-aware, UTC
    vector: tuple[float, ...]
    memory_kind: str | None  # the memory's kind; None for a message
    scope: str | None  # the memory's scope; None for a message


def stored_kind(entry_id: str, kind: str) -> EntryKind:
    """A stored entry's kind, checked: a store never hands out an entry of an unknown kind."""
    if kind not in KINDS:
        raise ValueError(f"stored entry {entry_id!r} has an unknown kind {kind!r}")
    return kind


def stored_entry(row: Mapping[str, Any], vector: tuple[float, ...]) -> VectorEntry:
    """The entry a store's row holds (its columns by name, the vector decoded by the store).
    Times come back in ``datetime.UTC`` whatever tzinfo the backend returns."""
    return VectorEntry(
        id=row["id"],
        kind=stored_kind(row["id"], row["kind"]),
        tenant_id=row["tenant_id"],
        subject_type=row["subject_type"],
        subject_id=row["subject_id"],
        memory_id=row["memory_id"],
        conversation_id=row["conversation_id"],
        message_id=row["message_id"],
        source_type=row["source_type"],
        source_ref=row["source_ref"],
        text=row["text"],
        version=row["version"],
        occurred_at=row["occurred_at"].astimezone(UTC),
        vector=vector,
        memory_kind=row.get("memory_kind"),
        scope=row.get("scope"),
    )


@dataclass(frozen=True, slots=True)
class EntryRef:
    """What names a stored entry and what an erasure covers it by: the entry without its text
    and vector. Scans that only decide which entries an erasure covers (the ghost audit, the
    verification probe) read these: a VectorEntry's vector alone is a few KB of Python
    floats, and a scan of every entry a tenant's erasures match is tens of thousands."""

    id: str
    kind: EntryKind
    tenant_id: str
    subject_type: str
    subject_id: str
    memory_id: str | None
    conversation_id: str | None
    occurred_at: datetime  # timezone-aware, UTC


def stored_ref(row: Mapping[str, Any]) -> EntryRef:
    """The reference a store's row holds (its columns by name), as ``stored_entry`` reads
    an entry."""
    return EntryRef(
        id=row["id"],
        kind=stored_kind(row["id"], row["kind"]),
        tenant_id=row["tenant_id"],
        subject_type=row["subject_type"],
        subject_id=row["subject_id"],
        memory_id=row["memory_id"],
        conversation_id=row["conversation_id"],
        occurred_at=row["occurred_at"].astimezone(UTC),
    )


@dataclass(frozen=True, slots=True)
class VectorHit:
    entry: VectorEntry
    distance: float  # cosine distance: 0 is the same direction, 2 the opposite one


@dataclass(frozen=True, slots=True)
class RefHit:
    """A hit of ``nearest``: the entry without its text and vector."""

    entry: EntryRef
    distance: float  # cosine distance, as VectorHit's


@dataclass(frozen=True, slots=True)
class Candidate:
    """A hit of ``search_candidates``: what names the entry and what hydration checks it by
    (the version the index holds), without its text or vector."""

    id: str
    kind: EntryKind
    tenant_id: str
    memory_id: str | None
    version: int
    distance: float  # cosine distance, as VectorHit's


@dataclass(frozen=True, slots=True)
class LexicalCandidate:
    """A hit of ``lexical_candidates``: a ``Candidate`` ranked by the words it shares with the
    query (``projections.embeddings.lexical``), without its text or vector."""

    id: str
    kind: EntryKind
    tenant_id: str
    memory_id: str | None
    version: int
    score: float  # higher is better; only the order means anything


@dataclass(frozen=True, slots=True)
class Match:
    """Entries of one tenant that belong to a subject, to conversations, to memories, or that
    have one of the given ids.

    The criteria are alternatives. A match with no criterion besides the tenant matches
    nothing: a deletion request that lost its criteria must never erase a whole tenant.
    """

    tenant_id: str
    subject: tuple[str, str] | None = None  # (subject_type, subject_id)
    conversation_ids: tuple[str, ...] = ()
    memory_ids: tuple[str, ...] = ()
    entry_ids: tuple[str, ...] = ()

    @property
    def is_empty(self) -> bool:
        return (
            self.subject is None
            and not self.conversation_ids
            and not self.memory_ids
            and not self.entry_ids
        )

    def matches(self, entry: VectorEntry | EntryRef) -> bool:
        if entry.tenant_id != self.tenant_id:
            return False
        return (
            (self.subject is not None and (entry.subject_type, entry.subject_id) == self.subject)
            or entry.conversation_id in self.conversation_ids
            or entry.memory_id in self.memory_ids
            or entry.id in self.entry_ids
        )


@dataclass(frozen=True, slots=True)
class MemoryOnly:
    """What a search is confined to before ranking: memory entries (no message), of these
    kinds and scopes (None: any). An empty set admits nothing."""

    kinds: frozenset[str] | None = None
    scopes: frozenset[str] | None = None

    @property
    def admits_nothing(self) -> bool:
        return self.kinds == frozenset() or self.scopes == frozenset()

    def admits(self, entry: VectorEntry) -> bool:
        return (
            entry.kind == "memory"
            and (self.kinds is None or entry.memory_kind in self.kinds)
            and (self.scopes is None or entry.scope in self.scopes)
        )


class VectorStoreRefused(ValueError):
    """The vector store cannot be searched as it is (another model, an older schema, not
    created yet): what needs doing is in the message; no request can change it."""


class VectorStoreMissing(VectorStoreRefused):
    """A reader found no vector table: nothing has created it yet (the embeddings worker
    creates it at its start)."""

    def __init__(self, where: str) -> None:
        super().__init__(
            f"{where} does not exist yet: the embeddings worker creates it when it first starts"
        )


class EmbedderMismatch(VectorStoreRefused):
    """Vectors of one embedder compared with vectors of another."""

    def __init__(self, where: str, stored: str, configured: str) -> None:
        super().__init__(
            f"{where} holds vectors of the embedder {stored}, but the configured embedder is"
            f" {configured}: their vectors cannot be compared. Run `memproj replay embeddings`"
            f" (with the embeddings worker stopped) to rebuild the vectors with {configured},"
            f" or configure MEMPROJ_EMBEDDER back to {stored}"
        )
        self.stored = stored
        self.configured = configured


class VectorSchemaOutdated(VectorStoreRefused):
    """A table written by an older memproj, without the columns search is confined by."""

    def __init__(self, where: str, stored: int, current: int) -> None:
        super().__init__(
            f"{where} has the vector schema {stored}, this memproj reads {current} (the entries"
            " carry the memory's kind and scope, which search filters by before ranking): run"
            " `memproj replay embeddings` (with the embeddings worker stopped) to rebuild it"
        )
        self.stored = stored
        self.current = current


def check_embedder(store: VectorStore, embedder_name: str) -> None:
    """Refuses an embedder whose vectors the store's cannot be compared with."""
    if store.model != embedder_name:
        raise EmbedderMismatch("the vector store", store.model, embedder_name)


class VectorStore(Protocol):
    """Every entry belongs to one tenant: entries are stored under (tenant_id, id), and every
    read names its tenant and returns nothing of another. Every vector comes from one
    embedder, ``model`` (e.g. ``wordllama/l2_supercat/256``)."""

    @property
    def model(self) -> str: ...

    def upsert(self, entries: Sequence[VectorEntry]) -> None:
        """Insert the entries, replacing any stored entry of the same tenant with the same id;
        of several entries with one tenant and id in ``entries``, the last one wins."""
        ...

    def remove(self, match: Match) -> int:
        """Delete the matching entries; how many there were."""
        ...

    def remove_any(self, matches: Sequence[Match]) -> int:
        """Delete the entries any of ``matches`` selects, in one commit (one table version
        for a batch of erasures); how many there were."""
        ...

    def find(self, match: Match) -> list[VectorEntry]:
        """The matching entries (of the match's tenant only), ordered by id."""
        ...

    def find_any(self, matches: Sequence[Match]) -> list[VectorEntry]:
        """The entries any of ``matches`` selects (each of its match's tenant), in one query,
        ordered by tenant and id."""
        ...

    def get(self, tenant_id: str, entry_ids: Sequence[str]) -> list[VectorEntry]:
        """The tenant's stored entries among ``entry_ids``, in that order, each once; unknown
        ids (and other tenants' entries) are left out."""
        ...

    def search(
        self,
        tenant_id: str,
        vector: Sequence[float],
        limit: int,
        subject: tuple[str, str] | None = None,
        only: MemoryOnly | None = None,
    ) -> list[VectorHit]:
        """The ``limit`` entries of the tenant (and subject; with ``only``, memories of its
        kinds and scopes) nearest to ``vector``, nearest first. Other tenants' entries, and
        the ones ``only`` leaves out, are filtered out before ranking, never after."""
        ...

    def search_candidates(
        self,
        tenant_id: str,
        vector: Sequence[float],
        limit: int,
        subject: tuple[str, str] | None = None,
        only: MemoryOnly | None = None,
    ) -> list[Candidate]:
        """``search``'s hits without their text or vector, nearest first: what a read ranks
        and then hydrates from the projection, which holds the content."""
        ...

    def lexical_candidates(
        self,
        tenant_id: str,
        text: str,
        limit: int,
        subject: tuple[str, str] | None = None,
        only: MemoryOnly | None = None,
    ) -> list[LexicalCandidate]:
        """The ``limit`` entries of the tenant (and subject; with ``only``, memories of its
        kinds and scopes) that best match ``text`` word for word, best first (ties by id):
        the search terms of ``projections.embeddings.lexical`` scored by its
        ``lexical_ranking`` among the same candidates ``search`` ranks. An entry sharing no
        term with ``text`` is no hit."""
        ...

    def nearest(
        self, tenant_id: str, vectors: Sequence[Sequence[float]], limit: int
    ) -> list[list[RefHit]]:
        """For each of ``vectors``, the ``limit`` entries of the tenant nearest to it, nearest
        first (ties by id), without text or vector: ``search`` of many query vectors in one
        pass over the tenant's entries (the verification probe asks one per erased item)."""
        ...

    def find_refs(self, match: Match, batch_rows: int) -> Iterator[list[EntryRef]]:
        """The matching entries without text or vector, in batches of at most ``batch_rows``
        (in no particular order): a scan whose memory does not grow with what it finds."""
        ...

    def purge_history(self) -> None:
        """Make removed entries unreachable everywhere, old table versions included."""
        ...

    def history_versions(self) -> int:
        """How many table versions are kept besides the latest one."""
        ...

    def history_find(self, match: Match) -> list[tuple[int, VectorEntry]]:
        """The entries ``match`` finds in the table versions kept besides the latest one,
        each with its version: a removed entry must be in none of them."""
        ...

    def count(self) -> int:
        """How many entries the store holds, of every tenant (a number, no content)."""
        ...

    def tenants(self) -> list[str]:
        """The tenants with entries, sorted (rebuilds compare the store tenant by tenant)."""
        ...

    def entries(self, tenant_id: str) -> list[VectorEntry]:
        """Every entry of the tenant, ordered by id."""
        ...

    def replace_all(self, entries: Sequence[VectorEntry]) -> None:
        """Make ``entries`` the whole content (of every tenant) in one commit."""
        ...


class VectorTables(Protocol):
    """The tables beside a live vector store: the rebuilds of ``memproj replay embeddings``
    (an erasure reaches them too, and they are dropped once older than the rebuild grace
    period), and what each table records."""

    def tables(self) -> Mapping[str, datetime]:
        """Every rebuild table, with when it was created."""
        ...

    def open(self, name: str) -> VectorStore:
        """A rebuild table, whatever embedder it records."""
        ...

    def drop(self, name: str) -> None: ...

    def recorded(self, name: str = "embeddings") -> tuple[str, int]:
        """The embedder and the column version (``SCHEMA_VERSION``) a table records."""
        ...
