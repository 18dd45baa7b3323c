"""Dead letters without plaintext: each letter's original is sealed under a key of its own.

A dead letter keeps what a failure needs for diagnosis and replay (the original value, its key,
the error's detail), and that is personal data for as long as the letter lives. So every letter
is sealed (AES-256-GCM) under a fresh data key; the key is stored here, wrapped, with the
letter's owner as far as the message can be read (``owner_of``: tenant, subject, memory,
conversation, the original key) and an expiry at the end of the DLQ retention. The letter on
the topic is then readable exactly while its key row lives:

- an erasure destroys the keys of the letters whose owner it covers (``shred_dead_letters``,
  called by the erasure itself), and a letter born after the erasure of its owner is stored
  erased (``save_keys``);
- the deletion worker destroys every key at its expiry (``destroy_expired``), when the topic's
  retention (the same window, ``DEAD_LETTER_RETENTION_MS``) lets the ciphertext go too.

A letter must never be published before its key row is durable: the projections store the keys
in their batch's transaction, the agents before they publish (``PostgresLetterKeys``).

Each key row names the master key that wrapped it (``master_key_id``); the newest configured
master key wraps new ones, and ``rewrap_letter_keys`` moves the others to it (rotation).
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, Protocol

import orjson
from psycopg_pool import AsyncConnectionPool

from projections.bookkeeping import Conn, OutboxMessage
from projections.deletion import store as deletion_store
from projections.deletion.erasure import (
    EntityKey,
    conversation_key,
    memory_key,
    source_conversation,
    subject_key,
)
from projections.sealing.crypto import (
    DEFAULT_MASTER_KEY_ID,
    MasterKeys,
    Unreadable,
    as_master_keys,
    derive_key,
    encode_associated,
    new_data_key,
    open_bytes,
    seal_bytes,
    unwrap_key,
    wrap_key,
)
from topics.envelope import Subject
from topics.outputs import KEY_MAX_CHARS, ORIGINAL_MAX_BYTES, DeadLetter, SealedOriginal
from topics.registry import DEAD_LETTER_RETENTION_MS

LETTER_FORMAT = "memproj.dlq.aes256gcm.1"
DEAD_LETTER_RETENTION = timedelta(milliseconds=DEAD_LETTER_RETENTION_MS)
# The HKDF purpose of the key that wraps the letters' keys: the master key itself wraps none.
_WRAPPING_PURPOSE = b"memproj dead-letter keys v1"
# Contract identifiers are at most 128 characters; anything longer names no owner.
_ID_MAX_CHARS = 128
_MESSAGE_KEY_MAX_CHARS = 2 * _ID_MAX_CHARS + 1
_HEADER_LENGTH_BYTES = 4


# -- the owner of a letter (pure) -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LetterOwner:
    """Whom a dead letter is about, as far as its message can be read; None where not."""

    tenant_id: str | None = None
    subject_type: str | None = None
    subject_id: str | None = None
    memory_id: str | None = None
    conversation_id: str | None = None
    # The original key, when it can be a contract key ("<tenant_id>:<entity_id>").
    message_key: str | None = None
    # The event's occurred_at, for the erasure cut-off; None: not readable.
    occurred_at: datetime | None = None

    def erasure_keys(self) -> list[EntityKey]:
        """The erasure index entries that cover this letter: its subject, memory and
        conversation, and the entity its key names (either kind: erasing a letter too many is
        harmless, one too few is not)."""
        keys: list[EntityKey] = []
        tenant = self.tenant_id
        if tenant is not None:
            if self.subject_type is not None and self.subject_id is not None:
                keys.append(subject_key(tenant, self.subject_type, self.subject_id))
            if self.memory_id is not None:
                keys.append(memory_key(tenant, self.memory_id))
            if self.conversation_id is not None:
                keys.append(conversation_key(tenant, self.conversation_id))
        if self.message_key is not None:
            for key_tenant, entity_id in _key_splits(self.message_key):
                keys += [memory_key(key_tenant, entity_id), conversation_key(key_tenant, entity_id)]
        return keys


def owner_of(key: bytes | None, value: bytes | None) -> LetterOwner:
    """The owner of a message as far as it can be read, from any input: the JSON value's
    tenant, subject (or conversation owner), memory, conversation (or the one a memory's source
    points into) and time, wherever in the envelope or a record they are; the key when it
    can be a contract key. Whatever is missing, of a wrong type or not an identifier is None."""
    message_key = _message_key(key)
    document = _json_object(value)
    places = [document]
    payload = document.get("payload")
    if isinstance(payload, dict):
        places.insert(0, payload)

    def found(name: str) -> Any:
        return next((place[name] for place in places if name in place), None)

    subject_type, subject_id = _pair(found("subject"))
    if subject_id is None:
        subject_type, subject_id = _pair(found("owner"))
    if subject_id is None:
        subject_type, subject_id = _ident(found("owner_type")), _ident(found("owner_id"))
    conversation_id = _ident(found("conversation_id"))
    if conversation_id is None:
        conversation_id = _source_conversation(found("source"))
    tenant_id = _ident(document.get("tenant_id"))
    if tenant_id is None and message_key is not None:
        # Only an unambiguous key names its tenant: with two colons, either part may be it
        # (the erasure still reaches the letter through every split of its key).
        tenant_id = _ident(message_key.partition(":")[0]) if message_key.count(":") == 1 else None
    return LetterOwner(
        tenant_id=tenant_id,
        subject_type=subject_type if subject_id is not None else None,
        subject_id=subject_id if subject_type is not None else None,
        memory_id=_ident(found("memory_id")),
        conversation_id=conversation_id,
        message_key=message_key,
        occurred_at=_time(document.get("occurred_at")),
    )


def _json_object(value: bytes | None) -> dict[str, Any]:
    if not value:
        return {}
    try:
        document = orjson.loads(value)
    except (orjson.JSONDecodeError, RecursionError):
        return {}
    return document if isinstance(document, dict) else {}


def _ident(value: Any) -> str | None:
    if isinstance(value, str) and 0 < len(value) <= _ID_MAX_CHARS and "\x00" not in value:
        return value
    return None


def _pair(value: Any) -> tuple[str | None, str | None]:
    if not isinstance(value, dict):
        return None, None
    return _ident(value.get("type")), _ident(value.get("id"))


def _source_conversation(value: Any) -> str | None:
    if not isinstance(value, dict):
        return None
    source_type, ref = value.get("type"), value.get("ref")
    if not isinstance(source_type, str) or not isinstance(ref, str) or len(ref) > 512:
        return None
    return _ident(source_conversation(source_type, ref))


def _message_key(key: bytes | None) -> str | None:
    if key is None or len(key) > 4 * _MESSAGE_KEY_MAX_CHARS:
        return None
    try:
        text = key.decode()
    except UnicodeDecodeError:
        return None
    if ":" not in text or len(text) > _MESSAGE_KEY_MAX_CHARS or "\x00" in text:
        return None
    return text


def _key_splits(message_key: str) -> list[tuple[str, str]]:
    """Every (tenant, entity) the key can be: a tenant id may hold a colon itself."""
    splits = []
    for at, char in enumerate(message_key):
        if char == ":":
            tenant, entity = _ident(message_key[:at]), _ident(message_key[at + 1 :])
            if tenant is not None and entity is not None:
                splits.append((tenant, entity))
    return splits


def _time(value: Any) -> datetime | None:
    if not isinstance(value, str) or len(value) > 64:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None


# -- sealing (pure) ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LetterKey:
    """The key row of one dead letter: its data key wrapped, its owner and its expiry."""

    key_id: str
    wrapped_key: bytes
    topic: str
    partition: int
    offset: int
    owner: LetterOwner
    failed_at: datetime
    expires_at: datetime
    master_key_id: str = DEFAULT_MASTER_KEY_ID


@dataclass(frozen=True, slots=True)
class Opened:
    """What a letter's seal holds."""

    value: bytes
    key: bytes | None
    detail: str


@dataclass(frozen=True, slots=True)
class Position:
    """Where the message of a letter was read: bound to the seal, so that a sealed original
    cannot be moved to another letter."""

    topic: str
    partition: int
    offset: int


class LetterSealer:
    """Seals letters under fresh data keys and opens them with their stored wrapped key."""

    def __init__(
        self, master_keys: bytes | MasterKeys, retention: timedelta = DEAD_LETTER_RETENTION
    ) -> None:
        self.master_keys = as_master_keys(master_keys)
        self._wrapping = {
            key_id: derive_key(key, _WRAPPING_PURPOSE) for key_id, key in self.master_keys
        }
        self.retention = retention

    @property
    def key_id(self) -> str:
        """The id of the master key that wraps new letter keys: the newest."""
        return self.master_keys.newest_id

    def wrap(self, key_id: str, data_key: bytes) -> bytes:
        return wrap_key(self._wrapping[self.key_id], data_key, _wrapping_associated(key_id))

    def unwrap(self, key_id: str, wrapped_key: bytes, master_key_id: str) -> bytes:
        self.master_keys.key(master_key_id)  # names a missing master key clearly
        wrapping = self._wrapping[master_key_id]
        return unwrap_key(wrapping, wrapped_key, _wrapping_associated(key_id))

    def seal(
        self,
        at: Position,
        key: bytes | None,
        value: bytes | None,
        detail: str,
        failed_at: datetime,
    ) -> tuple[SealedOriginal, LetterKey]:
        """The sealed original (its first ORIGINAL_MAX_BYTES, the key's first KEY_MAX_CHARS
        bytes, the error's detail) and the key row it opens with."""
        key_id = str(uuid.uuid4())
        data_key = new_data_key()
        header = orjson.dumps(
            {
                "key": None if key is None else base64.b64encode(key[:KEY_MAX_CHARS]).decode(),
                "detail": detail,
            }
        )
        plaintext = (
            len(header).to_bytes(_HEADER_LENGTH_BYTES, "big")
            + header
            + (value or b"")[:ORIGINAL_MAX_BYTES]
        )
        ciphertext = seal_bytes(data_key, plaintext, _letter_associated(key_id, at))
        sealed = SealedOriginal(
            format=LETTER_FORMAT,
            key_id=key_id,
            ciphertext=base64.b64encode(ciphertext).decode(),
        )
        row = LetterKey(
            key_id=key_id,
            wrapped_key=self.wrap(key_id, data_key),
            topic=at.topic,
            partition=at.partition,
            offset=at.offset,
            owner=owner_of(key, value),
            failed_at=failed_at,
            expires_at=failed_at + self.retention,
            master_key_id=self.key_id,
        )
        return sealed, row

    def open(
        self,
        sealed: SealedOriginal,
        wrapped_key: bytes,
        at: Position,
        master_key_id: str = DEFAULT_MASTER_KEY_ID,
    ) -> Opened:
        """The letter's original, or ``Unreadable`` (tampered, moved, or not this key)."""
        if sealed.format != LETTER_FORMAT:
            raise Unreadable(f"unknown dead-letter format {sealed.format!r}")
        data_key = self.unwrap(sealed.key_id, wrapped_key, master_key_id)
        try:
            ciphertext = base64.b64decode(sealed.ciphertext, validate=True)
        except ValueError as exc:
            raise Unreadable("the sealed original is not base64") from exc
        plaintext = open_bytes(data_key, ciphertext, _letter_associated(sealed.key_id, at))
        length = int.from_bytes(plaintext[:_HEADER_LENGTH_BYTES], "big")
        header = orjson.loads(plaintext[_HEADER_LENGTH_BYTES : _HEADER_LENGTH_BYTES + length])
        key = header["key"]
        return Opened(
            value=plaintext[_HEADER_LENGTH_BYTES + length :],
            key=None if key is None else base64.b64decode(key),
            detail=header["detail"],
        )


def _letter_associated(key_id: str, at: Position) -> bytes:
    return encode_associated(LETTER_FORMAT, key_id, at.topic, at.partition, at.offset)


def _wrapping_associated(key_id: str) -> bytes:
    return encode_associated("dead-letter-key", key_id)


@dataclass(frozen=True, slots=True, kw_only=True)
class DeadLetterMessage(OutboxMessage):
    """A dead letter to publish, with the key row that must be durable before it is."""

    letter_key: LetterKey = field(compare=False)


def letter_keys(messages: Iterable[OutboxMessage]) -> list[LetterKey]:
    """The key rows of the dead letters among ``messages``."""
    return [m.letter_key for m in messages if isinstance(m, DeadLetterMessage)]


# -- the key store ----------------------------------------------------------------------------


class LetterKeys(Protocol):
    """Where letter keys become durable: in the caller's transaction, or in their own."""

    async def save_in(self, conn: Conn, keys: Sequence[LetterKey]) -> None: ...

    async def save(self, keys: Sequence[LetterKey]) -> None: ...


class PostgresLetterKeys:
    def __init__(self, pool: AsyncConnectionPool[Conn]) -> None:
        self._pool = pool

    async def save_in(self, conn: Conn, keys: Sequence[LetterKey]) -> None:
        await save_keys(conn, keys)

    async def save(self, keys: Sequence[LetterKey]) -> None:
        if keys:
            async with self._pool.connection() as conn, conn.transaction():
                await save_keys(conn, keys)


class UnpublishedLetterKeys:
    """For a run that publishes no dead letter (a rebuild stops at its first instead): its
    letters are never read, so their keys are not kept."""

    async def save_in(self, conn: Conn, keys: Sequence[LetterKey]) -> None:
        return None

    async def save(self, keys: Sequence[LetterKey]) -> None:
        return None


_EPOCH = datetime.min.replace(tzinfo=UTC)


async def save_keys(conn: Conn, keys: Sequence[LetterKey]) -> None:
    """Store letter keys in the caller's transaction. A letter whose owner is already erased
    (at or after its event's time; any time, when the time is unreadable) is stored erased:
    the erasure came first and covers it. The owners' tenant locks are taken shared, as every
    projection write does, so that an erasure either commits first and is seen here, or
    comes after and destroys these keys."""
    if not keys:
        return
    tenants = {k.owner.tenant_id for k in keys if k.owner.tenant_id is not None}
    tenants |= {t for k in keys if k.owner.message_key for t, _ in _key_splits(k.owner.message_key)}
    await deletion_store.lock_tenants(conn, tenants, exclusive=False)
    erasures = await deletion_store.load_erasures(
        conn, (entry for k in keys for entry in k.owner.erasure_keys())
    )
    rows = []
    for k in keys:
        erasure = erasures.covering(k.owner.erasure_keys(), k.owner.occurred_at or _EPOCH)
        owner = k.owner if erasure is None else LetterOwner(tenant_id=k.owner.tenant_id)
        rows.append(
            (
                k.key_id,
                None if erasure is not None else k.wrapped_key,
                k.topic,
                k.partition,
                k.offset,
                owner.tenant_id,
                owner.subject_type,
                owner.subject_id,
                owner.memory_id,
                owner.conversation_id,
                owner.message_key,
                k.failed_at,
                k.expires_at,
                None if erasure is None else erasure.deletion_id,
                None if erasure is None else k.failed_at,
                k.master_key_id,
            )
        )
    async with conn.cursor() as cursor:
        await cursor.executemany(
            'INSERT INTO dead_letter_keys (key_id, wrapped_key, topic, "partition", "offset",'
            " tenant_id, subject_type, subject_id, memory_id, conversation_id, message_key,"
            " failed_at, expires_at, erased_by, erased_at, master_key_id)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
            " ON CONFLICT (key_id) DO NOTHING",
            rows,
        )


async def shred_dead_letters(
    conn: Conn,
    tenant_id: str,
    subject: Subject | None,
    memory_ids: Sequence[str],
    conversation_ids: Sequence[str],
    deletion_id: str,
) -> int:
    """Destroy the keys of the letters an erasure covers: those naming its subject, its
    memories or conversations (in their value or as their key). Their rows stay, without key
    and owner, until they expire, so that ``memproj dlq`` can say the letter was erased."""
    entities = [*memory_ids, *conversation_ids]
    cursor = await conn.execute(
        "UPDATE dead_letter_keys SET wrapped_key = NULL, erased_by = %(deletion)s,"
        " erased_at = now(), subject_type = NULL, subject_id = NULL, memory_id = NULL,"
        " conversation_id = NULL, message_key = NULL"
        " WHERE wrapped_key IS NOT NULL AND ((tenant_id = %(tenant)s AND ("
        "(subject_type = %(subject_type)s AND subject_id = %(subject_id)s)"
        " OR memory_id = ANY(%(memories)s) OR conversation_id = ANY(%(conversations)s)))"
        " OR message_key = ANY(%(keys)s))",
        {
            "deletion": deletion_id,
            "tenant": tenant_id,
            "subject_type": subject.type if subject else None,
            "subject_id": subject.id if subject else None,
            "memories": list(memory_ids),
            "conversations": list(conversation_ids),
            "keys": [f"{tenant_id}:{entity}" for entity in entities],
        },
    )
    return cursor.rowcount


async def destroy_expired(conn: Conn, now: datetime) -> int:
    """Delete every letter key past its expiry (and the rows of erased letters with it)."""
    cursor = await conn.execute("DELETE FROM dead_letter_keys WHERE expires_at <= %s", (now,))
    return cursor.rowcount


async def rewrap_letter_keys(conn: Conn, sealer: LetterSealer, limit: int) -> dict[str, int]:
    """Re-wrap up to ``limit`` letter keys not wrapped by the newest master key, in the
    caller's transaction; the count per master key they left. Rows another transaction holds
    are skipped (SKIP LOCKED) for a later batch; an erased or expired key is not there to
    update (only live keys are updated, never brought back)."""
    cursor = await conn.execute(
        "SELECT key_id::text, wrapped_key, master_key_id FROM dead_letter_keys"
        " WHERE wrapped_key IS NOT NULL AND master_key_id <> %s"
        " ORDER BY key_id LIMIT %s FOR UPDATE SKIP LOCKED",
        (sealer.key_id, limit),
    )
    rows = []
    from_keys: dict[str, int] = {}
    for key_id, wrapped, master_key_id in await cursor.fetchall():
        data_key = sealer.unwrap(key_id, bytes(wrapped), master_key_id)
        rows.append((sealer.wrap(key_id, data_key), sealer.key_id, key_id))
        from_keys[master_key_id] = from_keys.get(master_key_id, 0) + 1
    if rows:
        async with conn.cursor() as update:
            await update.executemany(
                "UPDATE dead_letter_keys SET wrapped_key = %s, master_key_id = %s"
                " WHERE key_id = %s::uuid AND wrapped_key IS NOT NULL",
                rows,
            )
    return from_keys


async def count_letter_keys_not_newest(conn: Conn, sealer: LetterSealer) -> dict[str, int]:
    cursor = await conn.execute(
        "SELECT master_key_id, count(*) FROM dead_letter_keys"
        " WHERE wrapped_key IS NOT NULL AND master_key_id <> %s GROUP BY master_key_id",
        (sealer.key_id,),
    )
    return {key_id: count for key_id, count in await cursor.fetchall()}


KeyState = Literal["open", "erased", "expired", "missing"]
# What a reader finds: a key state, a letter written before sealing ("plaintext": its
# ``original`` is the contract's base64) or one whose seal does not open with its key.
LetterState = Literal["open", "erased", "expired", "missing", "plaintext", "unreadable"]


@dataclass(frozen=True, slots=True)
class StoredKey:
    wrapped_key: bytes | None
    erased_by: str | None
    expires_at: datetime
    master_key_id: str = DEFAULT_MASTER_KEY_ID


async def load_keys(conn: Conn, key_ids: Iterable[str]) -> dict[str, StoredKey]:
    """The stored rows of these keys (a key id that is no UUID has none)."""
    wanted = sorted({key_id for key_id in key_ids if _is_uuid(key_id)})
    cursor = await conn.execute(
        "SELECT key_id::text, wrapped_key, erased_by, expires_at, master_key_id"
        " FROM dead_letter_keys WHERE key_id = ANY(%s::uuid[])",
        (wanted,),
    )
    return {
        key_id: StoredKey(
            None if wrapped is None else bytes(wrapped), erased_by, expires_at, master_key_id
        )
        for key_id, wrapped, erased_by, expires_at, master_key_id in await cursor.fetchall()
    }


def key_state(
    stored: StoredKey | None,
    failed_at: datetime,
    now: datetime,
    retention: timedelta = DEAD_LETTER_RETENTION,
) -> KeyState:
    """Whether a letter opens: its key is stored (open), was destroyed by an erasure, or is
    past its expiry (destroyed, or about to be); a letter inside its window without a key row
    is missing (not written by memproj, or its key was lost)."""
    if stored is not None and stored.wrapped_key is None:
        return "erased"
    if stored is not None:
        return "open" if stored.expires_at > now else "expired"
    return "expired" if failed_at + retention <= now else "missing"


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class LetterView:
    """A dead letter as a reader sees it: opened while its key lives."""

    letter: DeadLetter
    state: LetterState
    opened: Opened | None = None
    erased_by: str | None = None


async def open_letters(
    conn: Conn, sealer: LetterSealer, letters: Sequence[DeadLetter], now: datetime
) -> list[LetterView]:
    """Open each letter whose key lives; say why the others do not open."""
    sealed_ids = [lt.sealed_original.key_id for lt in letters if lt.sealed_original is not None]
    stored = await load_keys(conn, sealed_ids) if sealed_ids else {}
    views = []
    for letter in letters:
        sealed = letter.sealed_original
        if sealed is None:
            original = base64.b64decode(letter.original)
            key = None if letter.key is None else letter.key.encode()
            views.append(LetterView(letter, "plaintext", Opened(original, key, letter.error)))
            continue
        row = stored.get(sealed.key_id)
        state = key_state(row, letter.failed_at, now, sealer.retention)
        if state != "open" or row is None or row.wrapped_key is None:
            views.append(LetterView(letter, state, erased_by=row.erased_by if row else None))
            continue
        at = Position(letter.topic, letter.partition, letter.offset)
        try:
            opened = sealer.open(sealed, row.wrapped_key, at, row.master_key_id)
            views.append(LetterView(letter, "open", opened))
        except (Unreadable, ValueError, KeyError, TypeError):
            views.append(LetterView(letter, "unreadable"))
    return views
