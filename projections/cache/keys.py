"""Where the cache keeps its entries in Redis: the one place a key is made, and every part of
it escaped (``key_part``), so that no id can pass for another or widen a SCAN pattern. Pure.

Keys (``<ns>`` is the namespace, ``{<tenant>}`` the tenant in braces)::

    <ns>:cache:{<tenant>}:recall:<subject_type>:<subject_id>:<query_key>
    <ns>:cache:{<tenant>}:context:<conversation_id>
    <ns>:index:{<tenant>}:subject:<subject_type>:<subject_id>   a set of cache keys
    <ns>:index:{<tenant>}:memory:<memory_id>                    a set of cache keys
    <ns>:index:{<tenant>}:conversation:<conversation_id>        a set of cache keys

The braces are a Redis Cluster hash tag: every key of a tenant hashes to the slot of its tenant
alone, so each atomic write (an entry and its indexes; an invalidation's deletions) touches
one slot, on a single Redis and on a cluster alike (``projections.cache.store.connect``;
ops/decisions/redis-cluster.md). Every other brace is escaped, so the tenant's are always the
first pair.
"""

from __future__ import annotations

from dataclasses import dataclass

from projections.cache.entries import Holdings, Subject

# ':' separates key parts and '%' starts an escape, so escaping both keeps keys unambiguous
# (tenant "a:b" + subject "c" never meets tenant "a" + subject "b:c"); braces, so that the only
# hash tag of a key is its tenant's; the others are glob metacharacters, escaped so that no id
# can widen a SCAN pattern built from a key.
_KEY_PART_ESCAPES = str.maketrans({char: f"%{ord(char):02X}" for char in "%:{}*?[]\\"})
_GLOB_ESCAPES = str.maketrans({char: "\\" + char for char in "*?[]\\"})


def key_part(text: str) -> str:
    return text.translate(_KEY_PART_ESCAPES)


def build_key(*parts: str) -> str:
    """The one place a Redis key is made."""
    return ":".join(map(key_part, parts))


def hash_tag(tenant_id: str) -> str:
    """The key part that places a tenant's keys in one Redis Cluster slot: its escaped id in
    braces. Never empty braces (Redis would hash the whole key): a tenant id is not empty."""
    if not tenant_id:
        raise ValueError("a tenant id is not empty")
    return "{" + key_part(tenant_id) + "}"


def tenant_key(namespace: str, kind: str, tenant_id: str, *parts: str) -> str:
    """A key of one tenant (``build_key`` with the tenant's hash tag as its third part)."""
    return ":".join([build_key(namespace, kind), hash_tag(tenant_id), *map(key_part, parts)])


def glob_literal(text: str) -> str:
    return text.translate(_GLOB_ESCAPES)


@dataclass(frozen=True, slots=True)
class TenantKeys:
    namespace: str
    tenant_id: str

    def _key(self, kind: str, *parts: str) -> str:
        return tenant_key(self.namespace, kind, self.tenant_id, *parts)

    def recall(self, subject: Subject, query_key: str) -> str:
        return self._key("cache", "recall", *subject, query_key)

    def context(self, conversation_id: str) -> str:
        return self._key("cache", "context", conversation_id)

    def cache_prefix(self) -> str:
        """What every cache entry's key of this tenant starts with, and no other key."""
        return self._key("cache") + ":"

    def cache_pattern(self) -> str:
        """SCAN pattern matching every cache entry of this tenant and nothing else."""
        return glob_literal(self.cache_prefix()) + "*"

    def subject_index(self, subject: Subject) -> str:
        return self._key("index", "subject", *subject)

    def memory_index(self, memory_id: str) -> str:
        return self._key("index", "memory", memory_id)

    def conversation_index(self, conversation_id: str) -> str:
        return self._key("index", "conversation", conversation_id)

    def indexes(self, holdings: Holdings) -> list[str]:
        return [
            *map(self.subject_index, sorted(holdings.subjects)),
            *map(self.memory_index, sorted(holdings.memory_ids)),
            *map(self.conversation_index, sorted(holdings.conversation_ids)),
        ]
