"""rlgate.integrations.trl: TRL's rollout_func contract from rlgate's capture, weights back from TRL.

The multi-turn and failure tests drive the rollout function as TRL calls it (``rollout(prompts,
trainer)``; the trainer stand-in carries only what the function reads: the step, the model, the
tokenizer) against a real in-process gateway with the scripted engine and a real SDK agent. The
torch tests run TRL's own GRPOTrainer: the served version goes up after each optimizer step, and
the logprobs recorded by the engine are TRL's model's after the step, not the initial model's.
"""

from __future__ import annotations

import copy
import importlib.util
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from helpers import ADMIN_KEY, serve_gateway
from rlgate.demo.calculator_agent import CalculatorAgent
from rlgate.integrations.episodes import Chain
from rlgate.integrations.trl import TRLRollout, agent_reward, default_data_for, trl_batch
from rlgate.train.config import GatewaySettings, RolloutSettings

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
ROOT = Path(__file__).resolve().parents[1]


def _trainer(tokenizer: Any, step: int = 0) -> Any:
    return SimpleNamespace(state=SimpleNamespace(global_step=step), model=None, processing_class=tokenizer,
                           accelerator=SimpleNamespace(unwrap_model=lambda m: m))


class FlakyAgent(CalculatorAgent):
    async def run(self, data: dict[str, Any], **kw: Any) -> float:
        if data.get("fail"):
            raise RuntimeError("the agent broke")
        return await super().run(data, **kw)


def test_data_for_and_reward_defaults():
    assert default_data_for('{"question": "q", "answer": "1"}') == {"question": "q", "answer": "1"}
    assert default_data_for("What is 2?") == {"prompt": "What is 2?"}
    assert default_data_for([{"role": "user", "content": "hi"}]) == {"messages": [{"role": "user", "content": "hi"}]}
    assert agent_reward(["p", "q"], ["a", "b"], rlgate_reward=[1.0, None]) == [1.0, None]
    ok = Chain(True, [1], [2, 3, 4], [1, 0, 1], [-0.5, 0.0, -0.25], [3, -1, 3], 1.0, "s", 2, 0)
    failed = Chain(False, [], [], [], [], [], None, "t", 0, 0, "the agent broke")
    out = trl_batch([ok, failed], eos=9)
    assert out["prompt_ids"] == [[1], [9]] and out["completion_ids"] == [[2, 3, 4], [9]]
    assert out["env_mask"] == [[1, 0, 1], [0]] and out["logprobs"] == [[-0.5, 0.0, -0.25], [0.0]]
    assert out["rlgate_reward"] == [1.0, None] and out["rlgate_failed"] == [False, True]
    assert out["rlgate_version"] == [3, None] and out["rlgate_turns"] == [2, 0]


@pytest.mark.torch  # the in-process gateway (train/gateway.py) imports the local engine, scripted or not
def test_a_multi_turn_episode_is_one_sample_with_the_loss_on_generated_tokens(tiny_tokenizer_dir, tokenizer, tmp_path):
    items = {"What is 2 + 3?": {"question": "What is 2 + 3?", "answer": "5"}, "boom": {"fail": True}}
    with TRLRollout.start(FlakyAgent(), tiny_tokenizer_dir, gateway=GatewaySettings(engine="scripted"),
                          data_for=items.__getitem__, out_dir=tmp_path,
                          rollout=RolloutSettings(max_consecutive_failures=0)) as rollout:
        out = rollout(["What is 2 + 3?", "What is 2 + 3?", "boom"], _trainer(tokenizer, step=0))
        assert set(out) >= {"prompt_ids", "completion_ids", "logprobs", "env_mask"}
        for k in range(2):  # call the calculator (scripted), read its result, answer
            prompt, completion, mask, lps = (out["prompt_ids"][k], out["completion_ids"][k], out["env_mask"][k],
                                             out["logprobs"][k])
            assert len(completion) == len(mask) == len(lps) and out["rlgate_turns"][k] == 2
            assert tokenizer.decode(prompt).endswith("What is 2 + 3?<|im_end|>\n<|im_start|>assistant\n")
            generated = tokenizer.decode([t for t, m in zip(completion, mask, strict=True) if m])
            between = tokenizer.decode([t for t, m in zip(completion, mask, strict=True) if not m])
            assert "<tool_call>" in generated and "Done." in generated and "<tool_response>" not in generated
            assert "<tool_response>" in between and "<|im_start|>user" in between
            assert all(lp == 0.0 for lp, m in zip(lps, mask, strict=True) if not m)
            assert all(lp < 0.0 for lp, m in zip(lps, mask, strict=True) if m)
            assert completion[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")
        assert out["rlgate_failed"] == [False, False, True] and out["env_mask"][2] == [0]
        assert agent_reward([], [], **{"rlgate_reward": out["rlgate_reward"]})[2] is None
        assert rollout.failed == 1 and rollout.episodes == 3
        assert out["rlgate_version"][:2] == [1, 1] and rollout.pushes == [(0, 1)]
        rollout(["What is 2 + 3?"] * 2, _trainer(tokenizer, step=0))  # same step: the weights are there
        assert rollout.pushes == [(0, 1)]
        again = rollout(["What is 2 + 3?"] * 2, _trainer(tokenizer, step=1))  # after an optimizer step
        assert rollout.pushes == [(0, 1), (1, 2)] and again["rlgate_version"] == [2, 2]


class LengthAgent:
    """A one-call OpenAI SDK agent rewarded by its reply's length: rewards vary within a group."""

    async def run(self, data: dict[str, Any], *, base_url: str, api_key: str, http_client: Any = None) -> float:
        from openai import AsyncOpenAI

        client = AsyncOpenAI(base_url=base_url + "/v1", api_key=api_key, http_client=http_client)
        reply = await client.chat.completions.create(model="policy", max_tokens=6, temperature=1.0,
                                                     messages=[{"role": "user", "content": data["prompt"]}])
        return len(reply.choices[0].message.content or "") / 10.0


def _max_logprob_gap(model: Any, out: dict[str, list[Any]]) -> float:
    """Largest |engine logprob - model logprob| over the generated tokens of a rollout (the model in
    eval mode, as the engine runs it: the tiny model has attention dropout)."""
    import torch

    worst = 0.0
    training = model.training
    model.eval()
    with torch.no_grad():
        for prompt, completion, lps, mask in zip(out["prompt_ids"], out["completion_ids"], out["logprobs"],
                                                 out["env_mask"], strict=True):
            ids = torch.tensor([prompt + completion])
            logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1].float()
            mine = torch.log_softmax(logits, -1).gather(1, torch.tensor(completion)[:, None])[:, 0]
            for a, b, m in zip(mine.tolist(), lps, mask, strict=True):
                if m:
                    worst = max(worst, abs(a - b))
    model.train(training)
    return worst


@pytest.mark.slow
def test_trl_trains_on_rlgate_rollouts_and_serves_its_new_weights(tiny_model_dir, tmp_path):
    """Two GRPO steps of TRL's own trainer: before each rollout TRL's weights are pushed, the engine's
    version goes up, and what the engine recorded are TRL's model's logprobs (after the step)."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    initial = copy.deepcopy(model).eval()
    seen: list[dict[str, Any]] = []

    with TRLRollout.start(LengthAgent(), tiny_model_dir, rollout=RolloutSettings(seed=0), out_dir=tmp_path) as rollout:
        def checked(prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
            out = rollout(prompts, trainer)
            policy = trainer.accelerator.unwrap_model(trainer.model)
            seen.append({"step": trainer.state.global_step, "versions": set(out["rlgate_version"]),
                         "vs_trl": _max_logprob_gap(policy, out), "vs_initial": _max_logprob_gap(initial, out)})
            return out

        config = GRPOConfig(output_dir=str(tmp_path / "trl"), max_steps=2, learning_rate=1e-2, beta=0.0, seed=0,
                            num_generations=4, per_device_train_batch_size=8, max_completion_length=6,
                            save_strategy="no", report_to=[], use_cpu=True, logging_steps=1,
                            bf16=False)  # TRL's default autocasts its forward to bfloat16; the engine runs float32
        trainer = GRPOTrainer(model=model, processing_class=AutoTokenizer.from_pretrained(tiny_model_dir),
                              args=config, train_dataset=Dataset.from_list([{"prompt": f"Say {k}"} for k in range(8)]),
                              reward_funcs=agent_reward, rollout_func=checked)
        trainer.train()
        assert rollout.failed == 0 and rollout.pushes == [(0, 1), (1, 2)]
    assert [s["step"] for s in seen] == [0, 1] and [s["versions"] for s in seen] == [{1}, {2}]
    assert seen[0]["vs_trl"] < 1e-4 and seen[1]["vs_trl"] < 1e-4  # the engine served TRL's weights
    assert seen[1]["vs_initial"] > 10 * max(seen[1]["vs_trl"], 1e-4)  # ... which the step changed


@pytest.mark.slow
def test_trl_takes_a_multi_turn_chain_with_its_env_mask(tiny_model_dir, tmp_path):
    """TRL's own trainer on multi-turn episodes (calculator agent, scripted engine): it counts only the
    generated tokens (env_mask 1) as completion tokens, and trains through the tool-result tokens."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    seen: list[dict[str, list[Any]]] = []
    items = {f"What is {k} + 3?": {"question": f"What is {k} + 3?", "answer": str(k + 3)} for k in range(4)}
    with TRLRollout.start(CalculatorAgent(), tiny_model_dir, gateway=GatewaySettings(engine="scripted"),
                          data_for=items.__getitem__, out_dir=tmp_path) as rollout:
        def recorded(prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
            seen.append(rollout(prompts, trainer))
            return seen[-1]

        config = GRPOConfig(output_dir=str(tmp_path / "trl"), max_steps=1, beta=0.0, num_generations=2,
                            per_device_train_batch_size=4, save_strategy="no", report_to=[], use_cpu=True,
                            logging_steps=1, bf16=False)
        trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                              processing_class=AutoTokenizer.from_pretrained(tiny_model_dir), args=config,
                              train_dataset=Dataset.from_list([{"prompt": q} for q in items]),
                              reward_funcs=agent_reward, rollout_func=recorded)
        trainer.train()
    (out,) = seen
    assert all(0 in mask and turns == 2 for mask, turns in zip(out["env_mask"], out["rlgate_turns"], strict=True))
    generated = [sum(mask) for mask in out["env_mask"]]
    logged = next(h for h in trainer.state.log_history if "completions/mean_length" in h)
    assert logged["completions/mean_length"] == pytest.approx(sum(generated) / len(generated))
    assert logged["completions/mean_length"] < sum(map(len, out["completion_ids"])) / len(generated)


@pytest.mark.slow
def test_weights_reach_a_gateway_elsewhere_through_update_weights(tiny_model_dir, tokenizer, tmp_path, monkeypatch):
    """gateway.url: `rlgate serve` in another process; each push is a checkpoint loaded through
    POST /rl/update_weights, and the next rollout's logprobs are the pushed model's."""
    import torch
    from transformers import AutoModelForCausalLM

    with serve_gateway(tiny_model_dir) as url:
        monkeypatch.setenv("RLGATE_ADMIN_KEY", ADMIN_KEY)
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        before = copy.deepcopy(model).eval()
        trainer = SimpleNamespace(state=SimpleNamespace(global_step=0), model=model, processing_class=tokenizer,
                                  accelerator=SimpleNamespace(unwrap_model=lambda m: m))
        settings = GatewaySettings(url=url, sync_dir=str(tmp_path / "sync"))
        with TRLRollout.start(LengthAgent(), tiny_model_dir, gateway=settings, out_dir=tmp_path) as rollout:
            first = rollout(["Say 1"] * 2, trainer)
            torch.manual_seed(0)
            with torch.no_grad():  # what an optimizer step does, only bigger
                for p in model.parameters():
                    p.add_(torch.randn_like(p) * 0.05)
            trainer.state.global_step = 1
            second = rollout(["Say 2"] * 2, trainer)
            assert rollout.pushes == [(0, 1), (1, 2)]
        assert first["rlgate_version"] == [1, 1] and second["rlgate_version"] == [2, 2]
        assert _max_logprob_gap(before, first) < 1e-4 and _max_logprob_gap(model, second) < 1e-4
        assert _max_logprob_gap(before, second) > 1e-2
        assert len(list((tmp_path / "sync").iterdir())) <= 2  # gateway.sync_keep


@pytest.mark.slow
def test_the_trl_example_trains_two_steps_offline(tiny_model_dir, tmp_path):
    spec = importlib.util.spec_from_file_location("trl_math_agent", ROOT / "examples" / "trl_math_agent.py")
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    summary = example.main(["--out", str(tmp_path), "--model", str(tiny_model_dir), "--steps", "2"])
    assert summary["steps"] == 2 and summary["episodes"] == 16 and summary["failed"] == 0
    assert summary["pushes"] == [(0, 1), (1, 2)] and len(summary["rewards"]) == 2
    assert (tmp_path / "summary.json").is_file()
