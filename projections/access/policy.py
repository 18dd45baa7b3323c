"""The purpose policy, pure: which memories a purpose may read, and the decision for one read.

A purpose reads memories of its kinds and scopes ('*' in either: any) and, if it says so,
conversations (messages, summaries, context views). A purpose without a policy reads nothing.
The policy's filters are handed to the query (before ranking), never applied to a ranked
answer alone; a request that names a kind or scope its purpose may not read is refused, not
answered with less.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

WILDCARD = "*"

Decision = Literal["allowed", "denied"]


class PolicyRefusal(Exception):
    """The request asks for what its purpose may not read (403)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class PurposePolicy:
    tenant_id: str
    purpose: str
    kinds: frozenset[str]
    scopes: frozenset[str]
    conversations: bool = False

    def may_read(self, kind: str, scope: str) -> bool:
        return _admits(self.kinds, kind) and _admits(self.scopes, scope)


@dataclass(frozen=True, slots=True)
class WriteBounds:
    """What an API key's ``propose`` purpose may write: memories of these kinds and scopes
    ('*' in either: any). A key without bounds (None) writes any, as every key did before
    bounds existed."""

    kinds: frozenset[str]
    scopes: frozenset[str]

    def writes_kind(self, kind: str) -> bool:
        return _admits(self.kinds, kind)

    def writes_scope(self, scope: str) -> bool:
        return _admits(self.scopes, scope)

    def may_write(self, kind: str, scope: str) -> bool:
        return self.writes_kind(kind) and self.writes_scope(scope)


def _admits(allowed: frozenset[str], value: str) -> bool:
    return WILDCARD in allowed or value in allowed


def _only(allowed: frozenset[str]) -> frozenset[str] | None:
    """None: any value (the wildcard)."""
    return None if WILDCARD in allowed else allowed


@dataclass(frozen=True, slots=True)
class MemoryFilters:
    """What a read of memories is confined to: None means any."""

    kinds: frozenset[str] | None
    scopes: frozenset[str] | None


def check_purpose(purpose: str, granted: Sequence[str]) -> None:
    if purpose not in granted:
        raise PolicyRefusal("purpose_not_granted", f"this key has no purpose {purpose!r}")


def memory_filters(
    policy: PurposePolicy | None, kind: str | None = None, scope: str | None = None
) -> MemoryFilters:
    """The filters for a read of memories under ``policy``, narrowed to the request's own
    ``kind`` and ``scope``. Refuses a purpose without a policy, or a kind or scope the
    purpose may not read."""
    if policy is None:
        raise PolicyRefusal(
            "purpose_without_policy", "this purpose has no policy: it reads nothing"
        )
    if kind is not None and not _admits(policy.kinds, kind):
        raise PolicyRefusal(
            "kind_not_allowed", f"purpose {policy.purpose!r} may not read kind {kind!r}"
        )
    if scope is not None and not _admits(policy.scopes, scope):
        raise PolicyRefusal(
            "scope_not_allowed", f"purpose {policy.purpose!r} may not read scope {scope!r}"
        )
    kinds = frozenset({kind}) if kind is not None else _only(policy.kinds)
    scopes = frozenset({scope}) if scope is not None else _only(policy.scopes)
    return MemoryFilters(kinds, scopes)


def check_conversations(policy: PurposePolicy | None) -> None:
    if policy is None:
        raise PolicyRefusal(
            "purpose_without_policy", "this purpose has no policy: it reads nothing"
        )
    if not policy.conversations:
        raise PolicyRefusal(
            "conversations_not_allowed", f"purpose {policy.purpose!r} may not read conversations"
        )


@dataclass(frozen=True, slots=True)
class ReadDecision:
    """What the audit records of one read: ids only, never content."""

    decision: Decision
    returned_ids: tuple[str, ...] = ()
    filtered_ids: tuple[str, ...] = ()


def allowed(returned: Iterable[str], filtered: Iterable[str] = ()) -> ReadDecision:
    return ReadDecision("allowed", tuple(returned), tuple(dict.fromkeys(filtered)))


DENIED = ReadDecision("denied")
