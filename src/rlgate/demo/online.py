"""The proof of online RL on this machine: simulated users teach the tiny model; a bad checkpoint is rolled back.

:func:`run_proof` builds the whole online stack in one process -- the tiny model (``demo/tiny.py``)
served by two local engines behind the canary (``online/versions.py``), the gateway with the
online serving mode and online training (``server/online_training.py``), the continuous trainer
on a third copy of the model (``train/online.py``) -- serves it on 127.0.0.1, and lets
:class:`~rlgate.online.simulation.SimulatedUsers` (hidden preference: short replies) talk to it
through the real HTTP API:

1. **before**: ``before`` conversations with the trainer holding its candidates (every reply
   from version 0): the users' approval rate;
2. **learning**: conversations go on while the trainer learns from their thumbs, delayed outcomes
   and live groups, and the canary promotes each candidate it finds not worse; the approval rate
   of the last ``window`` conversations is the "after";
3. **bad checkpoint**: the trainer stops offering candidates; once no canary runs, a deliberately
   bad checkpoint (the learning reversed: ``2 * start - stable``) is pushed through
   ``POST /rl/update_weights`` like any checkpoint; the users go on until the canary decides.

``benchmarks/online.py`` prints the result; ``tests/test_online_simulation.py`` runs a smaller one.
"""

from __future__ import annotations

import asyncio
import copy
import secrets
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from rlgate.online.simulation import ShortAnswers, SimulatedUsers, Window
from rlgate.trajectory.reward import FinishedEpisode


@dataclass
class ProofSettings:
    """Sized for a few minutes on 2 shared CPU cores (``benchmarks/online.py``); the test runs a smaller one."""

    max_chars: int = 25  # the hidden preference (about the median reply of the untrained tiny model at 8 tokens)
    max_tokens: int = 8
    before: int = 192  # conversations served by version 0 only
    window: int = 192  # conversations per report line; the last one is the "after"
    learn_seconds: float = 300.0  # the learning phase's length (with until_learned: its ceiling)
    # end the learning phase once two windows in a row are above the "before" by more than three standard
    # errors and the canary has promoted a candidate, then serve one fresh window as the "after" (the windows
    # that stopped it would be a biased pick); the test waits on this condition, not on a clock
    until_learned: bool = False
    bad_max_conversations: int = 1200  # the canary must decide on the bad checkpoint within this many
    concurrency: int = 16
    lr: float = 1e-3
    train_batch: int = 32
    group_fraction: float = 0.25
    group_size: int = 4
    canary_share: float = 0.5
    canary_margin: float = 0.2
    canary_min_samples: int = 20
    canary_plan_samples: int = 100
    candidate_steps: int = 1
    # the reward-hacking guards (online/hacking.py): "alarm" here, since these users' preference (short replies)
    # invites the empty-reply hack this fast proof is not about; the real-model proof (demo/online_real.py)
    # runs the default, "pause". The before phase measures their reference (half vocabulary, half rates).
    hacking_action: str = "alarm"
    seed: int = 0


@dataclass
class ProofResult:
    before: dict[str, float]
    after: dict[str, float]
    curve: list[dict[str, Any]] = field(default_factory=list)  # one line per window of the learning phase
    bad_version: int | None = None
    bad_decision: dict[str, Any] | None = None  # the canary's decision on the bad checkpoint
    bad_conversations: int = 0  # conversations it took
    learned: bool = False  # with until_learned: the condition ended the learning phase (not the ceiling)
    decisions: list[dict[str, Any]] = field(default_factory=list)
    online: dict[str, Any] = field(default_factory=dict)  # /rl/online at the end
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _rate(w: Window) -> dict[str, float]:
    return {"approval": w.rate, "stderr": w.stderr, "n": float(w.n)}


def length_reward(max_chars: int) -> Callable[[FinishedEpisode], float]:
    """The operator's reward for live groups: shorter is better (a proxy; the users' rule is hidden)."""
    def reward(episode: FinishedEpisode) -> float:
        return -min(len(episode.final_text), 4 * max_chars) / max_chars
    return reward


async def run_proof(out_dir: Path, s: ProofSettings, log: Callable[[str], None] = print) -> ProofResult:
    import torch
    from transformers import AutoModelForCausalLM

    from rlgate.config import GatewayConfig, OnlineConfig
    from rlgate.demo.canary_trial import put_on_trial
    from rlgate.demo.scripted import ensure_tiny_model
    from rlgate.engine.factory import EnginePlan
    from rlgate.model import load_tokenizer
    from rlgate.online.groups import scorer_of
    from rlgate.server.app import create_app
    from rlgate.server.runner import ServerThread
    from rlgate.store.base import MemoryStore
    from rlgate.train.online import build_online_training
    from rlgate.train.policy import save_for_serving

    t0 = time.perf_counter()
    torch.manual_seed(s.seed)
    model_dir = ensure_tiny_model(out_dir, seed=s.seed)
    tokenizer = load_tokenizer(model_dir)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    start_state = {k: v.detach().clone() for k, v in base.state_dict().items()}
    options = OnlineConfig(train=True, lr=s.lr, group_fraction=s.group_fraction, group_size=s.group_size,
                            train_batch=s.train_batch, canary_share=s.canary_share, canary_margin=s.canary_margin,
                            canary_min_samples=s.canary_min_samples, canary_plan_samples=s.canary_plan_samples,
                            candidate_steps=s.candidate_steps, conversation_idle_s=2.0,
                            hacking_action=s.hacking_action,  # type: ignore[arg-type]
                            hacking_reference_replies=s.before // 2)
    training = build_online_training(base, options, tokenizer, engine=EnginePlan(seed=s.seed),
                                     scorer=scorer_of(length_reward(s.max_chars)))
    engines, trainer, canary = training.engines, training.trainer, training.canary
    assert engines is not None and trainer is not None
    admin = secrets.token_urlsafe(16)
    app = create_app(GatewayConfig(admin_key=admin, max_sessions=1_000_000), engines, MemoryStore(), tokenizer,
                     online=OnlineConfig(online=True), online_training=training)
    result = ProofResult(before={}, after={})
    with ServerThread(app) as url:
        async with httpx.AsyncClient(base_url=url, headers={"authorization": f"Bearer {admin}"}, timeout=60) as http:
            r = await http.post("/v1/tenants", json={"name": "simulated users"})
            r.raise_for_status()
            users = SimulatedUsers(url, r.json()["api_key"], ShortAnswers(s.max_chars), max_tokens=s.max_tokens,
                                   seed=s.seed)
            # ---------------------------------------------------------------- 1. before
            trainer.publishing = False
            before = await users.run(s.before, concurrency=s.concurrency)
            result.before = _rate(before)
            log(f"before: approval {before} (version 0 only)")
            # ---------------------------------------------------------------- 2. learning
            trainer.publishing = True  # read by the trainer at its next step (the feedback keeps coming)
            learn_end = time.perf_counter() + s.learn_seconds
            last = before
            learned, above = False, 0
            while time.perf_counter() < learn_end and not learned:
                last = await users.run(s.window, concurrency=s.concurrency)
                snap = (await http.get("/rl/online")).json()
                above = above + 1 if _rose(before, last, 3.0) else 0
                learned = s.until_learned and above >= 2 and any(
                    d["action"] == "promote" and d["by"] == "auto" for d in snap["canary"]["decisions"])
                line = {"t_s": round(time.perf_counter() - t0, 1), **_rate(last),
                        "stable": snap["canary"]["stable_version"], "canary": snap["canary"]["canary_version"],
                        "steps": snap["trainer"]["steps"], "group_samples": snap["trainer"]["received_group_samples"],
                        "feedback_samples": snap["trainer"]["received_feedback_samples"]}
                result.curve.append(line)
                log(f"  {line['t_s']:6.0f} s  approval {last}  stable v{line['stable']}  canary "
                    f"{'v' + str(line['canary']) if line['canary'] is not None else '-'}  steps {line['steps']}")
            if learned:  # an unbiased "after": a window the stopping rule did not look at
                last = await users.run(s.window, concurrency=s.concurrency)
            result.learned = learned
            result.after = _rate(last)
            log(f"after: approval {last}")
            # ---------------------------------------------------------------- 3. a bad checkpoint
            trainer.publishing = False
            while canary.canary_version is not None:  # the running canary is decided first
                await users.run(32, concurrency=s.concurrency)
            while not engines.can_load():  # the spare slot's conversations go idle (conversation_idle_s)
                await asyncio.sleep(0.25)
            stable_engine = engines.slot_of(canary.stable_version)
            stable_state = stable_engine.model.state_dict()  # type: ignore[attr-defined]
            bad = copy.deepcopy(base)
            bad.load_state_dict({k: 2 * start_state[k] - stable_state[k] for k in start_state})
            path = Path(tempfile.mkdtemp(dir=out_dir, prefix="bad-checkpoint-"))
            save_for_serving(bad, path)
            trial = await put_on_trial(http, canary, users, path, concurrency=s.concurrency,
                                       max_conversations=s.bad_max_conversations, log=log)
            result.bad_version, result.bad_conversations, result.bad_decision = \
                trial.version, trial.conversations, trial.decision
            snap = (await http.get("/rl/online")).json()
            result.online = snap
            result.decisions = snap["canary"]["decisions"]
    result.seconds = time.perf_counter() - t0
    return result


def _rose(before: Window, after: Window, errors: float) -> bool:
    """``after``'s approval is above ``before``'s by more than ``errors`` standard errors of the difference."""
    return after.rate - before.rate > errors * (before.stderr ** 2 + after.stderr ** 2) ** 0.5


def main_async(out_dir: Path, settings: ProofSettings) -> ProofResult:
    return asyncio.run(run_proof(out_dir, settings))
