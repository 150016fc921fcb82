"""The online proof on a real model: SmolLM2-135M-Instruct learns from simulated users it cannot fool.

:func:`run_real_proof` builds the online stack in one process, as ``demo/online.py`` does for the tiny
model - two local engines behind the canary, the gateway in online mode on 127.0.0.1, the continuous
trainer on a third copy - with the defaults of ``rlgate serve --online`` except where noted, and the
users of ``demo/number_users.py``: a checkable question, partial and delayed thumbs, 10% adversarial
users in a second tenant (inverted thumbs and refused attacks). The reward the trainer sees is that
feedback plus live groups scored by a proxy (:func:`~rlgate.demo.number_users.first_number_score`);
the measure is the judge's verdict on every reply honest users got, in windows the stopping rule did
not look at. The reward-hacking guards run with their defaults (``pause``) except that the entropy guard
only alarms (the users want short, sure replies), the held-out check on held-out pairs (``NumberCheck``).

1. **before**: ``before`` conversations with the trainer holding its candidates (version 0 only;
   its replies also give the guards their reference);
2. **learning**: windows of ``window`` conversations until two in a row are above the before by
   more than ``rise_errors`` standard errors and a candidate was promoted (``learn_seconds`` is the
   ceiling), then one fresh window is the after;
3. **bad checkpoint**: version-0 weights with noise (``bad_noise`` x each tensor's standard
   deviation) pushed through ``POST /rl/update_weights``; the users go on until the canary decides.

``benchmarks/online_real.py`` prints the result; docs/online.md has the table.
"""

from __future__ import annotations

import asyncio
import secrets
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from rlgate.config import OnlineConfig
from rlgate.demo.number_users import JudgedWindow, NumberUsers, first_number_score
from rlgate.trajectory.reward import FinishedEpisode
from rlgate.trajectory.sample import Sample


@dataclass
class RealProofSettings:
    model: str = "smollm2-135m-instruct"
    max_tokens: int = 8
    before: int = 96  # conversations served by version 0 only (the guards' reference: half vocabulary, half rates)
    window: int = 96
    learn_seconds: float = 1500.0  # the learning phase's ceiling
    rise_errors: float = 2.0  # a window counts as "above the before" beyond this many standard errors
    bad_max_conversations: int = 256
    bad_noise: float = 1.0
    concurrency: int = 32
    lr: float = 1e-4
    lora: int = 0  # the trainer's LoRA rank (alpha 2r, every linear layer; 0: every weight trains)
    train_batch: int = 32
    train_batch_max: int = 48
    group_fraction: float = 0.5
    group_size: int = 4
    canary_share: float = 0.5
    canary_margin: float = 0.2
    canary_min_samples: int = 20
    canary_plan_samples: int = 100
    candidate_steps: int = 2
    conversation_idle_s: float = OnlineConfig.conversation_idle_s
    hacking_min_replies: int = 20
    hacking_action: str = OnlineConfig.hacking_action  # the default of rlgate serve
    # the users ask for a bare number: short, sure replies lower the surprisal per token without a collapse
    # (the entropy guard held the first real-model runs' learned format); same-reply and held-out still act
    hacking_alarm_only: tuple[str, ...] = ("online_entropy_collapse",)
    feedback_share: float = 0.7
    outcome_share: float = 0.3
    adversarial_share: float = 0.1
    threads: int | None = 1  # torch threads of each engine (one: no OpenMP barrier waits on busy cores)
    seed: int = 0


@dataclass
class RealProofResult:
    before: dict[str, Any]
    after: dict[str, Any]
    curve: list[dict[str, Any]] = field(default_factory=list)
    learned: bool = False
    bad_version: int | None = None
    bad_decision: dict[str, Any] | None = None
    bad_conversations: int = 0
    decisions: list[dict[str, Any]] = field(default_factory=list)
    guards: dict[str, Any] = field(default_factory=dict)
    online: dict[str, Any] = field(default_factory=dict)
    attacks: dict[str, int] = field(default_factory=dict)
    conversations: int = 0
    seconds: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _question(sample: Sample) -> str:
    users = [m for m in sample.messages if m.get("role") == "user"]
    content = users[-1].get("content") if users else ""
    return content if isinstance(content, str) else ""


def proxy_reward(episode: FinishedEpisode) -> float:
    """The live groups' reward (the operator's proxy, not the users' rule)."""
    try:
        return first_number_score(_question(episode.samples[-1]), episode.final_text)
    except ValueError:
        return -1.0


def _rose(before: JudgedWindow, after: JudgedWindow, errors: float) -> bool:
    return after.rate - before.rate > errors * (before.stderr ** 2 + after.stderr ** 2) ** 0.5


async def run_real_proof(out_dir: Path, s: RealProofSettings, log: Callable[[str], None] = print) -> RealProofResult:
    import torch
    from transformers import AutoModelForCausalLM

    from rlgate.api.app_state import online_state
    from rlgate.checkpoints import resolve_model
    from rlgate.config import GatewayConfig, OnlineConfig
    from rlgate.demo.canary_trial import put_on_trial
    from rlgate.engine.factory import EnginePlan
    from rlgate.model import load_tokenizer, stop_token_ids
    from rlgate.online.groups import scorer_of
    from rlgate.server.app import create_app
    from rlgate.server.runner import ServerThread
    from rlgate.store.base import MemoryStore
    from rlgate.train.config import GRPOConfig, LoraSettings, ModelSettings, OnlineTrainConfig
    from rlgate.train.online import build_online_training
    from rlgate.train.policy import save_for_serving

    t0 = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(s.seed)
    model_dir = resolve_model(s.model)
    tokenizer = load_tokenizer(model_dir)
    stops = stop_token_ids(tokenizer, model_dir)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    # the bad checkpoint is written first, while only one copy of the model is in memory (a run that made it at
    # the end, with three copies, the optimiser and the loading engine in memory, peaked at 7.6 GB)
    bad_path = Path(tempfile.mkdtemp(dir=out_dir, prefix="bad-checkpoint-"))
    start_state = {k: v.detach().clone() for k, v in base.state_dict().items()}
    gen = torch.Generator().manual_seed(s.seed)
    base.load_state_dict({k: v + s.bad_noise * v.float().std().nan_to_num() * torch.randn(v.shape, generator=gen)
                          if v.is_floating_point() and v.numel() > 1 else v for k, v in start_state.items()})
    save_for_serving(base, bad_path)
    base.load_state_dict(start_state)
    del start_state
    options = OnlineConfig(train=True, lr=s.lr, group_fraction=s.group_fraction, group_size=s.group_size,
                            train_batch=s.train_batch, train_batch_max=s.train_batch_max, canary_share=s.canary_share,
                            canary_margin=s.canary_margin, canary_min_samples=s.canary_min_samples,
                            canary_plan_samples=s.canary_plan_samples, candidate_steps=s.candidate_steps,
                            conversation_idle_s=s.conversation_idle_s, hacking_reference_replies=s.before // 2,
                            hacking_min_replies=s.hacking_min_replies,
                            hacking_action=s.hacking_action,  # type: ignore[arg-type]
                            hacking_alarm_only=list(s.hacking_alarm_only),
                            heldout_check="rlgate.demo.number_users:NumberCheck")
    train_config = OnlineTrainConfig(grpo=GRPOConfig(lr=s.lr), train=ModelSettings(
        lora=LoraSettings(r=s.lora, alpha=2 * s.lora) if s.lora else None))
    training = build_online_training(base, options, tokenizer, engine=EnginePlan(seed=s.seed, threads=s.threads),
                                     scorer=scorer_of(proxy_reward), stop_token_ids=stops, train_config=train_config)
    engines, trainer, canary = training.engines, training.trainer, training.canary
    assert engines is not None and trainer is not None and training.hacking is not None
    admin = secrets.token_urlsafe(16)
    app = create_app(GatewayConfig(admin_key=admin), engines, MemoryStore(), tokenizer, stop_token_ids=stops,
                     online=OnlineConfig(online=True), online_training=training)
    online = online_state(app)
    assert online is not None
    conversations = online.conversations

    def version_of(turn_id: str) -> int | None:
        found = conversations.find_turn(None, turn_id)
        return found[1].output_versions[-1] if found is not None and found[1].output_versions else None

    result = RealProofResult(before={}, after={})
    with ServerThread(app) as url:
        async with httpx.AsyncClient(base_url=url, headers={"authorization": f"Bearer {admin}"}, timeout=600) as http:
            keys = []
            for name in ("users", "adversaries"):
                r = await http.post("/v1/tenants", json={"name": name})
                r.raise_for_status()
                keys.append(r.json()["api_key"])
            users = NumberUsers(url, keys[0], keys[1], max_tokens=s.max_tokens, feedback_share=s.feedback_share,
                                outcome_share=s.outcome_share, adversarial_share=s.adversarial_share, seed=s.seed,
                                version_of=version_of)
            # ---------------------------------------------------------------- 1. before
            trainer.publishing = False
            before = await users.run(s.before, concurrency=s.concurrency)
            result.before = before.summary()
            result.phases["before_s"] = time.perf_counter() - t0
            log(f"before: judge {before} (version 0 only); users' thumbs up {result.before['users_thumbs_up']}")
            # ---------------------------------------------------------------- 2. learning
            trainer.publishing = True
            learn_end = time.perf_counter() + s.learn_seconds
            above, learned = 0, False
            while time.perf_counter() < learn_end and not learned:
                last = await users.run(s.window, concurrency=s.concurrency)
                snap = (await http.get("/rl/online")).json()
                above = above + 1 if _rose(before, last, s.rise_errors) else 0
                learned = above >= 2 and any(d["action"] == "promote" and d["by"] == "auto"
                                             for d in snap["canary"]["decisions"])
                line = {"t_s": round(time.perf_counter() - t0, 1), **last.summary(),
                        "stable": snap["canary"]["stable_version"], "canary": snap["canary"]["canary_version"],
                        "steps": snap["trainer"]["steps"], "firing": [f["guard"] + f"@v{f['version']}"
                                                                      for f in snap["guards"]["firing"]]}
                result.curve.append(line)
                log(f"  {line['t_s']:7.0f} s  judge {last}  stable v{line['stable']}  canary "
                    f"{'v' + str(line['canary']) if line['canary'] is not None else '-'}  steps {line['steps']}  "
                    f"guards firing {line['firing']}; judge by version {line['by_version']}")
            after = await users.run(s.window, concurrency=s.concurrency)  # fresh: the stopping rule never saw it
            result.learned = learned
            result.after = after.summary()
            result.phases["learning_s"] = time.perf_counter() - t0 - result.phases["before_s"]
            log(f"after: judge {after}; users' thumbs up {result.after['users_thumbs_up']}")
            # ---------------------------------------------------------------- 3. a bad checkpoint
            t_bad = time.perf_counter()
            trainer.publishing = False
            waited = 0
            while canary.canary_version is not None and waited < s.bad_max_conversations:
                await users.run(16, concurrency=s.concurrency)  # the running canary is decided first ...
                waited += 16
            if canary.canary_version is not None:  # ... or, past the budget, the operator rolls it back (reported)
                r = await http.post("/rl/canary/rollback", json={"reason": "the proof needs the slot for the bad "
                                                                           "checkpoint"})
                r.raise_for_status()
            while not engines.can_load():
                await asyncio.sleep(0.5)
            trial = await put_on_trial(http, canary, users, bad_path, concurrency=s.concurrency,
                                       max_conversations=s.bad_max_conversations, log=log)
            result.bad_version, result.bad_conversations, result.bad_decision = \
                trial.version, trial.conversations, trial.decision
            result.phases["bad_checkpoint_s"] = time.perf_counter() - t_bad
            snap = (await http.get("/rl/online")).json()
            result.online = snap
            result.guards = snap["guards"]
            result.decisions = [d.to_dict() for d in canary.decisions]
            result.attacks = dict(users.attacks)
            result.conversations = users.conversations
    result.seconds = time.perf_counter() - t0
    return result
