"""rlgate.rewards.judge: an LLM judge as a reward function, against a scripted judge on 127.0.0.1."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rlgate.rewards import Judge, JudgeError
from rlgate.trajectory.reward import FinishedEpisode
from rlgate.trajectory.sample import Sample


class ScriptedJudge:
    """An OpenAI-compatible /v1/chat/completions that scores "Paris" 1.0 and anything else 0.2 (a group:
    one score per trajectory), records what it was asked, and can be made slow or broken."""

    def __init__(self) -> None:
        self.asked: list[dict] = []
        self.delay = 0.0
        self.answer: str | None = None  # a fixed answer instead of the scores
        judge = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                judge.asked.append({"path": self.path, "auth": self.headers.get("authorization"), **body})
                time.sleep(judge.delay)
                text = body["messages"][-1]["content"]
                if judge.answer is not None:
                    content = judge.answer
                elif "## Trajectory" in text:
                    parts = text.split("## Trajectory")[1:]
                    content = json.dumps({"scores": [1.0 if "Paris" in p else 0.2 for p in parts]})
                else:
                    content = 'Verdict: {"score": %s, "reason": "checked"}' % (1.0 if "Paris" in text else 0.2)
                out = json.dumps({"id": "x", "object": "chat.completion", "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}]})
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out.encode())

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def judge_server():
    s = ScriptedJudge()
    yield s
    s.close()


def _episode(reply: str, question: str = "Capital of France?") -> FinishedEpisode:
    sample = Sample(id="chatcmpl-1", input_ids=[1, 2], loss_mask=[0, 1], logprobs=[0.0, -0.1], versions=[-1, 0],
                    reward=None, messages=[{"role": "user", "content": question}],
                    output_message={"role": "assistant", "content": reply})
    return FinishedEpisode(data={"question": question}, output=reply, session_id="s-0", samples=[sample])


async def test_the_judge_scores_episodes_caches_and_reads_a_rubric(judge_server, tmp_path):
    judge = Judge(judge_server.url, model="judge-model", rubric="1 if the capital is right", api_key="k",
                  cache_path=str(tmp_path / "cache.jsonl"))
    assert await judge(_episode("It is Paris.")) == 1.0
    assert await judge(_episode("It is Lyon.")) == 0.2
    asked = judge_server.asked[0]
    assert asked["path"] == "/v1/chat/completions" and asked["model"] == "judge-model" and asked["auth"] == "Bearer k"
    assert "1 if the capital is right" in asked["messages"][0]["content"]
    assert "Capital of France?" in asked["messages"][1]["content"] and "It is Paris." in asked["messages"][1]["content"]
    assert await judge(_episode("It is Paris.")) == 1.0  # the same request: from the cache
    assert len(judge_server.asked) == 2 and judge.requests == 2
    again = Judge(judge_server.url, model="judge-model", rubric="1 if the capital is right",
                  cache_path=str(tmp_path / "cache.jsonl"))  # a new run: the cache file answers
    assert await again(_episode("It is Lyon.")) == 0.2 and len(judge_server.asked) == 2
    await judge.aclose()


async def test_a_group_is_judged_side_by_side_in_one_request(judge_server):
    judge = Judge(judge_server.url)
    scores = await judge.score_group([_episode("Paris"), _episode("Rome"), _episode("Paris!")])
    assert scores == [1.0, 0.2, 1.0] and len(judge_server.asked) == 1
    assert "3 attempts" in judge_server.asked[0]["messages"][0]["content"]
    await judge.aclose()


async def test_timeouts_and_answers_without_a_score_fail_the_episode_or_give_on_error(judge_server):
    judge_server.delay = 2.0
    judge = Judge(judge_server.url, timeout=0.3)
    with pytest.raises(JudgeError, match="ReadTimeout"):
        await judge(_episode("Paris"))
    assert await Judge(judge_server.url, timeout=0.3, on_error=0.0)(_episode("Paris")) == 0.0
    judge_server.delay = 0.0
    judge_server.answer = "I cannot decide."
    with pytest.raises(JudgeError, match="no score"):
        await Judge(judge_server.url)(_episode("Lyon"))
    judge_server.answer = "Score: 7"  # clamped into [0, 1]
    assert await Judge(judge_server.url)(_episode("Nice")) == 1.0


def test_the_judge_is_a_reward_function_the_config_can_name(judge_server):
    from rlgate.train.loading import load_reward_fn

    fn = load_reward_fn("rlgate.rewards.judge:Judge", {"base_url": judge_server.url, "rubric": "r"})
    assert isinstance(fn, Judge)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_rlgate_check_with_the_judge_as_the_runs_reward(judge_server, tmp_path, tiny_model_dir):
    from train_helpers import base_config, rlgate, write_workdir

    work = write_workdir(tmp_path, tiny_model_dir)
    cfg = base_config(agent="agents:ReturnsText", reward="rlgate.rewards.judge:Judge",
                      reward_kwargs={"base_url": judge_server.url, "rubric": "1 if it names Paris"})
    r = rlgate(work, "check", "--config", "cfg.yaml", config=cfg)
    assert r.code == 0, r.text
    assert "reward 0.2" in r.out and len(judge_server.asked) == 1
    assert "Which is larger, 10 or 13?" in judge_server.asked[0]["messages"][1]["content"]
