"""``rlgate train`` fails fast and clearly: each broken setup a newcomer meets, through the real CLI.

Each test asserts the exit code, that the process exited within a (generous) bound — the time is
measured by waiting on the process — and that the message names the culprit.
"""

from __future__ import annotations

import pytest

from helpers import free_port
from train_helpers import base_config, rlgate, write_workdir

BOUND = 600  # seconds: generous (a busy 2-core machine loads torch and the tiny model in minutes); a broken
# run used to go on forever


@pytest.fixture
def work(tmp_path, tiny_model_dir):
    return write_workdir(tmp_path, tiny_model_dir)


def _train(work, env=None, **over):
    return rlgate(work, "train", "--config", "cfg.yaml", config=base_config(**over), env=env)


# --------------------------------------------------------------------------- config (no model loaded)


def test_typos_types_ranges_and_group_size_are_all_reported_before_anything_starts(work):
    config = base_config(grpo={"learning_rate": 1e-5, "micro_batch_size": 0}, lr=3, steps="many",
                         rollout={"discount": 2})
    r = rlgate(work, "train", "--config", "cfg.yaml", "--set", "rollout.groupsize=4", "--set", "rollout.group_size=1",
               config=config)
    assert r.code == 2 and r.seconds < BOUND
    # unknown keys, in the YAML or in --set, with the closest valid key
    assert "grpo.learning_rate: unknown key in cfg.yaml; did you mean grpo.lr?" in r.err
    assert "lr: unknown key in cfg.yaml; did you mean grpo.lr?" in r.err
    assert "rollout.groupsize: unknown key (--set rollout.groupsize=4); did you mean rollout.group_size?" in r.err
    # types and ranges
    assert "steps: Input should be a valid integer" in r.err
    assert "grpo.micro_batch_size: Input should be greater than or equal to 1 (got 0)" in r.err
    assert "rollout.discount: Input should be less than or equal to 1" in r.err
    # a GRPO group of one would never form a batch: refused, not a silent hang
    assert "rollout.group_size: is 1; GRPO compares episodes within a group" in r.err
    assert "Traceback" not in r.err and not (work / "run").exists()  # nothing started


def test_a_missing_model_path_is_named(work):
    r = _train(work, model="checkpoints/does-not-exist")
    assert r.code == 2 and r.seconds < BOUND
    assert "model: 'checkpoints/does-not-exist' does not exist" in r.err and "Repo id" not in r.err


def test_a_missing_agent_module_is_named_with_the_directory_searched(work):
    r = _train(work, agent="my_agnet:Agent")
    assert r.code == 2 and r.seconds < BOUND
    assert "agent: cannot import module 'my_agnet'" in r.err and str(work) in r.err


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_misspelt_agent_class_gets_a_suggestion(work):
    r = _train(work, agent="agents:LenghtAgent")
    assert r.code == 2 and "did you mean agents:LengthAgent?" in r.err


@pytest.mark.parametrize(("agent", "message"), [
    ("agents:NOT_AN_AGENT", "is not an agent: dict has no run() method"),
    pytest.param("agents:WrongSignature", "WrongSignature.run(question) cannot be called as run(data, "
                 "base_url=..., api_key=...)", marks=pytest.mark.slow),
])
def test_something_that_is_not_an_agent_is_refused_before_training(work, agent, message):
    r = _train(work, agent=agent)
    assert r.code == 1 and r.seconds < BOUND
    assert message in r.err and "Traceback" not in r.err


def test_a_wrong_gateway_url_is_named(work):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    r = _train(work, gateway={"url": url}, env={"RLGATE_ADMIN_KEY": "k" * 32})
    assert r.code == 1 and r.seconds < BOUND
    assert f"gateway.url: cannot reach {url}" in r.err and "is `rlgate serve` running there?" in r.err
    assert "Traceback" not in r.err


# --------------------------------------------------------------------------- agents that break at run time


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_an_agent_that_always_raises_stops_the_run_with_one_traceback(work):
    r = _train(work, agent="agents:CrashingAgent", steps=50)
    assert r.code == 1 and r.seconds < BOUND
    assert "4 episodes failed in a row (rollout.max_consecutive_failures = 4)" in r.err
    assert "ValueError: the tool server is down" in r.err
    assert r.err.count("Traceback (most recent call last)") == 1, r.err[-6000:]  # the first failure only, in full
    assert 'agents.py", line' in r.err  # ... pointing into the user's code
    assert "step 1/" not in r.out  # no step, no score


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.slow  # four rlgate train runs (a subprocess each, torch and the tiny model loaded)
@pytest.mark.parametrize(("agent", "message"), [
    ("agents:ReturnsNone", "agent returned None (NoneType); expected a finite float"),
    ("agents:ReturnsText", "agent returned '"),
    ("agents:ReturnsNaN", "agent returned a non-finite reward nan"),
    ("agents:NoCalls", "the episode made no LLM call through the gateway"),
])
def test_bad_rewards_stop_the_run_at_once(work, agent, message):
    r = _train(work, agent=agent, steps=50, rollout={"max_consecutive_failures": 2})
    assert r.code == 1 and r.seconds < BOUND
    assert message in r.err
    assert "step 1/" not in r.out


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_reward_range_is_enforced(work):
    r = _train(work, rollout={"reward_range": [2.0, 3.0]})
    assert r.code == 1 and "outside reward_range [2.0, 3.0]" in r.err


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_evaluation_where_every_episode_fails_prints_no_score(work):
    r = rlgate(work, "eval", "--config", "cfg.yaml", "--dataset", "train.jsonl", "--limit", "2",
               config=base_config(agent="agents:CrashingAgent"))
    assert r.code == 1 and r.seconds < BOUND
    assert "evaluation: all 2 episodes failed" in r.err
    assert "reward_mean" not in r.out and not list((work / "run").glob("eval-*.json"))
