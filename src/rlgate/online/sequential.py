"""Always-valid confidence sequences: how the canary compares live reward between two versions.

**Decision: a confidence sequence (Robbins' normal mixture, as in Howard, Ramdas, McAuliffe and
Sekhon 2021, "Time-uniform, nonparametric, nonasymptotic confidence sequences"), not a Wald SPRT.**
The canary looks at the data after *every* reward and stops whenever it likes: a fixed-sample
test read that way rejects far more often than its level says, while a confidence sequence holds
at all sample sizes at once (Ville's inequality), so peeking is free. Wald's SPRT is also
sequential, but it needs two simple hypotheses and a likelihood (thumbs as Bernoulli); live
rewards are thumbs, 1-5 ratings and delayed outcomes mapped to one scale by the RewardMap, so the
test must hold for any reward in a known range ``[low, high]``: such a reward is sub-Gaussian
with variance proxy ``((high - low) / 2)^2`` (Hoeffding), which is all the mixture bound needs.
The price: its interval is wider than a fixed-n interval (about 1.5-2x at the planned size).

For the running sum ``S_n`` of ``n`` centred rewards with variance proxy ``V = n sigma^2``, the
normal mixture with precision ``rho`` gives, for all ``n`` at once with probability >= 1 - alpha::

    |S_n| <= sqrt((V + rho) * log((V + rho) / (rho * alpha^2)))

so the mean lies within that radius / n of the running mean. ``rho = sigma^2 * plan`` makes the
bound tightest around ``plan`` samples. Two versions are compared with one sequence each at
``alpha / 2`` (a union bound): the difference of the means lies in
``[lo_canary - hi_stable, hi_canary - lo_stable]`` at every moment with probability >= 1 - alpha.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class RunningMean:
    """Rewards seen for one version (count and sum: O(1) memory)."""

    n: int = 0
    total: float = 0.0

    def add(self, reward: float) -> None:
        self.n += 1
        self.total += reward

    @property
    def mean(self) -> float:
        return self.total / self.n if self.n else 0.0


def radius(n: int, *, low: float, high: float, alpha: float, plan: int) -> float:
    """Half-width of the (1 - alpha) confidence sequence for the mean of ``n`` rewards in
    ``[low, high]`` (infinite for n = 0)."""
    if n <= 0:
        return math.inf
    if not high > low or not 0 < alpha < 1 or plan < 1:
        raise ValueError("need high > low, 0 < alpha < 1 and plan >= 1")
    sigma2 = ((high - low) / 2) ** 2
    v = n * sigma2
    rho = sigma2 * plan
    return math.sqrt((v + rho) * math.log((v + rho) / (rho * alpha ** 2))) / n


@dataclass(frozen=True)
class Comparison:
    """Canary minus stable: the difference of mean rewards and its always-valid interval."""

    diff: float
    lower: float
    upper: float
    n_stable: int
    n_canary: int


def compare(stable: RunningMean, canary: RunningMean, *, low: float, high: float, alpha: float,
            plan: int) -> Comparison:
    """The interval for mean(canary) - mean(stable), valid at every sample size (see the module docstring)."""
    rs = radius(stable.n, low=low, high=high, alpha=alpha / 2, plan=plan)
    rc = radius(canary.n, low=low, high=high, alpha=alpha / 2, plan=plan)
    diff = canary.mean - stable.mean
    width = rs + rc
    # a mean's interval never leaves [low, high]: clamp each side before differencing
    c_lo, c_hi = max(canary.mean - rc, low), min(canary.mean + rc, high)
    s_lo, s_hi = max(stable.mean - rs, low), min(stable.mean + rs, high)
    if math.isinf(width):
        return Comparison(diff, low - high, high - low, stable.n, canary.n)
    return Comparison(diff, c_lo - s_hi, c_hi - s_lo, stable.n, canary.n)
