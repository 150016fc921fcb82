"""Which policy serves each tenant in online mode (docs/policies.md, "Online tenants").

A tenant may have its own policy (an adapter policy: ``POST /v1/tenants/policy {"tenant_id", "policy"}``);
every conversation of it then starts a session bound to that policy, so its users are served by that
policy whatever model name their client sends (another policy's name too: it is only echoed, so a tenant
cannot learn which other policies exist; ``GET /v1/models`` shows it its own alone). Tenants without one
are bound to the default policy: they share it. A tenant's traffic is never served by another tenant's
policy.

The map is durable (the store's meta table); a policy bound to a tenant cannot be unloaded (409
``policy_in_use``). A new binding applies to the tenant's conversations from their next session (a
conversation keeps the policy its session was bound to; sessions end when idle).
"""

from __future__ import annotations

import logging

from rlgate.core.policies import PolicyRegistry
from rlgate.core.request_scope import ScopedStore, on_write_failure
from rlgate.online.conversations import tenant_of

__all__ = ["META_KEY", "TenantPolicies"]

log = logging.getLogger("rlgate.online")

META_KEY = "tenant_policies"  # the store's meta entry: {tenant id: policy name}


class TenantPolicies:
    """Tenant id -> the policy serving it (absent: the default policy)."""

    def __init__(self, store: ScopedStore, policies: PolicyRegistry) -> None:
        self.store = store
        self.policies = policies
        saved = store.load_meta().get(META_KEY) or {}
        self._by_tenant: dict[str, str] = {str(k): str(v) for k, v in saved.items()}
        policies.guards.append(self.bound_to)
        policies.discreet = lambda session: tenant_of(session) is not None

    def policy_of(self, tenant_id: str) -> str:
        """The policy a new session of the tenant is bound to."""
        return self._by_tenant.get(tenant_id) or self.policies.default.name

    def bindings(self) -> dict[str, str]:
        return dict(self._by_tenant)

    def bound_to(self, policy: str) -> str | None:
        """Why ``policy`` may not be unloaded (the tenants it serves), or None."""
        tenants = sorted(t for t, p in self._by_tenant.items() if p == policy)
        return f"it serves tenants {', '.join(tenants)} (POST /v1/tenants/policy to move them)" if tenants else None

    def bind(self, tenant_id: str, policy: str | None) -> None:
        """Serve the tenant's next sessions with ``policy`` (None: the default policy)."""
        if policy is not None:
            policy = self.policies.require(policy).name
        previous = self._by_tenant.get(tenant_id)
        if policy is None or policy == self.policies.default.name:
            self._by_tenant.pop(tenant_id, None)
        else:
            self._by_tenant[tenant_id] = policy
        self.store.save_meta(META_KEY, dict(self._by_tenant))

        def undo() -> None:
            if previous is None:
                self._by_tenant.pop(tenant_id, None)
            else:
                self._by_tenant[tenant_id] = previous

        on_write_failure(undo)
        log.info("tenant %s: served by policy %s", tenant_id, self.policy_of(tenant_id))

    def forget(self, tenant_id: str) -> None:
        """The tenant was deleted."""
        if self._by_tenant.pop(tenant_id, None) is not None:
            self.store.save_meta(META_KEY, dict(self._by_tenant))
