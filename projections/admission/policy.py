"""A tenant's admission policy: which memory kinds are admitted, held for review or refused,
whether their evidence is required, and which source types count as derived. Pure.

A policy is immutable once stored under its (tenant, version): a change is a new version, so
an event decided under version N is decided the same way by every rebuild. Version 0 is no
policy at all: contract 1.1's behaviour, nothing checked.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from topics.envelope import Identifier

WriteDecision = Literal["admit", "review", "refuse"]
# The source types whose memories are derived from other memory rather than observed; a
# policy may add its own.
DERIVED_SOURCE_TYPES: frozenset[str] = frozenset({"summary", "memory", "inference"})
# The kind of a bounded approval: always reviewed, its value shape-checked.
GRANT_KIND = "grant"
NO_POLICY_VERSION = 0


@dataclass(frozen=True, slots=True)
class Rule:
    kind: str
    decision: WriteDecision
    scope: str | None = None
    evidence_required: bool = False
    # Source types that count as derived for this kind, beyond the policy's.
    derived_source_types: frozenset[str] = frozenset()

    @property
    def name(self) -> str:
        """How a review names the rule that asked for it."""
        return f"policy:{self.kind}" if self.scope is None else f"policy:{self.kind}/{self.scope}"


@dataclass(frozen=True, slots=True)
class Policy:
    tenant_id: str
    version: int
    rules: tuple[Rule, ...] = ()
    # For a kind no rule names.
    default: WriteDecision = "admit"
    derived_source_types: frozenset[str] = frozenset()
    _by_key: dict[tuple[str, str | None], Rule] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        for rule in self.rules:
            self._by_key.setdefault((rule.kind, rule.scope), rule)

    @property
    def governs(self) -> bool:
        """False for version 0: no policy, contract 1.1's behaviour."""
        return self.version != NO_POLICY_VERSION

    def rule_for(self, kind: str, scope: str) -> Rule | None:
        """The rule of this kind in this scope, else the kind's rule for every scope."""
        return self._by_key.get((kind, scope)) or self._by_key.get((kind, None))

    def decision_for(self, kind: str, scope: str) -> WriteDecision:
        rule = self.rule_for(kind, scope)
        return self.default if rule is None else rule.decision

    def derived_types_for(self, kind: str, scope: str) -> frozenset[str]:
        rule = self.rule_for(kind, scope)
        extra = rule.derived_source_types if rule is not None else frozenset()
        return DERIVED_SOURCE_TYPES | self.derived_source_types | extra


def no_policy(tenant_id: str) -> Policy:
    return Policy(tenant_id, NO_POLICY_VERSION)


class _Document(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RuleDocument(_Document):
    kind: Identifier
    scope: Identifier | None = None
    decision: WriteDecision
    evidence_required: bool = False
    derived_source_types: tuple[Identifier, ...] = ()


class PolicyDocument(_Document):
    """A policy as an operator writes it (YAML) and as ``admission_policies.rules`` keeps it."""

    default: WriteDecision = "admit"
    derived_source_types: tuple[Identifier, ...] = ()
    rules: tuple[RuleDocument, ...] = Field(default=(), max_length=10_000)

    def check(self) -> PolicyDocument:
        """This document, if no two rules name the same kind and scope."""
        seen: set[tuple[str, str | None]] = set()
        for rule in self.rules:
            key = (rule.kind, rule.scope)
            if key in seen:
                scope = "every scope" if rule.scope is None else f"scope {rule.scope!r}"
                raise ValueError(f"two rules for kind {rule.kind!r} in {scope}")
            seen.add(key)
        return self

    def policy(self, tenant_id: str, version: int) -> Policy:
        return Policy(
            tenant_id,
            version,
            tuple(
                Rule(
                    kind=r.kind,
                    decision=r.decision,
                    scope=r.scope,
                    evidence_required=r.evidence_required,
                    derived_source_types=frozenset(r.derived_source_types),
                )
                for r in self.rules
            ),
            self.default,
            frozenset(self.derived_source_types),
        )


def parse_document(raw: Any) -> PolicyDocument:
    """A policy document from parsed YAML or JSON (``None``, an empty file, is no rules).
    Raises ``ValueError`` (pydantic's ``ValidationError`` is one) when it is not one."""
    if raw is None:
        raw = {}
    return PolicyDocument.model_validate(raw).check()


EMPTY_DOCUMENT = PolicyDocument()


class AdmissionObserver(Protocol):
    """Where the admission decisions are counted (the metrics)."""

    def admitted(self, decision: str, cause: str, count: int) -> None: ...

    def instruction_matched(self, rule: str, count: int) -> None: ...
