"""Online RL on this machine: simulated users' approval before / after, and the canary rolling back a bad checkpoint.

    python benchmarks/online.py --out /tmp/online                 # ~5 minutes of learning (the default)
    python benchmarks/online.py --out /tmp/online --learn-seconds 120 --json result.json

Runs ``rlgate.demo.online.run_proof``: the tiny model behind the gateway in online mode (two local
engines: stable + canary), simulated users with a hidden preference (replies of at most
``--max-chars`` characters) giving thumbs and delayed outcomes through the real HTTP API, the
continuous trainer and the canary. Prints the approval rate before and after (with its standard
error), the learning curve (one line per window of conversations: approval, stable / canary
version, steps), and the canary's decision on a deliberately bad checkpoint, with the load average.
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
    from rlgate.demo.online import ProofSettings, main_async

    d = ProofSettings()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="the tiny model and the bad checkpoint go here")
    p.add_argument("--learn-seconds", type=float, default=d.learn_seconds)
    p.add_argument("--window", type=int, default=d.window)
    p.add_argument("--before", type=int, default=d.before)
    p.add_argument("--max-chars", type=int, default=d.max_chars)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--candidate-steps", type=int, default=d.candidate_steps,
                   help="training steps between two canary candidates")
    p.add_argument("--until-learned", action="store_true",
                   help="end learning once two windows in a row are above the before by > 3 standard errors and "
                        "a candidate was promoted (--learn-seconds is then the ceiling), then serve one fresh window "
                        "as the after (what tests/test_online_simulation.py runs)")
    p.add_argument("--json", default=None, help="write the whole result here")
    a = p.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    settings = ProofSettings(learn_seconds=a.learn_seconds, window=a.window, before=a.before, max_chars=a.max_chars,
                             seed=a.seed, candidate_steps=a.candidate_steps, until_learned=a.until_learned)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()
    r = main_async(out, settings)
    b, f = r.before, r.after
    print(f"\napproval before: {b['approval']:.1%} ± {b['stderr']:.1%} (n={b['n']:.0f}, version 0)")
    print(f"approval after:  {f['approval']:.1%} ± {f['stderr']:.1%} (n={f['n']:.0f}, "
          f"{'a fresh window after the condition held' if r.learned else 'last window'})")
    print(f"difference: {f['approval'] - b['approval']:+.1%} ± {(b['stderr'] ** 2 + f['stderr'] ** 2) ** 0.5:.1%}")
    print("\n| t (s) | approval | ± | stable | canary | steps | group samples | feedback samples |")
    print("|---|---|---|---|---|---|---|---|")
    for c in r.curve:
        print(f"| {c['t_s']:.0f} | {c['approval']:.1%} | {c['stderr']:.1%} | v{c['stable']} | "
              f"{'v' + str(c['canary']) if c['canary'] is not None else '-'} | {c['steps']} | {c['group_samples']} | "
              f"{c['feedback_samples']} |")
    print(f"\nbad checkpoint: version {r.bad_version}; after {r.bad_conversations} conversations the canary decided:")
    print(json.dumps(r.bad_decision, indent=1))
    print("\ndecisions:")
    for d_ in r.decisions:
        print(f"  {d_['action']:8s} v{d_['version']} by {d_['by']}: {d_['reason']}")
    g = r.online.get("guards") or {}
    print(f"\nreward-hacking guards ({g.get('action')}): reference {g.get('reference')}; alarms {g.get('alarms')}")
    for e in g.get("record", []):
        print(f"  {e['event']:9s} {e['guard']} on v{e['version']}: {e['reason']}")
    print(f"\n{r.seconds:.0f} s in all; load average at start {load[0]:.1f}, at end {os.getloadavg()[0]:.1f}")
    if a.json:
        Path(a.json).write_text(json.dumps(r.to_dict(), indent=1))
    ok = r.bad_decision is not None and r.bad_decision["action"] == "rollback" and r.bad_decision["by"] == "auto"
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
