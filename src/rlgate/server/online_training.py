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
* with adapter policies learning online (``online/learners.py``), each learner gets its own feedback tail
  (its policy's turns only) when its policy is loaded, and completed turns go to their policy's learner;
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
from rlgate.online.learners import PolicyLearners
from rlgate.online.service import OnlineGateway
from rlgate.online.training import OnlineTraining


class _Collector:
    def __init__(self, training: OnlineTraining | PolicyLearners) -> None:
        self.training = training

    def collect(self) -> Iterator[Metric]:
        return self.training.collect()


def _online_of(online: OnlineGateway | None) -> OnlineGateway:
    if online is None:
        raise ValueError("online training needs the online serving mode (create_app(..., online=OnlineConfig("
                         "online=True)), rlgate serve --online)")
    return online


def _feed(online: OnlineGateway, training: OnlineTraining) -> None:
    """The feedback tail and the redaction hook of one training (an adapter policy's: its own turns only)."""
    conversations = online.conversations
    training.redact = online.redact
    o = training.options
    policy = training.policy
    training.feedback = FeedbackTail(online.records, online.reward_map, training.trainer, training.canary,
                                     find_turn=conversations.find_turn, conversation_of=conversations.conversation_of,
                                     last_turn=conversations.last_turn, redact=online.redact,
                                     bounds=(o.reward_low, o.reward_high),
                                     accepts=(lambda turn: turn.policy == policy) if policy is not None else None)


def bind_online_training(gateway: Gateway, online: OnlineGateway | None,
                         training: OnlineTraining | PolicyLearners) -> None:
    """Bind ``training`` (the default policy's, or every adapter policy's learner) to the gateway and its online
    state (see the module docstring)."""
    state = _online_of(online)
    conversations = state.conversations

    def offered(p: Prepared) -> None:
        conversation = conversations.conversation_of(p.session, p.interaction)
        training.on_completed(p.interaction, p.sampling, conversation, tenant_of(p.session))

    gateway.generation.completed_listeners.append(offered)
    if isinstance(training, PolicyLearners):
        training.bind_one = lambda one: _feed(state, one)
    else:
        _feed(state, training)
    state.rights.notifier.on_delete(training.on_deletion)
    training.add_guards(gateway.metrics.guards)
    gateway.metrics.registry.register(_Collector(training))
