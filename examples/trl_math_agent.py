"""Train the demo's MathAgent with TRL's GRPOTrainer, rlgate playing the episodes (offline, on CPU).

TRL owns the model, the optimizer and the GRPO loss; rlgate serves the policy behind its gateway,
the agent (``rlgate.demo.math_agent.MathAgent``, Anthropic SDK) plays every episode in its own
session, and ``rlgate.integrations.trl.TRLRollout`` hands TRL the recorded token ids, logprobs
and rewards, then pushes TRL's weights to the engine before the next rollout::

    python examples/trl_math_agent.py --out runs/trl-math --steps 30 --port 8000
    python examples/trl_math_agent.py --model demo-out/warm-start-math-seed0   # the demo's warm start

Without ``--model`` it builds the tiny random-weight model (``rlgate tiny-model``) in OUT/model:
the reward stays near 0 there; the demo's warm-started checkpoint (``rlgate demo --model tiny``
writes it) is where the reward moves. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL 1.16


def math_items(seed: int) -> list[dict[str, Any]]:
    """The demo's math task (``rlgate demo --model tiny``): which of two numbers is larger / smaller."""
    items = [{"question": f"Which is {word}, {a} or {b}?", "answer": str(max(a, b) if word == "larger" else min(a, b))}
             for a in range(10, 100) for b in range(10, 100) if a != b for word in ("larger", "smaller")]
    random.Random(seed).shuffle(items)
    return items


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/trl-math", help="output directory")
    p.add_argument("--model", default=None, help="checkpoint directory (default: the tiny model, built in OUT/model)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--group-size", type=int, default=4, help="TRL's num_generations (episodes per prompt)")
    p.add_argument("--prompts-per-step", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=8, help="the agent's max_tokens per reply")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--port", type=int, default=None, help="the gateway's port on 127.0.0.1 (default: a free one)")
    args = p.parse_args(argv)

    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from rlgate import GatewaySettings, RolloutSettings
    from rlgate.demo.math_agent import MathAgent
    from rlgate.integrations.trl import TRLRollout, agent_reward

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model_dir = Path(args.model) if args.model else out / "model"
    if not (model_dir / "config.json").is_file():
        subprocess.run([sys.executable, "-m", "rlgate.cli", "tiny-model", str(model_dir), "--seed", str(args.seed)],
                       check=True)

    # TRL hands the rollout the `prompt` column only: the question; the item (with its answer) is looked up
    items = {it["question"]: {**it, "max_tokens": args.max_tokens} for it in math_items(args.seed)}
    dataset = Dataset.from_list([{"prompt": q} for q in items])
    config = GRPOConfig(
        output_dir=str(out / "trl"), max_steps=args.steps, learning_rate=args.lr, beta=0.0, seed=args.seed,
        num_generations=args.group_size, per_device_train_batch_size=args.group_size * args.prompts_per_step,
        max_completion_length=args.max_tokens, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True,
        dataloader_num_workers=0,
        bf16=False)  # TRL's default autocasts to bfloat16: its logprobs would then differ from the engine's float32
    rollout = TRLRollout.start(MathAgent(max_tokens=args.max_tokens), model_dir, data_for=items.__getitem__,
                               rollout=RolloutSettings(seed=args.seed), out_dir=out,
                               gateway=GatewaySettings(port=args.port))
    try:
        trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir),
                              processing_class=AutoTokenizer.from_pretrained(model_dir), args=config,
                              train_dataset=dataset, reward_funcs=agent_reward, rollout_func=rollout)
        trainer.train()
    finally:
        rollout.close()
    history = [h for h in trainer.state.log_history if "reward" in h]
    summary = {"steps": trainer.state.global_step, "episodes": rollout.episodes, "failed": rollout.failed,
               "dropped_chains": rollout.dropped_chains, "pushes": rollout.pushes,
               "rewards": [h["reward"] for h in history]}
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
