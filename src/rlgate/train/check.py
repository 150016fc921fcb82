"""``rlgate train --check`` (= ``rlgate check``): a dry run before hours of training.

Checks the config, imports the agent (and reward function), starts or reaches the
gateway, plays ``episodes`` episodes on the first dataset items, prints what was
recorded — each sample's token segments with their loss mask, the reward, the
surfaces used, logprobs and weight versions of the generated tokens — and exits: 0 when
every episode was recorded and rewarded, 1 otherwise (with the failure's traceback).
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from rlgate.rollout.errors import RunError
from rlgate.train.config import TrainConfig, load_config
from rlgate.train.run import make_runner, prepare_start, report_error

_SURFACES = {"chat": "OpenAI Chat Completions", "responses": "OpenAI Responses", "messages": "Anthropic Messages"}


def _clip(text: str, n: int = 240) -> str:
    return text if len(text) <= n else text[: n // 2] + f" …[{len(text) - n} chars]… " + text[-n // 2:]


def _segments(mask: list[int]) -> list[tuple[int, int, int]]:
    """(start, end, mask value) runs."""
    out: list[tuple[int, int, int]] = []
    start = 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            out.append((start, i, mask[start]))
            start = i
    return out


def describe_episode(ep: Any, tokenizer: Any, *, max_tokens: int = 24) -> str:
    decode = (lambda ids: tokenizer.decode(ids, skip_special_tokens=False)) if tokenizer is not None else str
    lines = [f"episode {ep.group_id}: reward {ep.reward}, {len(ep.samples)} sample(s), {ep.seconds:.1f} s, "
             f"session {ep.session_id}"]
    for k, s in enumerate(ep.samples, 1):
        versions = sorted({v for v, m in zip(s.versions, s.loss_mask, strict=True) if m})
        lines.append(f"  sample {k}/{len(ep.samples)} {s.id} via {s.api} ({_SURFACES.get(s.api, s.api)}), "
                     f"finish {s.finish_reason}, reward {s.reward}, {len(s.input_ids)} tokens, "
                     f"{s.generated_tokens} generated, weight versions {versions}")
        for start, end, m in _segments(s.loss_mask):
            label = "generated (loss 1)" if m else "prompt    (loss 0)"
            lines.append(f"    {label} {end - start:5d} tokens: {_clip(decode(s.input_ids[start:end]))!r}")
        gen = [i for i, m in enumerate(s.loss_mask) if m][:max_tokens]
        if gen:
            lines.append("    first generated tokens (id, text, logprob, version):")
            lines.append("      " + "  ".join(f"{s.input_ids[i]} {decode([s.input_ids[i]])!r} {s.logprobs[i]:.3f} "
                                              f"v{s.versions[i]}" for i in gen))
    return "\n".join(lines)


async def check(cfg: TrainConfig, *, episodes: int = 1, print_fn: Any = print) -> int:
    from rlgate.train.gateway import GatewayPlan, open_gateway

    prep = await prepare_start(cfg, log=print_fn)
    named = (f"{cfg.model} (warm start: {prep.model})" if cfg.warm_start is not None
             else cfg.model if str(cfg.model) == str(prep.model) else f"{cfg.model} ({prep.model})")
    print_fn(f"config ok; model {named}; {len(prep.data)} training items"
             + (f", {len(prep.eval_data)} eval items" if prep.eval_data else "")
             + f"; agent {cfg.agent}" + (f"; reward {cfg.reward}" if cfg.reward else ""))
    gw = await open_gateway(GatewayPlan.of(cfg), prep.model, prep.model)
    print_fn(f"gateway {gw.url} ({'in-process' if gw.server else 'replicas on Ray' if gw.cluster else 'remote'}), "
             f"weight version {(await gw.client.health())['version']}")
    tokenizer = gw.tokenizer
    if tokenizer is None:
        try:
            from rlgate.model import load_tokenizer

            tokenizer = load_tokenizer(prep.model)
        except Exception:  # noqa: BLE001 - token ids are printed as ids then
            tokenizer = None
    runner = make_runner(cfg, gw.client, prep.agent, prep.reward_fn)
    runner.max_consecutive_failures = 0  # the first failure's traceback is logged by the runner
    try:
        items = [prep.data[i % len(prep.data)] for i in range(episodes)]
        await gw.client.grant_capacity(len(items))
        surfaces: set[str] = set()
        dropped: dict[str, int] = {}  # part the chat template left out -> samples
        failed = 0
        for i, item in enumerate(items):
            ep = await runner.episode(f"check-{i}", 0, item, admit=False)
            if not ep.ok:
                failed += 1
                print_fn(f"episode check-{i} FAILED: {ep.error}")
                continue
            surfaces |= {s.api for s in ep.samples}
            for part in (f.removeprefix("dropped_") for s in ep.samples for f in s.flags if f.startswith("dropped_")):
                dropped[part] = dropped.get(part, 0) + 1
            print_fn(describe_episode(ep, tokenizer))
        if failed:
            raise RunError(f"check: {failed} of {len(items)} episode(s) failed (see above)")
        used = ", ".join(f"{s} ({_SURFACES.get(s, s)})" for s in sorted(surfaces))
        if dropped:
            print_fn(_dropped_warning(cfg, dropped))
            print_fn(f"check passed WITH WARNINGS: {len(items)} episode(s) recorded and rewarded, but the model never "
                     f"saw the agent's {' and '.join(dropped)} (above); surfaces used: {used}")
            return 0
        print_fn(f"check passed: {len(items)} episode(s) recorded and rewarded; surfaces used: {used}")
        return 0
    finally:
        await runner.aclose()
        await gw.close()


def _dropped_warning(cfg: TrainConfig, dropped: dict[str, int]) -> str:
    """What a chat template left out of the episodes' prompts (chat/template_support.py), loudly."""
    lines = ["", "WARNING: the chat template of " + str(cfg.model) + " left part of the agent's requests out of the "
             "prompts: the model never saw it, and training cannot teach it to use it."]
    lines += [f"  {part}: in {n} sample(s) (flag dropped_{part})" for part, n in sorted(dropped.items())]
    if "tools" in dropped or "tool_calls" in dropped:
        lines.append("  To describe the tools in the system message, in the tool-call format the tool parser reads, "
                     "set gateway: {tool_prompt: auto} (--set gateway.tool_prompt=auto; docs/http-api.md"
                     "#tools-a-template-cannot-show).")
    return "\n".join(lines + [""])


def run_check(config_path: str, overrides: list[str] | None = None, *, episodes: int = 1,
              port: int | None = None) -> int:
    try:
        cfg = load_config(config_path, overrides)
        if port is not None:
            cfg.gateway.port = port
        return asyncio.run(check(cfg, episodes=episodes))
    except RunError as exc:
        return report_error(exc, "check")
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
