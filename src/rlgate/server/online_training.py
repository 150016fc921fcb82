"""Wiring online training into the gateway: ``create_app(..., online=OnlineConfig(online=True),
online_training=training)`` (``rlgate serve --online-train``, the proofs in ``demo/online*.py``).

:func:`bind_online_training` binds an :class:`~rlgate.online.training.OnlineTraining` to the gateway
while ``create_app`` builds the app; ``create_app`` mounts the canary's routes and starts and stops the
training inside the app's own lifespan:

* every completed user turn is offered to the live groups (``GenerationService.completed_listeners``);
* the feedback store is tailed into the trainer and the canary (part 1's ``app.state.online``:
  its records, conversations and RewardMap), conversation-level events included (credited to the
  conversation's latest turn);
* the operator's redaction hook (``--redaction-hook``) sees every sample before the trainer does;
* deletions reach the trainer's queue and replay buffer and the canary's bindings (its notifier);
* the canary's families join ``/metrics``; its guards (non-finite steps, reward hacking:
  ``online/hacking.py``) join the gateway's (``/health``, ``rlgate_guard_firing``).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from rlgate.core.gateway import Gateway
from rlgate.core.generation import Prepared
from rlgate.online.conversations import tenant_of
from rlgate.online.feedback_source import FeedbackTail
from rlgate.online.service import OnlineGateway
from rlgate.online.training import OnlineTraining


class _Collector:
    def __init__(self, training: OnlineTraining) -> None:
        self.training = training

    def collect(self) -> Iterator[Metric]:
        return self.training.collect()


def bind_online_training(gateway: Gateway, online: OnlineGateway | None, training: OnlineTraining) -> None:
    """Bind ``training`` to the gateway and its online state (see the module docstring)."""
    if online is None:
        raise ValueError("online training needs the online serving mode (create_app(..., online=OnlineConfig("
                         "online=True)), rlgate serve --online)")
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
    gateway.metrics.registry.register(_Collector(training))
