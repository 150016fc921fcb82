"""The proof, smaller: simulated users teach the tiny model through the real HTTP API, and the canary
rolls a deliberately bad checkpoint back on its own (benchmarks/online.py runs the full size)."""

from __future__ import annotations

import pytest

from rlgate.online.simulation import ShortAnswers, Window


def test_window_rate_and_standard_error() -> None:
    w = Window([1, 0, 1, 1])
    assert w.rate == 0.75 and abs(w.stderr - (0.75 * 0.25 / 4) ** 0.5) < 1e-12 and "75.0%" in str(w)
    assert ShortAnswers(3).approves("abc") and not ShortAnswers(3).approves("abcd")


@pytest.mark.torch
@pytest.mark.slow
def test_users_approval_rises_and_a_bad_checkpoint_is_rolled_back(tmp_path) -> None:
    from rlgate.demo.online import ProofSettings, main_async

    # learning goes on until a window shows it (and a candidate was promoted), within a ceiling that only
    # a stuck run reaches; the "after" is one more window, served after the condition held
    # the bad checkpoint is the learning reversed; when it stays close to stable in the users' eyes the canary needs
    # more rewards to tell (CI once saw no decision within 800 conversations): the trial runs until it decides
    r = main_async(tmp_path, ProofSettings(before=96, window=96, learn_seconds=1800.0, until_learned=True,
                                           bad_max_conversations=4000, concurrency=16, candidate_steps=4))
    assert r.learned, r.curve
    before, after = r.before, r.after
    # the users' approval rose by more than twice its standard error
    se = (before["stderr"] ** 2 + after["stderr"] ** 2) ** 0.5
    assert after["approval"] - before["approval"] > 2 * se, (before, after, r.curve)
    assert any(d["action"] == "promote" and d["by"] == "auto" for d in r.decisions)
    # the bad checkpoint went to the canary like any checkpoint, and the canary rolled it back alone
    assert r.bad_decision is not None, r.decisions
    assert r.bad_decision["action"] == "rollback" and r.bad_decision["by"] == "auto", r.bad_decision
    assert r.bad_decision["comparison"]["upper"] < 0
    assert r.online["canary"]["stable_version"] != r.bad_version
