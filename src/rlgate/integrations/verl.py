"""verl 0.9's agent loop with rlgate in front of verl's rollout servers.

verl's ``AgentLoopManager`` runs one agent loop per dataset row (``AgentLoopBase.run(sampling_params,
**row)``, a class registered by name) and trains on the ``AgentLoopOutput`` each returns:
``prompt_ids``, ``response_ids`` (generated tokens and the tool / user tokens between turns),
``response_mask`` (1 on generated tokens), ``response_logprobs``, ``num_turns``, ``reward_score``,
``metrics``, ``extra_fields`` (read from ``verl/experimental/agent_loop/agent_loop.py`` of verl
0.9.1). :class:`rlgate.integrations.verl_loop.RlgateAgentLoop` is such a loop: it plays the user's
rlgate agent in one session of an rlgate gateway (``rlgate serve --engine vllm|sglang
--backend-url`` pointed at verl's rollout servers: docs/remote-engines.md) and returns the
episode's conversation chain (``integrations/episodes.py``) as that output.

This module holds what does not need verl (the settings, the row -> agent data mapping, the
output fields) so it imports and is tested without verl; ``verl_loop.py`` is the class verl
instantiates (it imports verl).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rlgate.integrations.episodes import Chain
from rlgate.rollout.runner import EPISODE_TIMEOUT_S

__all__ = ["VerlLoopSettings", "agent_data", "output_fields"]


@dataclass(frozen=True)
class VerlLoopSettings:
    """Where the loop plays: set as keys of its entry in verl's agent-loop YAML
    (``actor_rollout_ref.rollout.agent.agent_loop_config_path``), else from the environment."""

    gateway_url: str  # the rlgate gateway (RLGATE_GATEWAY_URL)
    admin_key: str  # its admin key (RLGATE_ADMIN_KEY; never logged)
    agent: str  # "module:attr": an rlgate agent class, object or function (RLGATE_AGENT)
    agent_kwargs: Mapping[str, Any] | None = None  # keyword arguments for an agent class
    episode_timeout: float = EPISODE_TIMEOUT_S

    @classmethod
    def resolve(cls, gateway_url: str | None = None, admin_key: str | None = None, agent: str | None = None,
                agent_kwargs: Mapping[str, Any] | None = None,
                episode_timeout: float = EPISODE_TIMEOUT_S) -> VerlLoopSettings:
        url = gateway_url or os.environ.get("RLGATE_GATEWAY_URL")
        key = admin_key or os.environ.get("RLGATE_ADMIN_KEY")
        spec = agent or os.environ.get("RLGATE_AGENT")
        missing = [name for name, v in (("gateway_url / RLGATE_GATEWAY_URL", url), ("admin_key / RLGATE_ADMIN_KEY",
                                                                                   key), ("agent / RLGATE_AGENT", spec))
                   if not v]
        if missing:
            raise ValueError(f"rlgate agent loop: set {', '.join(missing)} (its entry in the agent-loop YAML, "
                             "or the environment of verl's agent-loop workers)")
        assert url and key and spec
        return cls(url.rstrip("/"), key, spec, dict(agent_kwargs or {}), episode_timeout)


def agent_data(row: Mapping[str, Any], sampling_params: Mapping[str, Any]) -> dict[str, Any]:
    """The agent's ``data`` for a verl dataset row (``RLHFDataset.__getitem__``'s fields): the
    row's ``extra_info`` keys, ``messages`` (its ``raw_prompt``), ``ground_truth`` (from
    ``reward_model``), ``data_source``, and ``temperature`` / ``top_p`` from verl's sampling
    parameters unless ``extra_info`` sets them."""
    extra = row.get("extra_info") or {}
    data: dict[str, Any] = {k: _plain(v) for k, v in dict(extra).items()}
    data.setdefault("messages", _plain(row.get("raw_prompt") or []))
    reward_model = row.get("reward_model") or {}
    if isinstance(reward_model, Mapping) and "ground_truth" in reward_model:
        data.setdefault("ground_truth", _plain(reward_model["ground_truth"]))
    if row.get("data_source") is not None:
        data.setdefault("data_source", str(row["data_source"]))
    for k in ("temperature", "top_p"):
        if k in sampling_params:
            data.setdefault(k, float(sampling_params[k]))
    return data


def _plain(v: Any) -> Any:
    """numpy arrays / scalars from verl's batch as lists / Python scalars."""
    if hasattr(v, "tolist"):
        return v.tolist()
    if isinstance(v, Mapping):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


def output_fields(chain: Chain, *, response_length: int, fallback_prompt_ids: list[int], eos: int,
                  seconds: float, prompt_length: int | None = None) -> dict[str, Any]:
    """``AgentLoopOutput``'s fields for a played chain. The response is cut at ``response_length``
    and a longer prompt is left-truncated to ``prompt_length`` (verl pads both to those lengths, and
    its batch cannot hold a longer row; its own loops truncate the same way), the tokens cut counted
    in ``extra_fields["rlgate_prompt_tokens_cut"]``. A failed episode (no chain) gets
    ``fallback_prompt_ids``, one masked ``eos`` token, reward 0.0 and ``extra_fields["rlgate_failed"]``:
    verl takes one output per row."""
    extra: dict[str, Any] = {"rlgate_session_id": chain.session_id, "rlgate_failed": not chain.ok,
                             "rlgate_dropped_chains": chain.dropped_chains, "rlgate_version": chain.min_version,
                             "turn_scores": [], "tool_rewards": []}
    metrics = {"generate_sequences": seconds, "tool_calls": 0.0, "compute_score": 0.0, "num_preempted": -1}
    if not chain.ok:
        extra["rlgate_error"] = chain.error
        return {"prompt_ids": list(fallback_prompt_ids), "response_ids": [eos], "response_mask": [0],
                "response_logprobs": [0.0], "reward_score": 0.0, "num_turns": 0, "metrics": metrics,
                "extra_fields": extra}
    n = response_length
    prompt = list(chain.prompt_ids)
    if prompt_length is not None and len(prompt) > prompt_length:
        extra["rlgate_prompt_tokens_cut"] = len(prompt) - prompt_length
        prompt = prompt[len(prompt) - prompt_length:]
    return {"prompt_ids": prompt, "response_ids": chain.response_ids[:n],
            "response_mask": chain.response_mask[:n], "response_logprobs": chain.response_logprobs[:n],
            "reward_score": float(chain.reward) if chain.reward is not None else None,
            # verl counts user, assistant and tool messages: one prompt turn plus a reply (and its
            # tool / user turn) per LLM call
            "num_turns": 2 * chain.turns, "metrics": metrics, "extra_fields": extra}
