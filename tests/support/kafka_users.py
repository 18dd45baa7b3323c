"""How tests reach the local broker's SASL_SSL listener: the client settings ``ops/stack env
secure <user>`` prints, and a SCRAM user of a test's own, made with the admin tools ``ops/stack
up`` uses (``ops/kafka/secure_setup.py``), whose password a test may change while a client
uses it (the stack's ``memproj`` user is shared by the other tests)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AclBindingFilter,
    AdminClient,
    ScramMechanism,
    UserScramCredentialDeletion,
)

from streams.kafka import admin_config
from support.environment import REPO

# The stack's script, imported as ops/stack runs it: from its own directory.
sys.path.insert(0, str(REPO / "ops" / "kafka"))

from secure_setup import memproj_acls, set_passwords


def secure_environment(user: str) -> dict[str, str]:
    """``ops/stack env secure USER``: how USER reaches this stack's SASL_SSL listener."""
    out = subprocess.run(
        [str(REPO / "ops" / "stack"), "env", "secure", user],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    pairs = (line.removeprefix("export ").split("=", 1) for line in out.splitlines())
    return {name: value for name, value in pairs}


@dataclass(frozen=True)
class ScramUser:
    name: str
    admin: AdminClient

    def set_password(self, password: str) -> None:
        set_passwords(self.admin, {self.name: password})


@contextlib.contextmanager
def scram_user(plaintext_bootstrap: str, password: str, topic_prefix: str) -> Iterator[ScramUser]:
    """A user with ``password`` and memproj's ACLs on the topics under ``topic_prefix``,
    removed afterwards (its credential and its ACLs)."""
    admin = AdminClient(admin_config(plaintext_bootstrap))
    user = ScramUser(f"memproj-test-{uuid.uuid4().hex[:10]}", admin)
    acls = memproj_acls(f"User:{user.name}", [topic_prefix])
    user.set_password(password)
    for future in admin.create_acls(acls, request_timeout=30).values():
        future.result()
    try:
        yield user
    finally:
        filters = [
            AclBindingFilter(
                acl.restype,
                acl.name,
                acl.resource_pattern_type,
                acl.principal,
                acl.host,
                acl.operation,
                acl.permission_type,
            )
            for acl in acls
        ]
        for future in admin.delete_acls(filters, request_timeout=30).values():
            future.result()
        deletion = UserScramCredentialDeletion(user.name, ScramMechanism.SCRAM_SHA_512)
        for future in admin.alter_user_scram_credentials([deletion]).values():
            future.result()
