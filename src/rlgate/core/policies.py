"""Policies: the base model plus a LoRA adapter (or none), each with its own weight version.

A gateway serves its **default policy** (the engine's own weights, named ``--model-name``) and, on an
engine that serves adapters (``capabilities.ServesAdapters``: the local engine, vLLM, SGLang), up to
``--max-policies`` **adapter policies** loaded at run time (``POST /rl/policies``). Every recorded turn
names the policy that produced it (``Interaction.policy``) and every token its version
(``output_versions``: the adapter's own version for an adapter policy).

Which policy serves a request (:meth:`PolicyRegistry.resolve`):

* a session **bound** to a policy (``/rl/start_session {"policy"}``, or by its first request that named
  an adapter policy) is served by it; a request naming a *different* policy is refused (400
  ``policy_mismatch``), any other ``model`` value is only echoed;
* an unbound session's request whose ``model`` names a policy is served by it (an adapter policy then
  binds the session: one session, one policy);
* otherwise the default policy, while it is the only one; once adapter policies are served, a ``model``
  that names none of them is a 404 ``model_not_found`` (as vLLM answers an unknown LoRA name).

The list is durable: it is kept in the store's meta table, and a restarted gateway loads every adapter
again from its directory at the version it had (:meth:`PolicyRegistry.restore`).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rlgate.config import GatewayConfig
from rlgate.core.request_scope import ScopedStore, on_write_failure
from rlgate.engine.base import Engine
from rlgate.engine.capabilities import ServesAdapters
from rlgate.errors import Conflict, InvalidRequest, NotFound
from rlgate.trajectory.interaction import Session

__all__ = ["META_KEY", "Policy", "PolicyRegistry", "check_policy_name"]

log = logging.getLogger("rlgate.policies")

META_KEY = "policies"  # the store's meta entry: {name: {"path", "version", "loaded_at"}}
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}")


def check_policy_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise InvalidRequest("a policy name is 1-64 characters: letters, digits and . _ : - (not first)",
                             param="name", code="invalid_policy_name")
    return name


@dataclass
class Policy:
    """One policy served by the gateway."""

    name: str
    adapter: str | None  # the engine's adapter (None: the default policy, the engine's own weights)
    path: str | None = None  # the directory its weights were last loaded from (adapter policies)
    loaded_at: float = field(default_factory=time.time)


class PolicyRegistry:
    """The policies a gateway serves (see the module docstring)."""

    def __init__(self, config: GatewayConfig, engine: Engine, store: ScopedStore,
                 sessions: Callable[[], dict[str, Session]]) -> None:
        self.config = config
        self.engine = engine
        self.store = store
        self._sessions = sessions  # the session manager's sessions (who is bound to what)
        self.default = Policy(config.model_name, None)
        self._adapters: dict[str, Policy] = {}
        # Others that keep a policy in use (online/tenant_policies.py): name -> why it may not be unloaded, or None
        self.guards: list[Callable[[str], str | None]] = []
        # Sessions whose requests may not learn which other policies exist (online tenants): a bound one's request
        # naming another policy is served by its own, the name only echoed, instead of a 400 policy_mismatch
        self.discreet: Callable[[Session], bool] = lambda session: False

    # ------------------------------------------------------------------ reading

    @property
    def serves_adapters(self) -> bool:
        return isinstance(self.engine, ServesAdapters)

    def names(self) -> list[str]:
        return [self.default.name, *self._adapters]

    def get(self, name: str | None) -> Policy | None:
        if name is None or name == self.default.name:
            return self.default
        return self._adapters.get(name)

    def all(self) -> list[Policy]:
        return [self.default, *self._adapters.values()]

    def version(self, policy: Policy) -> int:
        if policy.adapter is None:
            return self.engine.version
        assert isinstance(self.engine, ServesAdapters)
        return self.engine.adapter_versions().get(policy.adapter, -1)

    def versions(self) -> dict[str, int]:
        adapters = self.engine.adapter_versions() if isinstance(self.engine, ServesAdapters) else {}
        return {self.default.name: self.engine.version,
                **{p.name: adapters.get(p.adapter or "", -1) for p in self._adapters.values()}}

    def session_version(self, session_id: str) -> int | None:
        """The version now of the policy a session is bound to (unbound: the default's; None: unknown session or
        a policy no longer served): the reference of its exported tokens' version lag."""
        session = self._sessions().get(session_id)
        policy = self.get(session.policy) if session is not None else None
        return self.version(policy) if policy is not None else None

    def usage(self, name: str) -> tuple[int, int]:
        """Active sessions bound to ``name`` and their requests in flight."""
        bound = [s for s in self._sessions().values() if s.policy == name and s.status == "active"]
        return len(bound), sum(s.in_flight for s in bound)

    def describe(self) -> list[dict[str, Any]]:
        out = []
        for p in self.all():
            active, in_flight = self.usage(p.name)
            out.append({"name": p.name, "adapter": p.adapter is not None, "version": self.version(p),
                        "path": p.path, "loaded_at": p.loaded_at, "active_sessions": active,
                        "requests_in_flight": in_flight})
        return out

    # ------------------------------------------------------------------ serving

    def require(self, name: str) -> Policy:
        """The policy ``name`` (404 ``policy_not_found`` naming the served ones)."""
        policy = self.get(name)
        if policy is None:
            raise NotFound(f"no policy {name!r} is served here; policies: {', '.join(self.names())}",
                           param="policy", code="policy_not_found")
        return policy

    def resolve(self, session: Session, model: str | None) -> Policy:
        """The policy that serves ``session``'s request naming ``model`` (see the module docstring)."""
        named = self.get(model) if model else None
        if session.policy is not None:
            bound = self.get(session.policy)
            if bound is None:
                raise NotFound(f"session {session.id} is bound to policy {session.policy!r}, which is no longer "
                               "served", param="model", code="policy_not_found")
            if named is not None and named is not bound and not self.discreet(session):
                raise InvalidRequest(f"session {session.id} is bound to policy {bound.name!r}; this request names "
                                     f"policy {named.name!r}", param="model", code="policy_mismatch")
            return bound
        if named is not None:
            if named.adapter is not None:
                self._bind(session, named.name)
            return named
        if not self._adapters:
            return self.default
        raise NotFound(f"The model `{model}` does not exist: this gateway serves several policies "
                       f"({', '.join(self.names())}); name one in `model`, or bind the session to one "
                       "when it starts (/rl/start_session {\"policy\": ...})", param="model", code="model_not_found")

    def _bind(self, session: Session, name: str) -> None:
        session.policy = name
        self.store.save_session(session)

        def undo() -> None:
            if session.policy == name:
                session.policy = None

        on_write_failure(undo)

    # ------------------------------------------------------------------ changes (admin)

    def _adapter_engine(self) -> ServesAdapters:
        if not isinstance(self.engine, ServesAdapters):
            raise InvalidRequest(f"this gateway's engine ({type(self.engine).__name__}) serves no LoRA adapters",
                                 code="adapters_unsupported")
        return self.engine

    async def load(self, name: str, path: str, version: int | None = None) -> int:
        """A new adapter policy ``name`` from the adapter directory ``path``; its version."""
        check_policy_name(name)
        engine = self._adapter_engine()
        if name == self.default.name or name in self._adapters:
            raise Conflict(f"policy {name!r} exists; push new weights to it with /rl/update_weights "
                           "{\"policy\", \"path\"}", param="name", code="policy_exists")
        if len(self._adapters) >= self.config.max_policies:
            raise Conflict(f"{len(self._adapters)} adapter policies are loaded, the most this gateway holds "
                           f"(--max-policies {self.config.max_policies}): unload one first "
                           "(POST /rl/policies/unload)", param="name", code="policy_limit_reached")
        self._adapters[name] = Policy(name, name, path)  # held while loading: a second load of it is a 409
        try:
            loaded = await engine.load_adapter(name, path, version)
        except BaseException:
            self._adapters.pop(name, None)
            raise
        self._save(lambda: self._adapters.pop(name, None))  # not durable: not listed (a new load replaces it)
        log.info("policy %s loaded from %s: version %d", name, path, loaded)
        return loaded

    async def push(self, name: str, path: str) -> int:
        """New weights for adapter policy ``name`` (an adapter directory); its new version."""
        policy = self.require(name)
        if policy.adapter is None:
            raise InvalidRequest("the default policy's weights are pushed without \"policy\"", param="policy")
        version = await self._adapter_engine().load_adapter(policy.adapter, path)
        previous, policy.path = policy.path, path
        self._save(lambda: setattr(policy, "path", previous))
        log.info("policy %s: weights from %s, version %d", name, path, version)
        return version

    def record_weights(self, name: str, path: str) -> None:
        """Adapter policy ``name`` serves the weights in ``path`` now (a candidate its online learner promoted):
        the directory, and the version it serves, a restart loads."""
        policy = self._adapters.get(name)
        if policy is None:
            return
        policy.path = path
        try:
            self._save(None)
        except Exception:  # noqa: BLE001 - the store's own alarms report it; serving goes on
            log.exception("policy %s: its promoted weights (%s) could not be recorded in the store", name, path)

    def check_full_push(self) -> None:
        """A push of the engine's own weights changes what every adapter computes: refused while any is served."""
        if self._adapters:
            raise Conflict(f"adapter policies are served on these weights ({', '.join(self._adapters)}); a full "
                           "weight push would change all of them: push an adapter with \"policy\", or unload them",
                           param="path", code="adapters_resident")

    async def unload(self, name: str) -> None:
        policy = self.require(name)
        if policy.adapter is None:
            raise InvalidRequest("the default policy cannot be unloaded", param="name")
        for guard in self.guards:
            why = guard(name)
            if why is not None:
                raise Conflict(f"policy {name!r} is in use: {why}", param="name", code="policy_in_use")
        active, in_flight = self.usage(name)
        if active or in_flight:
            raise Conflict(f"policy {name!r} has {active} active sessions ({in_flight} requests in flight): end "
                           "them first", param="name", code="policy_in_use")
        await self._adapter_engine().unload_adapter(policy.adapter)
        del self._adapters[name]
        self._save(None)  # not durable (503): the weights are gone all the same; a restart would load it again
        log.info("policy %s unloaded", name)

    def _save(self, undo: Callable[[], object] | None) -> None:
        """The list to the store's meta table; ``undo``: the in-memory change to take back if it is not written."""
        versions = self.versions()
        self.store.save_meta(META_KEY, {p.name: {"path": p.path, "version": versions[p.name], "loaded_at": p.loaded_at}
                                        for p in self._adapters.values()})
        if undo is not None:
            def take_back() -> None:
                undo()

            on_write_failure(take_back)

    async def restore(self) -> None:
        """Load the adapter policies the store lists (a restart), each at its recorded version."""
        saved = self.store.load_meta().get(META_KEY) or {}
        if not saved:
            return
        if not isinstance(self.engine, ServesAdapters):
            log.error("the store lists %d adapter policies but this engine serves no adapters: not loaded", len(saved))
            return
        for name, entry in saved.items():
            try:
                version = await self.engine.load_adapter(name, entry["path"], entry["version"])
            except Exception as exc:  # noqa: BLE001 - one policy lost is logged, the gateway still starts
                log.error("policy %s: cannot load its adapter again from %s (%s): not served", name, entry.get("path"),
                          exc)
                continue
            self._adapters[name] = Policy(name, name, entry["path"], entry.get("loaded_at") or time.time())
            log.info("policy %s restored from %s at version %d", name, entry["path"], version)
