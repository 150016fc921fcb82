"""The agent loop verl instantiates (imports verl 0.9): ``rlgate_agent``.

Register it in verl's agent-loop YAML (``actor_rollout_ref.rollout.agent.agent_loop_config_path``)::

    - name: rlgate_agent
      _target_: rlgate.integrations.verl_loop.RlgateAgentLoop
      gateway_url: http://gateway-host:8000      # or $RLGATE_GATEWAY_URL
      agent: my_agents:MathAgent                 # or $RLGATE_AGENT; the key: $RLGATE_ADMIN_KEY

and set ``actor_rollout_ref.rollout.agent.default_agent_loop=rlgate_agent`` (or an ``agent_name``
column). What it returns and why: ``integrations/verl.py`` and docs/integrations.md.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, register

from rlgate.client.gateway import GatewayClient
from rlgate.integrations.episodes import play
from rlgate.integrations.verl import VerlLoopSettings, agent_data, output_fields
from rlgate.rollout.runner import RolloutRunner
from rlgate.train.loading import load_agent

__all__ = ["RlgateAgentLoop"]


@register("rlgate_agent")
class RlgateAgentLoop(AgentLoopBase):
    """One verl row = one rlgate episode: the user's agent plays it in a gateway session."""

    def __init__(self, *args: Any, gateway_url: str | None = None, admin_key: str | None = None,
                 agent: str | None = None, agent_kwargs: dict[str, Any] | None = None,
                 episode_timeout: float = 300.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.settings = VerlLoopSettings.resolve(gateway_url, admin_key, agent, agent_kwargs, episode_timeout)
        self.response_length = int(self.rollout_config.response_length)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        s = self.settings
        agent = load_agent(s.agent, dict(s.agent_kwargs or {}))
        client = GatewayClient(s.gateway_url, s.admin_key)
        runner = RolloutRunner(client, agent, export_style="concat", episode_timeout=s.episode_timeout,
                               max_consecutive_failures=0)
        t0 = time.perf_counter()
        try:
            group = f"verl-{kwargs.get('index', uuid.uuid4().hex)}"
            (chain,) = await play(runner, [(group, 0, agent_data(kwargs, sampling_params))])
        finally:
            await runner.aclose()
            await client.aclose()
        fallback: list[int] = []
        if not chain.ok:
            fallback = list(self.tokenizer.apply_chat_template(list(kwargs.get("raw_prompt") or []),
                                                               add_generation_prompt=True, tokenize=True))
        eos = self.tokenizer.eos_token_id if self.tokenizer.eos_token_id is not None else 0
        return AgentLoopOutput(**output_fields(chain, response_length=self.response_length,
                                               fallback_prompt_ids=fallback, eos=int(eos),
                                               seconds=time.perf_counter() - t0))
