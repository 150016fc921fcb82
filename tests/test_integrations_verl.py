"""rlgate.integrations.verl: a verl 0.9 agent loop's output from an rlgate episode.

Without verl: a real multi-turn episode (the calculator agent over the OpenAI SDK, a scripted
fake engine behind a real gateway on 127.0.0.1) becomes the fields of verl's ``AgentLoopOutput``.
With verl (it does not install next to this project's transformers: verl 0.9.1 pins <5.11), the
contract test builds verl's own ``AgentLoopOutput`` from them and checks its tensors.
"""

from __future__ import annotations

import numpy as np
import pytest

from helpers import ADMIN_KEY
from rlgate.client.gateway import GatewayClient
from rlgate.demo.calculator_agent import CalculatorAgent
from rlgate.engine.fake import FakeEngine, ToolRoundScript
from rlgate.integrations.episodes import Chain, play
from rlgate.integrations.verl import VerlLoopSettings, agent_data, output_fields
from rlgate.rollout.runner import RolloutRunner
from rlgate.server.runner import ServerThread

VERL_MISSING = "verl is not installed: verl 0.9.1 pins transformers<5.11, older than the one rlgate is tested with"


@pytest.fixture
async def chain(make_app, tokenizer) -> Chain:
    app = make_app(FakeEngine(tokenizer, script=ToolRoundScript(tokenizer), token_delay=0.0))
    server = ServerThread(app)
    url = server.start()
    client = GatewayClient(url, ADMIN_KEY)
    runner = RolloutRunner(client, CalculatorAgent(), export_style="concat")
    try:
        row = {"raw_prompt": np.array([{"role": "user", "content": "What is 2 + 3?"}], dtype=object),
               "extra_info": {"index": 7, "question": "What is 2 + 3?", "answer": "5"},
               "reward_model": {"style": "rule", "ground_truth": "5"}, "data_source": "calc"}
        data = agent_data(row, {"temperature": 0.7, "top_p": 1.0})
        assert data == {"index": 7, "question": "What is 2 + 3?", "answer": "5", "ground_truth": "5",
                        "messages": [{"role": "user", "content": "What is 2 + 3?"}], "data_source": "calc",
                        "temperature": 0.7, "top_p": 1.0}
        (played,) = await play(runner, [("verl-7", 0, data)])
    finally:
        await runner.aclose()
        await client.aclose()
        server.stop()
    return played


def test_a_multi_turn_episode_becomes_verls_output_fields(chain, tokenizer):
    assert chain.ok and chain.turns == 2 and chain.dropped_chains == 0
    out = output_fields(chain, response_length=512, fallback_prompt_ids=[], eos=0, seconds=0.5)
    assert tokenizer.decode(out["prompt_ids"]).endswith("What is 2 + 3?<|im_end|>\n<|im_start|>assistant\n")
    ids, mask, lps = out["response_ids"], out["response_mask"], out["response_logprobs"]
    assert len(ids) == len(mask) == len(lps) and mask[0] == 1 and 0 in mask
    tool_turn = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if not m])
    assert "<tool_response>" in tool_turn and "<tool_call>" not in tool_turn
    assert all(lp == 0.0 for lp, m in zip(lps, mask, strict=True) if not m)
    assert out["num_turns"] == 4 and out["reward_score"] == chain.reward  # user, call, tool result, answer
    assert out["extra_fields"]["rlgate_failed"] is False and out["extra_fields"]["rlgate_session_id"]
    short = output_fields(chain, response_length=3, fallback_prompt_ids=[], eos=0, seconds=0.5)
    assert short["response_ids"] == ids[:3] and len(short["response_mask"]) == 3  # verl's response_length


def test_a_failed_episode_is_one_masked_token_with_reward_zero():
    failed = Chain(False, [], [], [], [], [], None, "s", 0, 0, "agent raised RuntimeError: boom")
    out = output_fields(failed, response_length=8, fallback_prompt_ids=[5, 6], eos=2, seconds=0.1)
    assert out["prompt_ids"] == [5, 6] and out["response_ids"] == [2] and out["response_mask"] == [0]
    assert out["reward_score"] == 0.0 and out["extra_fields"]["rlgate_error"] == "agent raised RuntimeError: boom"


def test_settings_name_what_is_missing(monkeypatch):
    for k in ("RLGATE_GATEWAY_URL", "RLGATE_ADMIN_KEY", "RLGATE_AGENT"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(ValueError, match="gateway_url / RLGATE_GATEWAY_URL, admin_key / RLGATE_ADMIN_KEY"):
        VerlLoopSettings.resolve(agent="my_agents:Agent")
    monkeypatch.setenv("RLGATE_ADMIN_KEY", "k")
    s = VerlLoopSettings.resolve(gateway_url="http://gw:8000/", agent="my_agents:Agent")
    assert s.gateway_url == "http://gw:8000" and s.admin_key == "k"


def test_verls_own_agent_loop_output_takes_the_fields(chain):
    """The contract test: verl's types, on CPU."""
    agent_loop = pytest.importorskip("verl.experimental.agent_loop.agent_loop", reason=VERL_MISSING)
    import torch

    from rlgate.integrations.verl_loop import RlgateAgentLoop

    fields = output_fields(chain, response_length=512, fallback_prompt_ids=[], eos=0, seconds=0.5)
    out = agent_loop.AgentLoopOutput(**fields)
    d = out.as_dict()
    assert d["prompts"].dtype == torch.int64 and d["responses"].shape == d["response_mask"].shape
    assert d["rollout_log_probs"].shape == d["responses"].shape and d["rm_scores"][-1] == chain.reward
    assert agent_loop._agent_loop_registry["rlgate_agent"]["_target_"].endswith("verl_loop.RlgateAgentLoop")
    assert issubclass(RlgateAgentLoop, agent_loop.AgentLoopBase)


async def test_verl_instantiates_the_loop_and_it_plays_a_row_through_the_gateway(make_app, tokenizer):
    """As verl's AgentLoopWorker does: hydra-instantiate the registered class with verl's wrappers and
    the loop's YAML keys, then ``run(sampling_params, **row)`` against a real gateway."""
    agent_loop = pytest.importorskip("verl.experimental.agent_loop.agent_loop", reason=VERL_MISSING)
    import hydra
    from omegaconf import OmegaConf

    import rlgate.integrations.verl_loop  # noqa: F401  registers rlgate_agent

    server = ServerThread(make_app(FakeEngine(tokenizer, script=ToolRoundScript(tokenizer), token_delay=0.0)))
    url = server.start()
    try:
        config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"response_length": 256, "prompt_length": 256}},
                                   "data": {}})
        entry = {**agent_loop._agent_loop_registry["rlgate_agent"], "gateway_url": url, "admin_key": ADMIN_KEY,
                 "agent": "rlgate.demo.calculator_agent:CalculatorAgent"}
        loop = hydra.utils.instantiate(config=entry, trainer_config=agent_loop.DictConfigWrap(config),
                                       server_manager=None, tokenizer=tokenizer, processor=None, dataset_cls=None,
                                       data_config=agent_loop.DictConfigWrap(config.data))
        out = await loop.run({"temperature": 1.0, "top_p": 1.0}, index=3,
                             raw_prompt=[{"role": "user", "content": "What is 2 + 3?"}],
                             extra_info={"question": "What is 2 + 3?", "answer": "5"})
    finally:
        server.stop()
    assert isinstance(out, agent_loop.AgentLoopOutput) and out.num_turns == 4
    assert 0 in out.response_mask and out.response_mask[0] == 1 and not out.extra_fields["rlgate_failed"]
    assert tokenizer.decode(out.prompt_ids).endswith("What is 2 + 3?<|im_end|>\n<|im_start|>assistant\n")
