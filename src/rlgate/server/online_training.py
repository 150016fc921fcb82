"""Wiring online training into an app built by ``create_app(..., online=OnlineConfig(online=True))``.

``attach_online_training(app, training)`` (called by ``rlgate serve --online`` and the proof in
``demo/online.py``) binds an :class:`~rlgate.online.training.OnlineTraining` to the gateway, with no
change to what ``create_app`` builds:

* every completed user turn is offered to the live groups (``GenerationService.completed_listeners``);
* the feedback store is tailed into the trainer and the canary (part 1's ``app.state.online``:
  its records, conversations and RewardMap), conversation-level events included (credited to the
  conversation's latest turn);
* the operator's redaction hook (``--redaction-hook``) sees every sample before the trainer does;
* deletions reach the trainer's queue and replay buffer and the canary's bindings (its notifier);
* the canary's admin routes are mounted and its families join ``/metrics``; its guards (non-finite
  steps, reward hacking: ``online/hacking.py``) join the gateway's (``/health``, ``rlgate_guard_firing``);
* the trainer and the feedback tail run for the app's lifetime (inside its lifespan).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

from fastapi import FastAPI
from prometheus_client.core import Metric

from rlgate.api.canary import router as canary_routes
from rlgate.core.generation import Prepared
from rlgate.online.conversations import tenant_of
from rlgate.online.feedback_source import FeedbackTail
from rlgate.online.service import OnlineGateway
from rlgate.online.training import OnlineTraining
from rlgate.server.app import add_routes


class _Collector:
    def __init__(self, training: OnlineTraining) -> None:
        self.training = training

    def collect(self) -> Iterator[Metric]:
        return self.training.collect()


def attach_online_training(app: FastAPI, training: OnlineTraining) -> FastAPI:
    """Bind ``training`` to the app (see the module docstring); returns the app."""
    gateway = app.state.gateway
    online: Any = getattr(app.state, "online", None)
    if not isinstance(online, OnlineGateway):
        raise ValueError("online training needs the online serving mode (create_app(..., online=OnlineConfig("
                         "online=True)), rlgate serve --online)")
    app.state.online_training = training
    conversations = online.conversations

    def offered(p: Prepared) -> None:
        conversation = conversations.conversation_of(p.session, p.interaction)
        training.on_completed(p.interaction, p.sampling, conversation, tenant_of(p.session))

    gateway.generation.completed_listeners.append(offered)
    training.redact = online.redact
    o = training.options
    training.feedback = FeedbackTail(online.records, online.reward_map, training.trainer, training.canary,
                                     find_turn=conversations.find_turn, conversation_of=conversations.conversation_of,
                                     last_turn=conversations.last_turn, redact=online.redact,
                                     bounds=(o.reward_low, o.reward_high))
    online.rights.notifier.on_delete(training.on_deletion)
    training.add_guards(gateway.metrics.guards)
    add_routes(app, canary_routes.router)
    gateway.metrics.registry.register(_Collector(training))
    inner = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(a: Any) -> AsyncIterator[Any]:
        async with inner(a) as state:
            await training.start()
            try:
                yield state
            finally:
                await training.close()

    app.router.lifespan_context = lifespan
    return app
