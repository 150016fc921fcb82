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

import logging
import time
import uuid
from typing import Any

from verl.experimental.agent_loop import agent_loop as verl_agent_loop
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, register

from rlgate.client.gateway import GatewayClient
from rlgate.integrations.episodes import play
from rlgate.integrations.verl import VerlLoopSettings, agent_data, output_fields
from rlgate.rollout.runner import EPISODE_TIMEOUT_S, RolloutRunner
from rlgate.train.loading import load_agent

__all__ = ["RlgateAgentLoop"]

log = logging.getLogger(__name__)


class RlgateAgentLoop(AgentLoopBase):
    """One verl row = one rlgate episode: the user's agent plays it in a gateway session."""

    def __init__(self, *args: Any, gateway_url: str | None = None, admin_key: str | None = None,
                 agent: str | None = None, agent_kwargs: dict[str, Any] | None = None,
                 episode_timeout: float = EPISODE_TIMEOUT_S, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.settings = VerlLoopSettings.resolve(gateway_url, admin_key, agent, agent_kwargs, episode_timeout)
        self.response_length = int(self.rollout_config.response_length)
        self.prompt_length = int(self.rollout_config.prompt_length)

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
        fields = output_fields(chain, response_length=self.response_length, fallback_prompt_ids=fallback, eos=int(eos),
                               seconds=time.perf_counter() - t0, prompt_length=self.prompt_length)
        if "rlgate_prompt_tokens_cut" in fields["extra_fields"]:
            log.warning("rlgate agent loop: the episode's prompt has %d tokens more than rollout.prompt_length=%d; "
                        "left-truncated for verl's batch (raise prompt_length to train on all of it)",
                        fields["extra_fields"]["rlgate_prompt_tokens_cut"], self.prompt_length)
        return AgentLoopOutput(**fields)


# Registered as "rlgate_agent" unless verl's registry has that name already: verl's AgentLoopWorker loads the
# agent-loop YAML into the registry first and imports this module when it instantiates the entry, and verl's
# register() would then replace the YAML entry, and its keys (gateway_url, agent, ...), by a bare _target_.
if "rlgate_agent" not in verl_agent_loop._agent_loop_registry:
    register("rlgate_agent")(RlgateAgentLoop)
