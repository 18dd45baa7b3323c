"""The governed-writes invariant, executable: every applied version names the admission policy
version it was decided under (one that exists), and every admitted version whose policy
requires evidence cites evidence, all of it available. Pure: the caller gathers the facts (from
a reducer's output, or from PostgreSQL) and gets the violations, described without content.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from projections.admission.policy import NO_POLICY_VERSION, Policy
from topics.outputs import ELIGIBLE_STATUSES

# The writes an admission decision admits (a review's approval admits what was decided then).
ADMITTED_BY_POLICY = frozenset({"memory.proposed", "memory.corrected"})


@dataclass(frozen=True, slots=True)
class VersionFacts:
    tenant_id: str
    memory_id: str
    version: int
    kind: str
    scope: str
    status: str
    event_type: str
    policy_version: int | None
    evidence_event_ids: tuple[str, ...]


def violations(
    versions: Iterable[VersionFacts],
    policies: Mapping[tuple[str, int], Policy],
    available: Callable[[str, str], bool],
) -> list[str]:
    """What breaks the invariant; ``available(tenant, event_id)`` says whether memproj holds
    that event (applied, not erased)."""
    found: list[str] = []
    for v in versions:
        where = f"{v.tenant_id}/{v.memory_id} v{v.version}"
        if v.policy_version is None or v.policy_version < 0:
            found.append(f"{where}: names no policy version")
            continue
        if v.policy_version == NO_POLICY_VERSION:
            continue
        policy = policies.get((v.tenant_id, v.policy_version))
        if policy is None:
            found.append(f"{where}: policy version {v.policy_version} is not stored")
            continue
        if v.event_type not in ADMITTED_BY_POLICY or v.status not in ELIGIBLE_STATUSES:
            continue
        rule = policy.rule_for(v.kind, v.scope)
        if rule is None or not rule.evidence_required:
            continue
        if not v.evidence_event_ids:
            found.append(f"{where}: admitted under a policy requiring evidence, cites none")
        missing = [e for e in v.evidence_event_ids if not available(v.tenant_id, e)]
        if missing:
            found.append(f"{where}: {len(missing)} cited evidence events not available")
    return found
