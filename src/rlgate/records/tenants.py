"""Tenants: one API key per application or customer, created and revoked by the admin.

A tenant's key reaches the generation routes, ``POST /v1/feedback``, its feedback and its own
data's deletion (``api/online/``) - and only its own conversations (``online/conversations.py``
finds them by tenant). Keys are kept as SHA-256 digests only (the key is shown once, when made):
a lookup hashes the presented key and indexes a dict by the digest, so its timing depends on the
digest, not on how much of the secret matched, and the digest found is confirmed with
``hmac.compare_digest``, as the admin key and session keys are (``core/sessions.py``). A revoked
key stops working at once (401); its tenant's data stays until deleted (``online/rights.py``).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from dataclasses import dataclass, field

__all__ = ["KEY_PREFIX", "Tenant", "TenantKeys", "hash_tenant_key", "new_tenant_id", "new_tenant_key"]

KEY_PREFIX = "rlg-tenant-"  # recognisable in a leaked-secret scan
_NAME = re.compile(r"[\x20-\x7e]{1,200}")


@dataclass
class Tenant:
    """One tenant as stored (``Store.save_tenant``)."""

    id: str  # "tn-..." (names sessions: "tenant-{id}-{k}")
    name: str  # the admin's label (printable ASCII)
    key_hash: str  # sha256 hex of the key; the key itself is never stored
    created_at: float = field(default_factory=time.time)
    revoked_at: float | None = None  # set by revocation: the key no longer authenticates

    @property
    def active(self) -> bool:
        return self.revoked_at is None


def hash_tenant_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def new_tenant_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def new_tenant_id() -> str:
    return "tn-" + secrets.token_hex(6)


def check_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise ValueError("a tenant name is 1-200 printable ASCII characters")
    return name


class TenantKeys:
    """The tenants and their key digests in memory (loaded from the store at start-up)."""

    def __init__(self, tenants: list[Tenant] | None = None) -> None:
        self.tenants: dict[str, Tenant] = {}
        self._by_digest: dict[str, str] = {}  # key digest -> tenant id (active tenants only)
        for t in tenants or []:
            self.put(t)

    def put(self, tenant: Tenant) -> None:
        self.tenants[tenant.id] = tenant
        if tenant.active:
            self._by_digest[tenant.key_hash] = tenant.id
        else:
            self._by_digest.pop(tenant.key_hash, None)

    def remove(self, tenant_id: str) -> None:
        tenant = self.tenants.pop(tenant_id, None)
        if tenant is not None and self._by_digest.get(tenant.key_hash) == tenant_id:
            del self._by_digest[tenant.key_hash]

    def identify(self, key: str) -> Tenant | None:
        """The active tenant ``key`` belongs to, else None (see the module docstring)."""
        digest = hash_tenant_key(key)
        tid = self._by_digest.get(digest)
        tenant = self.tenants.get(tid) if tid is not None else None
        if tenant is None or not hmac.compare_digest(tenant.key_hash, digest) or not tenant.active:
            return None
        return tenant
