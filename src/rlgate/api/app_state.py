"""Typed access to what ``create_app`` hangs on ``app.state`` (server/app.py sets every one of them).

The routes and the viewer read the online mode's state through these, never ``getattr(app.state,
...)``: a missing attribute is then a bug ``create_app`` would have to introduce, and mypy sees the types.
"""

from __future__ import annotations

from typing import Any

from rlgate.online.learners import PolicyLearners
from rlgate.online.service import OnlineGateway
from rlgate.online.training import OnlineTraining

__all__ = ["online_learners", "online_state", "online_training"]


def online_state(app: Any) -> OnlineGateway | None:
    """The online serving state (``rlgate serve --online``), or None when the mode is off."""
    state = app.state.online
    assert state is None or isinstance(state, OnlineGateway), type(state)
    return state


def online_training(app: Any) -> OnlineTraining | None:
    """The online trainer and canary (``--online-train``, or ``create_app(online_training=...)``), or None."""
    training = app.state.online_training
    assert training is None or isinstance(training, OnlineTraining), type(training)
    return training


def online_learners(app: Any) -> PolicyLearners | None:
    """The adapter policies' online learners (``--online-train-adapters``), or None."""
    learners = app.state.online_learners
    assert learners is None or isinstance(learners, PolicyLearners), type(learners)
    return learners
