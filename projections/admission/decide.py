"""The admission decision of one memory write: (the write, its stamp, the policy of the
stamp's version) -> admit, hold for review, or refuse with a reason. Pure: the evidence was
looked up when the event was sealed (its ``AdmissionStamp``), so a rebuild decides the same.

The order, each rule once:
1. no policy (version 0): admit, nothing checked (contract 1.1);
2. a grant whose value lacks the grant's shape: refused ``invalid_grant``;
3. the kind's decision ``refuse``: ``kind_not_admitted``;
4. evidence required and none cited, or a cited id not available: ``evidence_unavailable``;
5. made ``verified`` while its source is derived and no cited evidence is primary:
   ``derived_evidence``;
6. a value holding active instructions: held for review (``instruction:<rule>``);
7. a grant: held for review (``grant``);
8. the kind's decision ``review``: held (``policy:<kind>[/<scope>]``); else admitted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from projections.admission.instructions import instruction_rules
from projections.admission.policy import GRANT_KIND, Policy, WriteDecision
from topics.memory import AdmissionStamp, EvidenceStamp
from topics.outputs import RejectionReason

# The bounded ``kind_rule`` label of the admissions metric: what decided, never the kind.
Cause = Literal["no_policy", "default", "rule", "instruction", "grant", "evidence", "shape"]
GRANT_FIELDS = ("object_id", "action", "limits", "approver")
UNSTAMPED = AdmissionStamp(policy_version=0)


@dataclass(frozen=True, slots=True)
class Verdict:
    decision: WriteDecision
    cause: Cause
    # Set when refused.
    reason: RejectionReason | None = None
    details: str = ""
    # Set when held: the rule that asked for the review.
    review_rule: str | None = None
    # The instruction rules the value matched (held or not: a refusal outranks them).
    instructions: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Write:
    """What a proposal or correction would make: the fields the decision reads."""

    kind: str
    scope: str
    value: Mapping[str, Any]
    source_type: str
    expires_at: datetime | None
    # The memory's evidence: a proposal's own, a correction's memory's.
    evidence_event_ids: Sequence[str]
    # Set when the write makes the memory verified.
    verification: str | None


def grant_problem(value: Mapping[str, Any], expires_at: datetime | None) -> str | None:
    """Why a grant's value is not a bounded approval, or None when it is one."""
    missing = [name for name in GRANT_FIELDS if name not in value]
    if missing:
        return f"a grant's value needs {', '.join(missing)}"
    if not isinstance(value["object_id"], str) or not value["object_id"]:
        return "a grant's object_id is a non-empty string"
    if not isinstance(value["action"], str) or not value["action"]:
        return "a grant's action is a non-empty string"
    if not isinstance(value["limits"], dict):
        return "a grant's limits are a JSON object"
    approver = value["approver"]
    if not (
        isinstance(approver, dict)
        and all(isinstance(approver.get(k), str) and approver.get(k) for k in ("type", "id"))
    ):
        return "a grant's approver is {type, id}"
    if expires_at is None:
        return "a grant needs expires_at"
    return None


def _evidence_missing(cited: Sequence[str], evidence: EvidenceStamp) -> str | None:
    if not cited:
        return "the policy requires evidence and none is cited"
    available = set(evidence.available)
    missing = [event_id for event_id in cited if event_id not in available]
    if missing:
        return f"{len(missing)} of {len(cited)} cited evidence events are not available"
    return None


def _derived_without_primary(
    source_type: str, derived: frozenset[str], cited: Sequence[str], evidence: EvidenceStamp
) -> bool:
    return source_type in derived and set(cited).isdisjoint(evidence.primary)


def decide_write(write: Write, stamp: AdmissionStamp, policy: Policy) -> Verdict:
    """The decision of a ``memory.proposed`` or ``memory.corrected`` (see the module's order)."""
    if not policy.governs:
        return Verdict("admit", "no_policy")
    kind, scope = write.kind, write.scope
    rule = policy.rule_for(kind, scope)
    decision = policy.decision_for(kind, scope)
    cause: Cause = "default" if rule is None else "rule"
    if kind == GRANT_KIND:
        problem = grant_problem(write.value, write.expires_at)
        if problem is not None:
            return Verdict("refuse", "shape", RejectionReason.INVALID_GRANT, problem)
    if decision == "refuse":
        return Verdict(
            "refuse",
            cause,
            RejectionReason.KIND_NOT_ADMITTED,
            f"policy version {policy.version} refuses kind {kind!r} in scope {scope!r}",
        )
    if rule is not None and rule.evidence_required:
        missing = _evidence_missing(write.evidence_event_ids, stamp.evidence)
        if missing is not None:
            return Verdict("refuse", "evidence", RejectionReason.EVIDENCE_UNAVAILABLE, missing)
    if write.verification is not None and _derived_without_primary(
        write.source_type,
        policy.derived_types_for(kind, scope),
        write.evidence_event_ids,
        stamp.evidence,
    ):
        return Verdict("refuse", "evidence", *_derived_refusal(write.source_type))
    instructions = instruction_rules(write.value)
    if instructions:
        held_by = f"instruction:{instructions[0]}"
        return Verdict("review", "instruction", review_rule=held_by, instructions=instructions)
    if kind == GRANT_KIND:
        return Verdict("review", "grant", review_rule=GRANT_KIND)
    if decision == "review":
        return Verdict("review", cause, review_rule="policy:default" if rule is None else rule.name)
    return Verdict("admit", cause)


def decide_verification(
    kind: str,
    scope: str,
    source_type: str,
    evidence_event_ids: Sequence[str],
    stamp: AdmissionStamp,
    policy: Policy,
) -> Verdict:
    """A ``memory.verified`` of a memory: a derived one needs primary evidence."""
    if not policy.governs:
        return Verdict("admit", "no_policy")
    derived = policy.derived_types_for(kind, scope)
    if _derived_without_primary(source_type, derived, evidence_event_ids, stamp.evidence):
        return Verdict("refuse", "evidence", *_derived_refusal(source_type))
    return Verdict("admit", "default" if policy.rule_for(kind, scope) is None else "rule")


def _derived_refusal(source_type: str) -> tuple[RejectionReason, str]:
    return (
        RejectionReason.DERIVED_EVIDENCE,
        f"a memory from a {source_type!r} source is verified only on primary evidence",
    )
