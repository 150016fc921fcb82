"""Time to accuracy, with enough seeds to tell a difference from bad luck: the report of ``vs_trl.py`` runs.

The protocol (docs/training.md, "Learning: rlgate against TRL, seed by seed"):

1. run both loops from the same checkpoint on the same prompts, reward, batch and optimiser settings,
   at least 8 seeds per side, evaluating the held-out questions greedily every few steps::

       python benchmarks/vs_trl.py --model smollm2 --task compare --steps 16 --eval-every 4 \\
           --seeds 0 1 2 3 4 5 6 7 --sides rlgate trl --out runs/A --json runs/A/rows.jsonl

2. report it::

       python benchmarks/learning.py runs/A/rows.jsonl --plot docs/img/learning-compare.png

Per side it prints the mean held-out curve (exactly right, and right in any form) at each evaluated
step with a 95% confidence interval over seeds (Student t), the loop's wall and CPU time to each
step (evaluations excluded), how many seeds learned (final exact accuracy >= ``--learned``), and the
time to accuracy: for each run, the loop's wall time at the first evaluation whose accuracy reaches
``--target`` (default: the mean final accuracy of the reference side, ``--reference``), its median
over seeds and how many runs never got there. Between two sides: the difference of the final mean
accuracies with its 95% CI (Welch), a permutation test's p-value, a Fisher exact test on the count of
seeds that learned, and the smallest difference these seeds could detect (80% power, 5% two-sided:
``2.8 * sqrt(s1^2/n1 + s2^2/n2)``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23, 11: 2.20,
       12: 2.18, 13: 2.16, 14: 2.14, 15: 2.13, 16: 2.12, 20: 2.09, 30: 2.04}


def t95(df: int) -> float:
    if df <= 0:
        return float("nan")
    return T95.get(df) or next((v for k, v in sorted(T95.items()) if k >= df), 1.96)


def mean_ci(xs: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% confidence interval."""
    m = statistics.fmean(xs)
    if len(xs) < 2:
        return m, float("nan")
    return m, t95(len(xs) - 1) * statistics.stdev(xs) / math.sqrt(len(xs))


def welch(a: list[float], b: list[float]) -> tuple[float, float]:
    """Difference of means (a - b) and the half-width of its 95% CI (Welch-Satterthwaite)."""
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    se = math.sqrt(va + vb)
    if se == 0:
        return statistics.fmean(a) - statistics.fmean(b), 0.0
    df = (va + vb) ** 2 / ((va ** 2) / (len(a) - 1) + (vb ** 2) / (len(b) - 1))
    return statistics.fmean(a) - statistics.fmean(b), t95(max(1, round(df))) * se


def permutation_p(a: list[float], b: list[float], rounds: int = 20000, seed: int = 0) -> float:
    """Two-sided p-value of the difference of means under random relabelling."""
    observed = abs(statistics.fmean(a) - statistics.fmean(b))
    pooled, n = a + b, len(a)
    rng = random.Random(seed)
    hits = 0
    for _ in range(rounds):
        rng.shuffle(pooled)
        hits += abs(statistics.fmean(pooled[:n]) - statistics.fmean(pooled[n:])) >= observed - 1e-12
    return hits / rounds


def fisher_p(k1: int, n1: int, k2: int, n2: int) -> float:
    """Two-sided Fisher exact test on k1/n1 vs k2/n2."""
    total, k = n1 + n2, k1 + k2

    def prob(x: int) -> float:
        return math.comb(n1, x) * math.comb(n2, k - x) / math.comb(total, k)

    p0 = prob(k1)
    return min(1.0, sum(prob(x) for x in range(max(0, k - n2), min(k, n1) + 1) if prob(x) <= p0 * (1 + 1e-9)))


def _median_time(times: list[float | None]) -> float:
    return statistics.median(math.inf if t is None else t for t in times)


def time_ratio(a: list[float | None], b: list[float | None], rounds: int = 5000,
               seed: int = 0) -> tuple[float, float, float]:
    """Median time of ``a`` over median time of ``b`` (None: never reached, infinitely slow), with a
    percentile bootstrap 95% interval over seeds (each side resampled with replacement)."""
    def ratio(x: list[float | None], y: list[float | None]) -> float:
        mx, my = _median_time(x), _median_time(y)
        if math.isinf(mx) and math.isinf(my):
            return math.nan
        return mx / my if my > 0 else math.inf

    rng = random.Random(seed)
    boot = sorted(ratio([rng.choice(a) for _ in a], [rng.choice(b) for _ in b]) for _ in range(rounds))
    boot = [v for v in boot if v == v]
    if not boot:
        return ratio(a, b), math.nan, math.nan
    return ratio(a, b), boot[int(0.025 * len(boot))], boot[min(len(boot) - 1, int(0.975 * len(boot)))]


def _ratio(v: float) -> str:
    if v == 0:
        return "0 (the reference's median run never got there)"
    return "never (its median run never got there)" if math.isinf(v) else "n/a" if v != v else f"{v:.2f}x"


def load(paths: list[str]) -> dict[str, list[dict[str, Any]]]:
    by_side: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for p in paths:
        for line in Path(p).read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                by_side[row["side"]].append(row)
    return by_side


def time_to(row: dict[str, Any], target: float, key: str = "exact", clock: str = "wall_s") -> float | None:
    """The loop's time at the first evaluation reaching ``target`` (None: never)."""
    return next((p[clock] for p in row["curve"] if p[key] >= target - 1e-9), None)


def report(by_side: dict[str, list[dict[str, Any]]], *, reference: str | None, target: float | None,
           learned: float) -> list[str]:
    out: list[str] = []
    sides = sorted(by_side)
    finals = {s: [r["curve"][-1]["exact"] for r in by_side[s]] for s in sides}
    if target is None and reference in by_side:
        target = statistics.fmean(finals[reference])
    for side in sides:
        rows = by_side[side]
        out.append(f"\n### {side}: {len(rows)} seeds ({', '.join(str(r['seed']) for r in rows)})\n")
        out.append("| step | exactly right, greedy (95% CI) | right in any form | loop wall s | loop CPU s |")
        out.append("|---|---|---|---|---|")
        steps = sorted({p["step"] for r in rows for p in r["curve"]})
        for st in steps:
            pts = [p for r in rows for p in r["curve"] if p["step"] == st]
            if len(pts) < len(rows):
                continue
            e, eci = mean_ci([p["exact"] for p in pts])
            a, aci = mean_ci([p["right"] for p in pts])
            w = statistics.median(p["wall_s"] for p in pts)
            c = statistics.median(p["cpu_s"] for p in pts)
            out.append(f"| {st} | {100 * e:.1f}% ± {100 * eci:.1f} | {100 * a:.1f}% ± {100 * aci:.1f} | {w:.0f} | {c:.0f} |")
        ok = sum(f >= learned for f in finals[side])
        step_s = statistics.median(r["step_s"] for r in rows)
        load = statistics.median(r["load"] for r in rows)
        out.append(f"\nlearned (final exact >= {100 * learned:.0f}%): {ok} of {len(rows)}; median s/step {step_s:.2f} "
                   f"(rollout {statistics.median(r['rollout_s'] for r in rows):.2f}, train "
                   f"{statistics.median(r['train_s'] for r in rows):.2f}); median load {load:.1f}")
        if target is not None:
            times = [time_to(r, target) for r in rows]
            cpus = [time_to(r, target, clock="cpu_s") for r in rows]
            got = [t for t in times if t is not None]
            got_cpu = [t for t in cpus if t is not None]
            out.append(f"time to {100 * target:.1f}% exact (the target): reached by {len(got)} of {len(rows)}"
                       + (f", median {statistics.median(got):.0f} s of loop wall time, "
                          f"{statistics.median(got_cpu):.0f} s of loop CPU time" if got else ""))
    if target is not None and reference in by_side:
        for side in sides:
            if side == reference:
                continue
            for clock, name in (("wall_s", "wall"), ("cpu_s", "CPU")):
                r, lo, hi = time_ratio([time_to(x, target, clock=clock) for x in by_side[side]],
                                       [time_to(x, target, clock=clock) for x in by_side[reference]])
                out.append(f"\n{side} / {reference}, median {name} time to {100 * target:.1f}% exact: "
                           f"{_ratio(r)} (bootstrap 95% interval {_ratio(lo)} to {_ratio(hi)}; a run that never "
                           "reached it counts as infinitely slow)")
    for a, b in itertools.combinations(sides, 2):
        fa, fb = finals[a], finals[b]
        if len(fa) < 2 or len(fb) < 2:
            continue
        d, ci = welch(fa, fb)
        mde = 2.8 * math.sqrt(statistics.variance(fa) / len(fa) + statistics.variance(fb) / len(fb))
        ka, kb = sum(f >= learned for f in fa), sum(f >= learned for f in fb)
        out.append(f"\n{a} - {b}: final exact {100 * d:+.1f} points (95% CI ± {100 * ci:.1f}), permutation p = "
                   f"{permutation_p(fa, fb):.3f}; learned {ka}/{len(fa)} vs {kb}/{len(fb)}, Fisher p = "
                   f"{fisher_p(ka, len(fa), kb, len(fb)):.3f}; smallest detectable difference with these seeds "
                   f"(80% power): {100 * mde:.0f} points")
    return out


def plot(by_side: dict[str, list[dict[str, Any]]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for side, rows in sorted(by_side.items()):
        for ax, clock in zip(axes, ("step", "wall_s"), strict=True):
            steps = sorted({p["step"] for r in rows for p in r["curve"]})
            xs, ms, lo, hi = [], [], [], []
            for st in steps:
                pts = [p for r in rows for p in r["curve"] if p["step"] == st]
                if len(pts) < len(rows):
                    continue
                m, ci = mean_ci([p["exact"] for p in pts])
                xs.append(st if clock == "step" else statistics.median(p["wall_s"] for p in pts))
                ms.append(100 * m)
                lo.append(100 * (m - (ci if ci == ci else 0)))
                hi.append(100 * (m + (ci if ci == ci else 0)))
            line, = ax.plot(xs, ms, marker="o", label=f"{side} ({len(rows)} seeds)")
            ax.fill_between(xs, lo, hi, alpha=0.2, color=line.get_color())
    axes[0].set_xlabel("GRPO step")
    axes[1].set_xlabel("loop wall time, s (median over seeds)")
    axes[0].set_ylabel("held-out greedy, exactly right (%)")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("rows", nargs="+", help="JSON-lines files written by vs_trl.py --json")
    ap.add_argument("--reference", default="trl", help="the side whose final mean accuracy is the target")
    ap.add_argument("--target", type=float, default=None, help="the accuracy to reach (default: the reference's)")
    ap.add_argument("--learned", type=float, default=0.2, help="final exact accuracy counted as 'learned'")
    ap.add_argument("--sides", nargs="*", default=None, help="only these sides")
    ap.add_argument("--plot", default=None, help="write the curves (mean and 95%% CI) to this PNG")
    ap.add_argument("--title", default="held-out accuracy over steps and wall time")
    args = ap.parse_args()
    by_side = load(args.rows)
    if args.sides:
        by_side = {s: r for s, r in by_side.items() if s in args.sides}
    print("\n".join(report(by_side, reference=args.reference, target=args.target, learned=args.learned)))
    if args.plot:
        plot(by_side, Path(args.plot), args.title)


if __name__ == "__main__":
    main()
