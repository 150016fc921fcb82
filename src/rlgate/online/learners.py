"""Adapter policies learning online side by side: one learner per policy, one gateway.

``rlgate serve --online --online-train-adapters`` (docs/policies.md, "Online tenants"). Every adapter
policy the gateway loads (``POST /rl/policies``, or a restart loading the store's list) gets a
**learner**: an :class:`~rlgate.online.training.OnlineTraining` of its own (continuous trainer on its own
adapter, canary between its stable and candidate adapters, live groups, reward-hacking guards, held-out
check), fed only by its own policy's turns. A tenant bound to the policy (``POST /v1/tenants/policy``)
is served by it, so its users' feedback moves its policy and nothing else; tenants without one share
the default policy, which is the base model, frozen (it is the base every adapter was trained on).

:class:`PolicyLearners` routes the gateway's hooks to the learners (a completed turn to its policy's
learner; a deletion to all), shows them (``GET /rl/online`` lists every learner's state under its
policy; the ``rlgate_online_*`` families carry a ``policy`` label) and shares one set of guards among
them (a guard fires while it fires on any policy, its reasons naming the policy). Building a learner
needs torch (``train/online.py: AdapterLearners``); this module does not.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from prometheus_client.core import Metric

from rlgate.engine.base import SamplingParams
from rlgate.errors import InvalidRequest, NotFound
from rlgate.metrics.guards import GuardSet
from rlgate.online.adapter_slots import PolicyRouter
from rlgate.online.canary import Decision
from rlgate.online.rights import Deletion
from rlgate.online.training import OnlineTraining, register_guards
from rlgate.online.versions import TwoSlotEngine
from rlgate.trajectory.interaction import Interaction

log = logging.getLogger("rlgate.online.learners")

# (policy name, its adapter directory, the version it was loaded at) -> its learner, not yet started
Build = Callable[[str, str, int], Awaitable[OnlineTraining]]


class PolicyLearners:
    """The learners of one gateway's adapter policies (see the module docstring)."""

    def __init__(self, router: PolicyRouter, build: Build) -> None:
        self.router = router
        self.build = build
        self.learners: dict[str, OnlineTraining] = {}
        self.bind_one: Callable[[OnlineTraining], None] | None = None  # the gateway's wiring of one learner
        # (policy, directory): a promoted version's weights, what a restart must load (the policy registry's)
        self.on_promoted: Callable[[str, str], None] | None = None
        self._guards: GuardSet | None = None
        self._started = False
        router.learn = self._learn
        router.forget = self._forget

    # ------------------------------------------------------------------ learners come and go with their policies

    async def _learn(self, name: str, path: str, version: int) -> TwoSlotEngine:
        training = await self.build(name, path, version)
        assert training.engines is not None
        training.policy = name

        def promoted(d: Decision) -> None:
            path = training.weights_path(d.version) if training.weights_path is not None else None
            if d.action == "promote" and path is not None and self.on_promoted is not None:
                self.on_promoted(name, path)

        training.canary.listeners.append(promoted)
        if self.bind_one is not None:
            self.bind_one(training)
        if self._guards is not None:
            training.attach_guards(self._guards, self.all)
        self.learners[name] = training
        if self._started:
            await training.start()
        log.info("policy %s learns online from version %d", name, version)
        return training.engines

    async def _forget(self, name: str) -> None:
        training = self.learners.pop(name, None)
        if training is not None:
            await training.close()
            log.info("policy %s: its online learner stopped", name)

    def all(self) -> list[OnlineTraining]:
        return list(self.learners.values())

    def get(self, name: str | None) -> OnlineTraining:
        """The learner of policy ``name`` (400 without a name, 404 for a policy that does not learn here)."""
        if name is None:
            raise InvalidRequest("adapter policies learn online here, each with its own canary: name one in "
                                 f"\"policy\" ({', '.join(self.learners) or 'none is loaded yet'})", param="policy",
                                 code="policy_required")
        training = self.learners.get(name)
        if training is None:
            raise NotFound(f"no policy {name!r} learns online here; learning: {', '.join(self.learners) or 'none'}",
                           param="policy", code="policy_not_found")
        return training

    # ------------------------------------------------------------------ gateway hooks

    def on_completed(self, interaction: Interaction, sampling: SamplingParams, conversation: str,
                     tenant: str | None) -> None:
        training = self.learners.get(interaction.policy or "")
        if training is not None:
            training.on_completed(interaction, sampling, conversation, tenant)

    def on_deletion(self, d: Deletion) -> None:
        for training in self.all():
            training.on_deletion(d)

    def add_guards(self, guards: GuardSet) -> None:
        register_guards(guards, self.all)
        self._guards = guards
        for training in self.all():
            training.attach_guards(guards, self.all)

    async def start(self) -> None:
        self._started = True
        for training in self.all():
            await training.start()

    async def close(self) -> None:
        self._started = False
        trainings = self.all()
        await asyncio.gather(*(t.close() for t in trainings))

    # ------------------------------------------------------------------ shown

    def snapshot(self) -> dict[str, Any]:
        return {"mode": "adapters", "policies": {name: t.snapshot() for name, t in self.learners.items()}}

    def collect(self) -> Iterator[Metric]:
        """Every learner's families, merged, with a ``policy`` label."""
        merged: dict[str, Metric] = {}
        for name, training in self.learners.items():
            for family in training.collect():
                out = merged.get(family.name)
                if out is None:
                    out = merged[family.name] = Metric(family.name, family.documentation, family.type)
                out.samples += [s._replace(labels={**s.labels, "policy": name}) for s in family.samples]
        yield from merged.values()
