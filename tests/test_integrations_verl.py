"""rlgate.integrations.verl: a verl 0.9 agent loop's output from an rlgate episode.

In the project's venv: a real multi-turn episode (the calculator agent over the OpenAI SDK, a scripted
fake engine behind a real gateway on 127.0.0.1) becomes the fields of verl's ``AgentLoopOutput``.
Against real verl: verl 0.9.1 does not install next to this project's transformers (it pins <5.11), so
it runs in its own venv (tests/framework_envs.py, with its own pins) and talks to a gateway of this venv
over HTTP (tests/frameworks/verl_rollout.py): verl's own ``AgentLoopWorker`` plays rows through the
``rlgate_agent`` loop, and reads the ``verl`` export; both batches are compared token for token with
what the engine saw and generated.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import framework_envs
from framework_helpers import clean_env, record
from helpers import ADMIN_KEY
from rlgate.client.gateway import GatewayClient
from rlgate.demo.calculator_agent import CalculatorAgent
from rlgate.engine.base import GenerateRequest, TokenDelta
from rlgate.engine.fake import FakeEngine, ToolRoundScript
from rlgate.integrations.episodes import Chain, play
from rlgate.integrations.verl import VerlLoopSettings, agent_data, output_fields
from rlgate.rollout.runner import RolloutRunner
from rlgate.server.runner import ServerThread
from rlgate.trajectory.formats import write_format

ROOT = Path(__file__).resolve().parent.parent


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
    assert "rlgate_prompt_tokens_cut" not in out["extra_fields"]
    n = len(out["prompt_ids"])
    cut = output_fields(chain, response_length=512, fallback_prompt_ids=[], eos=0, seconds=0.5, prompt_length=n - 5)
    # verl's batch is prompt_length wide: a longer prompt is left-truncated, as verl's own loops do, and counted
    assert cut["prompt_ids"] == out["prompt_ids"][5:] and cut["extra_fields"]["rlgate_prompt_tokens_cut"] == 5
    assert cut["response_ids"] == ids


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


class RecordingEngine(FakeEngine):
    """The fake engine, keeping what it generated for each request: ``(prompt ids, output ids, logprobs)``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[list[int], list[int], list[float]]] = []

    async def stream(self, request: GenerateRequest) -> AsyncGenerator[TokenDelta, None]:
        ids: list[int] = []
        lps: list[float] = []
        async for delta in super().stream(request):
            ids += delta.token_ids
            lps += delta.logprobs
            yield delta
        self.calls.append((list(request.input_ids), ids, lps))


def expected(engine: RecordingEngine, prompt: list[int]) -> tuple[list[int], list[int], list[float]]:
    """An episode's token sequence from the engine's side alone: its calls whose prompt starts with
    ``prompt`` (the first call's), the last call's prompt + output, 1 / the logprob on every generated token."""
    calls = sorted((c for c in engine.calls if c[0][: len(prompt)] == prompt), key=lambda c: len(c[0]))
    last_prompt, last_out, _ = calls[-1]
    ids = last_prompt + last_out
    mask, lps = [0] * len(ids), [0.0] * len(ids)
    for p, _out, lp in calls:
        assert ids[: len(p)] == p  # token-exact: each prompt extends the one before
        for k, x in enumerate(lp):
            mask[len(p) + k], lps[len(p) + k] = 1, x
    return ids, mask, lps


def check_batch(batch: dict[str, Any], engine: RecordingEngine, rewards: list[float | None]) -> None:
    """verl's padded batch (DataProto.batch) row by row against the engine's own record."""
    n = len(batch["prompts"][0])
    for i, attention in enumerate(batch["attention_mask"]):
        prompt = [t for t, a in zip(batch["prompts"][i], attention[:n], strict=True) if a]
        response = [t for t, a in zip(batch["responses"][i], attention[n:], strict=True) if a]
        ids, mask, lps = expected(engine, prompt)
        assert prompt + response == ids  # left-padded prompt, right-padded response: the very tokens
        k = len(prompt)
        assert batch["response_mask"][i][: len(response)] == mask[k:]
        assert not any(batch["response_mask"][i][len(response):])
        assert batch["rollout_log_probs"][i][: len(response)] == pytest.approx(lps[k:], abs=1e-6)
        assert [t for t, a in zip(batch["input_ids"][i], attention, strict=True) if a] == ids
        assert [p for p, a in zip(batch["position_ids"][i], attention, strict=True) if a] == list(range(len(ids)))
        scores = batch["rm_scores"][i]
        assert scores[len(response) - 1] == pytest.approx(rewards[i]) and sum(scores) == pytest.approx(rewards[i])


async def run_verl(mode: str, source: str, tokenizer_dir: Path, tmp_path: Path) -> dict[str, Any]:
    """tests/frameworks/verl_rollout.py in the verl venv (rlgate from this checkout's src/); its JSON."""
    python = framework_envs.python("verl")
    out = tmp_path / f"verl-{mode}.json"
    env = clean_env(tmp_path, PYTHONPATH=str(ROOT / "src"), RLGATE_ADMIN_KEY=ADMIN_KEY, RAY_AUTH_MODE="disabled",
                    WANDB_MODE="disabled", TOKENIZERS_PARALLELISM="false")
    proc = await asyncio.create_subprocess_exec(
        str(python), str(ROOT / "tests" / "frameworks" / "verl_rollout.py"), mode, source, str(tokenizer_dir),
        str(tmp_path), str(out), cwd=tmp_path, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    stdout, stderr = await asyncio.wait_for(proc.communicate(), 900)
    assert proc.returncode == 0, (stdout.decode()[-2000:], stderr.decode()[-6000:])
    return json.loads(out.read_text())


@pytest.mark.slow
async def test_verls_agent_loop_worker_plays_rows_through_the_gateway_token_exact(make_app, tokenizer,
                                                                                  tiny_tokenizer_dir, tmp_path,
                                                                                  record_property):
    """verl 0.9.1's own AgentLoopWorker (its config from verl's ppo_trainer.yaml, its RLHFDataset and
    collate_fn) runs two rows with the ``rlgate_agent`` loop against this gateway: its DataProto holds the
    tokens the engine saw and generated, exactly (prompt left-padded, response right-padded, mask 1 on
    the generated tokens, their logprobs, the reward on the last token)."""
    engine = RecordingEngine(tokenizer, script=ToolRoundScript(tokenizer, answer="5"), token_delay=0.0)
    with ServerThread(make_app(engine)) as url:
        out = await run_verl("loop", url, tiny_tokenizer_dir, tmp_path)
    batch, extra = out["batch"], out["non_tensor"]
    assert len(batch["prompts"]) == 2 and extra["rlgate_failed"] == [False, False]
    assert len(engine.calls) == 4 and extra["__num_turns__"] == [4, 4]  # a tool call and an answer per row
    assert len({s for s in extra["rlgate_session_id"]}) == 2  # one gateway session per row
    check_batch(batch, engine, rewards=[1.0, 0.0])  # the calculator agent's reward: "5" is right for 2 + 3 only
    record(record_property, "verl agent loop (AgentLoopWorker)", out["versions"], "verl")


@pytest.mark.slow
async def test_verl_export_read_by_verl_token_exact(make_app, tokenizer, tiny_tokenizer_dir, tmp_path, record_property):
    """``rlgate export --format verl`` of a played episode, read by verl 0.9.1's RLHFDataset (the prompt
    messages) and its token columns batched by verl's AgentLoopWorker post-processing: token-exact."""
    engine = RecordingEngine(tokenizer, script=ToolRoundScript(tokenizer, answer="5"), token_delay=0.0)
    with ServerThread(make_app(engine)) as url:
        client = GatewayClient(url, ADMIN_KEY)
        runner = RolloutRunner(client, CalculatorAgent(), export_style="concat")
        try:
            ep = await runner.episode("g", 0, {"messages": [{"role": "user", "content": "What is 2 + 3?"}],
                                               "question": "What is 2 + 3?", "answer": "5"})
        finally:
            await runner.aclose()
            await client.aclose()
    assert ep.ok, ep.error
    path = write_format(ep.samples, "verl", tmp_path / "verl.parquet").path
    out = await run_verl("export", str(path), tiny_tokenizer_dir, tmp_path)
    assert out["raw_prompt"] == [[{"role": "user", "content": "What is 2 + 3?"}]]
    assert out["non_tensor"]["rlgate_session_id"] == [ep.session_id]
    check_batch(out["batch"], engine, rewards=[1.0])
    record(record_property, "verl export (RLHFDataset + AgentLoopWorker)", out["versions"], "verl")
