"""verl 0.9.1 (its own venv, its own pins; rlgate from src/ on PYTHONPATH) against a gateway of the project's
venv over HTTP. Two modes, each writing what verl made of it as JSON to OUT:

* ``loop URL TOKENIZER_DIR WORKDIR OUT``: verl's own ``AgentLoopWorker`` (config composed from verl's
  ppo_trainer.yaml, rows read by verl's ``RLHFDataset`` and ``collate_fn``) runs the ``rlgate_agent``
  loop (rlgate.integrations.verl_loop, registered through ``agent_loop_config_path`` as a verl user
  does) on two rows: each row is an rlgate episode in the gateway; ``generate_sequences`` returns
  verl's padded ``DataProto`` (the batch its trainer trains on), dumped here.
* ``export EXPORT_PARQUET TOKENIZER_DIR WORKDIR OUT``: ``rlgate export --format verl``'s file read by
  verl's ``RLHFDataset`` (the RL prompts) and, its token columns made into ``AgentLoopOutput``s, padded
  and batched by the same ``AgentLoopWorker`` post-processing.

The admin key is ``RLGATE_ADMIN_KEY`` in the environment. Nothing here needs CUDA: verl's worker is built
with ``llm_client=None`` (rlgate's loop talks to the gateway, not to verl's rollout servers), which is
the only part of a verl job left out.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import verl
from hydra import compose, initialize_config_dir
from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput, AgentLoopWorker
from verl.protocol import DataProto
from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

PROMPT_LENGTH, RESPONSE_LENGTH = 512, 512  # the calculator prompt (tool schemas) is ~264 tokens


def verl_config(tokenizer_dir: str, workdir: Path, train_file: str) -> Any:
    loops = workdir / "agent_loops.yaml"
    loops.write_text("- name: rlgate_agent\n  _target_: rlgate.integrations.verl_loop.RlgateAgentLoop\n"
                     "  agent: rlgate.demo.calculator_agent:CalculatorAgent\n")
    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(config_name="ppo_trainer", overrides=[
            f"actor_rollout_ref.model.path={tokenizer_dir}",
            "actor_rollout_ref.rollout.name=vllm",  # required by its config; no vLLM server is started
            f"actor_rollout_ref.rollout.prompt_length={PROMPT_LENGTH}",
            f"actor_rollout_ref.rollout.response_length={RESPONSE_LENGTH}",
            "actor_rollout_ref.rollout.calculate_log_probs=true",
            f"actor_rollout_ref.rollout.agent.agent_loop_config_path={loops}",
            "actor_rollout_ref.rollout.agent.default_agent_loop=rlgate_agent",
            f"data.train_files=[{train_file}]", f"data.val_files=[{train_file}]", "data.prompt_key=prompt",
            f"data.max_prompt_length={PROMPT_LENGTH}"])


def dump(out: DataProto) -> dict[str, Any]:
    batch = {k: v.tolist() for k, v in out.batch.items()}
    extra = {k: [x if isinstance(x, (str, int, float, bool, type(None))) else str(x) for x in v.tolist()]
             for k, v in out.non_tensor_batch.items() if k.startswith("rlgate_") or k == "__num_turns__"}
    return {"batch": batch, "non_tensor": extra}


def rows_from(dataset: RLHFDataset) -> DataProto:
    return DataProto.from_single_dict(collate_fn([dataset[i] for i in range(len(dataset))]))


async def loop(url: str, tokenizer_dir: str, workdir: Path) -> dict[str, Any]:
    os.environ["RLGATE_GATEWAY_URL"] = url  # the loop's gateway_url (its YAML entry could say it too)
    train = workdir / "prompts.parquet"
    pd.DataFrame([{"data_source": "calc", "prompt": [{"role": "user", "content": q}], "ability": "math",
                   "reward_model": {"style": "rule", "ground_truth": a},
                   "extra_info": {"index": i, "question": q, "answer": a}}
                  for i, (q, a) in enumerate([("What is 2 + 3?", "5"), ("What is 40 + 2?", "42")])]).to_parquet(train)
    config = verl_config(tokenizer_dir, workdir, str(train))
    worker = AgentLoopWorker(config, llm_client=None)
    dataset = RLHFDataset(data_files=[str(train)], tokenizer=worker.tokenizer, config=config.data)
    return dump(await worker.generate_sequences(rows_from(dataset)))


async def export(path: str, tokenizer_dir: str, workdir: Path) -> dict[str, Any]:
    config = verl_config(tokenizer_dir, workdir, path)
    worker = AgentLoopWorker(config, llm_client=None)
    dataset = RLHFDataset(data_files=[path], tokenizer=worker.tokenizer, config=config.data)
    rows = [dataset[i] for i in range(len(dataset))]
    outputs = []
    for row in rows:  # the agent loop's fields, as the verl export carries them
        output = AgentLoopOutput(
            prompt_ids=[int(t) for t in row["prompt_ids"]], response_ids=[int(t) for t in row["response_ids"]],
            response_mask=[int(m) for m in row["response_mask"]],
            response_logprobs=[float(x) for x in row["response_logprobs"]], reward_score=float(row["reward"]),
            num_turns=2, metrics=AgentLoopMetrics(), extra_fields={"rlgate_session_id": row["session_id"]})
        outputs.append(await worker._agent_loop_postprocess(output, validate=False, raw_prompt=row["raw_prompt"]))
    out = dump(worker._postprocess(outputs))
    out["raw_prompt"] = [[{"role": m["role"], "content": m["content"]} for m in row["raw_prompt"]] for row in rows]
    return out


def main() -> None:
    mode, source, tokenizer_dir, workdir, out = sys.argv[1:6]
    work = Path(workdir)
    result = asyncio.run(loop(source, tokenizer_dir, work) if mode == "loop" else export(source, tokenizer_dir, work))
    result["versions"] = {p: version(p) for p in ("verl", "transformers", "torch")}
    Path(out).write_text(json.dumps(result, default=lambda o: o.tolist() if isinstance(o, np.ndarray) else str(o)))
    print(json.dumps({"versions": result["versions"], "out": out}))


if __name__ == "__main__":
    main()
