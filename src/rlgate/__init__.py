"""rlgate: the RL gateway for LLM agents.

Public surface (everything else is internal and may change)::

    Gateway and client
      GatewayClient, SessionHandle, GatewayClientError   control-route client
      GatewayConfig                                       server configuration
      create_app, Engine, Store, open_store               the app factory, what it serves from
                                                          and keeps sessions in
    Trajectories
      Sample                                              one exported training sequence
    Rollout (agents in GRPO groups)
      Agent, RolloutRunner, Allowance, Episode, Group     the agent contract, the runner
      FinishedEpisode                                     what a reward function sees
      AgentError, RunError, AgentContractError,           episode failures / run-stopping errors
      TooManyFailures
    Training
      TrainConfig, load_config, ConfigError               the run configuration (strict)
      GatewaySettings                                     its gateway: section (also the trl adapters')
      RolloutSettings                                     its rollout: section (also the trl adapters')
      OnlineTrainConfig                                   its grpo: and train: sections for the online trainer
      run_training, Hooks, TrainRun, EvalResult,          the loop wiring `rlgate train` and the demo use
      Interrupt                                           (Interrupt: stop a run from another thread)
      GRPOTrainer, GRPOConfig, grpo_loop, LoopState,      the GRPO trainer and loop (import torch)
      StepResult, TrainingStalled
      WeightSync, ColocatedSync, RemoteSync               pushing weights to the serving policy

Public modules (``PUBLIC_MODULES``): beyond the names above, the docs teach these modules; their
``__all__`` is public too. Every other module is internal and may change
(``tests/test_public_api.py`` checks that each import the docs and examples show is public)::

    rlgate.config                  GatewayConfig, ClusterConfig
    rlgate.engine                  the engine contract, its capabilities, the engines
    rlgate.store                   the store contract, MemoryStore, open_store
    rlgate.trajectory.export       samples to tensors, JSONL, Parquet, and back
    rlgate.trajectory.formats      samples in TRL / verl / OpenRLHF layouts (``rlgate export``)
    rlgate.integrations.trl        a rollout_func for TRL's GRPOTrainer (docs/integrations.md)
    rlgate.integrations.trl_async  a rollout worker and weight transfer for TRL's AsyncGRPOTrainer
    rlgate.integrations.verl       an agent loop for verl 0.9 (docs/integrations.md)
    rlgate.cluster                 replicas on Ray behind a router
    rlgate.cluster.collector       finished trajectories from every replica
    rlgate.agents                  black-box CLI agents (Claude Code, Codex)
    rlgate.agents.bugfix           the bug-fix task for them
    rlgate.demo.math_agent         the demo's SDK agents, as examples
    rlgate.demo.calculator_agent   the demo's tool-calling agent
    rlgate.demo.agents             the demo's agent for ``rlgate train``
    rlgate.rewards                 built-in reward functions: Judge (an LLM judge)

Names are imported on first use, so ``import rlgate`` stays light (no torch, no FastAPI).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

PUBLIC_MODULES = (
    "rlgate.config",
    "rlgate.engine",
    "rlgate.store",
    "rlgate.trajectory.export",
    "rlgate.trajectory.formats",
    "rlgate.integrations.trl",
    "rlgate.integrations.trl_async",
    "rlgate.integrations.verl",
    "rlgate.cluster",
    "rlgate.cluster.collector",
    "rlgate.agents",
    "rlgate.agents.bugfix",
    "rlgate.demo.math_agent",
    "rlgate.demo.calculator_agent",
    "rlgate.demo.agents",
    "rlgate.rewards",
)

_WHERE = {
    "GatewayClient": "rlgate.client.gateway",
    "GatewayClientError": "rlgate.client.gateway",
    "SessionHandle": "rlgate.client.gateway",
    "GatewayConfig": "rlgate.config",
    "create_app": "rlgate.server.app",
    "Engine": "rlgate.engine.base",
    "Store": "rlgate.store.base",
    "open_store": "rlgate.store",
    "Sample": "rlgate.trajectory.sample",
    "Agent": "rlgate.rollout.agent",
    "RolloutRunner": "rlgate.rollout.runner",
    "Allowance": "rlgate.rollout.runner",
    "Episode": "rlgate.rollout.runner",
    "Group": "rlgate.rollout.runner",
    "FinishedEpisode": "rlgate.trajectory.reward",
    "AgentError": "rlgate.rollout.errors",
    "RunError": "rlgate.rollout.errors",
    "AgentContractError": "rlgate.rollout.errors",
    "TooManyFailures": "rlgate.rollout.errors",
    "TrainConfig": "rlgate.train.config",
    "OnlineTrainConfig": "rlgate.train.config",
    "GatewaySettings": "rlgate.train.config",
    "RolloutSettings": "rlgate.train.config",
    "GRPOConfig": "rlgate.train.config",
    "ConfigError": "rlgate.train.config",
    "load_config": "rlgate.train.config",
    "run_training": "rlgate.train.run",
    "Hooks": "rlgate.train.run",
    "TrainRun": "rlgate.train.run",
    "EvalResult": "rlgate.train.run",
    "Interrupt": "rlgate.train.run",
    "GRPOTrainer": "rlgate.train.grpo",
    "grpo_loop": "rlgate.train.grpo",
    "LoopState": "rlgate.train.grpo",
    "StepResult": "rlgate.train.grpo",
    "TrainingStalled": "rlgate.train.grpo",
    "WeightSync": "rlgate.train.sync",
    "ColocatedSync": "rlgate.train.sync",
    "RemoteSync": "rlgate.train.sync",
}

__all__ = [
    "Agent",
    "AgentContractError",
    "AgentError",
    "Allowance",
    "ColocatedSync",
    "ConfigError",
    "Engine",
    "Episode",
    "EvalResult",
    "FinishedEpisode",
    "GRPOConfig",
    "GRPOTrainer",
    "GatewayClient",
    "GatewayClientError",
    "GatewayConfig",
    "GatewaySettings",
    "Group",
    "Hooks",
    "Interrupt",
    "LoopState",
    "RemoteSync",
    "RolloutRunner",
    "RolloutSettings",
    "RunError",
    "Sample",
    "SessionHandle",
    "StepResult",
    "Store",
    "TooManyFailures",
    "TrainConfig",
    "OnlineTrainConfig",
    "TrainRun",
    "TrainingStalled",
    "WeightSync",
    "create_app",
    "grpo_loop",
    "load_config",
    "open_store",
    "run_training",
    "__version__",
]


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name]), name)
        globals()[name] = value  # resolved once
        return value
    raise AttributeError(f"module 'rlgate' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:  # for type checkers and IDEs; at run time names resolve through __getattr__
    from rlgate.client.gateway import GatewayClient, GatewayClientError, SessionHandle
    from rlgate.config import GatewayConfig
    from rlgate.engine.base import Engine
    from rlgate.rollout.agent import Agent
    from rlgate.rollout.errors import AgentContractError, AgentError, RunError, TooManyFailures
    from rlgate.rollout.runner import Allowance, Episode, Group, RolloutRunner
    from rlgate.server.app import create_app
    from rlgate.store import open_store
    from rlgate.store.base import Store
    from rlgate.train.config import ConfigError, GRPOConfig, OnlineTrainConfig, TrainConfig, load_config
    from rlgate.train.grpo import GRPOTrainer, LoopState, StepResult, TrainingStalled, grpo_loop
    from rlgate.train.run import EvalResult, Hooks, Interrupt, TrainRun, run_training
    from rlgate.train.sync import ColocatedSync, RemoteSync, WeightSync
    from rlgate.trajectory.reward import FinishedEpisode
    from rlgate.trajectory.sample import Sample
