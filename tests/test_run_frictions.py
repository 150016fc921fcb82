"""Issue 27's frictions of a training run, each pinned by a test that failed before its fix."""

from __future__ import annotations

import re
import socket

import pytest

from rlgate.rollout.errors import RunError
from rlgate.train.gateway import check_port_free


def _port_in_time_wait() -> int:
    """A port whose last server closed its side of a connection first: that connection sits in
    TIME_WAIT (~60 s), as after a finished run whose gateway served agents."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = listener.accept()
    conn.close()  # the server closes first: its end goes to TIME_WAIT
    client.recv(1)  # sees the FIN
    client.close()
    listener.close()
    return port


def test_the_port_check_ignores_time_wait_but_not_a_listener():
    port = _port_in_time_wait()
    with socket.socket() as plain, pytest.raises(OSError):  # what the old check did: "in use"
        plain.bind(("127.0.0.1", port))
    check_port_free(port)  # uvicorn binds with SO_REUSEADDR: the port is free for it
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.raises(RunError, match="is not available"):
            check_port_free(busy.getsockname()[1])


@pytest.mark.slow
def test_a_second_serve_never_replaces_the_key_of_the_running_gateway(tiny_model_dir, tmp_path):
    """Issue 27, friction 2: a second `rlgate serve` with the same --admin-key-file rewrote the file,
    then failed on the busy port: the running gateway's clients got 403."""
    import os
    import subprocess
    import sys

    from helpers import free_port, wait_healthy

    key_file = tmp_path / "admin.key"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("RLGATE_STORE", "RLGATE_ADMIN_KEY")}

    def serve(p: int) -> list[str]:
        return [sys.executable, "-m", "rlgate.cli", "serve", "--model", str(tiny_model_dir), "--engine", "fake",
                "--store", ":memory:", "--port", str(p), "--admin-key-file", str(key_file)]

    first = subprocess.Popen(serve(port), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", first)
        key = key_file.read_text()
        for p, says in ((port, f"cannot serve on 127.0.0.1:{port}"), (free_port(), "running gateway")):
            r = subprocess.run(serve(p), env=env, capture_output=True, text=True, timeout=300)
            assert r.returncode != 0 and says in r.stderr, r.stdout + r.stderr
            assert "Traceback" not in r.stderr
            assert key_file.read_text() == key  # the running gateway's key is still on disk
        import httpx

        ok = httpx.get(f"http://127.0.0.1:{port}/rl/metrics", headers={"Authorization": f"Bearer {key.strip()}"})
        assert ok.status_code == 200
    finally:
        first.terminate()
        first.wait(60)
    # once it has stopped, the file is free for the next gateway
    from rlgate.cli import claim_key_file

    claim_key_file(key_file)


# --------------------------------------------------------------------------- runs through the CLI


@pytest.fixture
def work(tmp_path, tiny_model_dir):
    from train_helpers import write_workdir

    return write_workdir(tmp_path, tiny_model_dir)


def test_a_resume_that_fails_keeps_every_line_of_evals_jsonl(work):
    """Friction 6: the resumed run dropped the checkpoint step's evaluation line up front; a resume
    that then died (here: a checkpoint that does not load) lost it for good."""
    import json

    import torch

    from train_helpers import base_config, rlgate

    run = work / "run"
    ckpt = run / "checkpoints" / "step-000001"
    ckpt.mkdir(parents=True)
    (ckpt / "config.json").write_text("{not json")
    torch.save({"optimizer": {}, "step": 1, "version": 1, "history": []}, ckpt / "trainer_state.pt")
    (run / "checkpoints" / "latest").write_text("step-000001")
    evals = "".join(json.dumps({"step": s, "reward_mean": 0.5}) + "\n" for s in (0, 1))
    (run / "evals.jsonl").write_text(evals)
    r = rlgate(work, "train", "--config", "cfg.yaml",
               config=base_config(steps=2, eval_dataset={"path": "train.jsonl", "limit": 2}))
    assert r.code == 1 and "step-000001" in r.err, r.text
    assert (run / "evals.jsonl").read_text() == evals


def _train_until(work, sig, *extra):
    """Start `rlgate train` (SIGINT as from a terminal), send ``sig`` once a step is logged; (rc, output)."""
    import signal
    import subprocess
    import sys
    import time

    proc = subprocess.Popen([sys.executable, "-m", "rlgate.cli", "train", "--config", "cfg.yaml", *extra],
                            cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    metrics = work / "run" / "metrics.jsonl"
    deadline = time.monotonic() + 900
    while not (metrics.is_file() and metrics.read_text().strip()):  # a completed step
        assert proc.poll() is None, proc.stdout.read()
        assert time.monotonic() < deadline
        time.sleep(0.1)
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=900)
    return proc.returncode, out


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_sigterm_saves_the_last_finished_step_and_the_run_resumes_from_it(work):
    """Friction 7: SIGTERM (a scheduler preempting the job) exited 143 at once, silently, losing up to
    checkpoint_every - 1 steps."""
    import json
    import signal

    import yaml

    from train_helpers import base_config, rlgate

    (work / "cfg.yaml").write_text(yaml.safe_dump(base_config(steps=1000, checkpoint_every=500)))
    code, out = _train_until(work, signal.SIGTERM)
    assert code == 143, out
    run = work / "run"
    done = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    latest = (run / "checkpoints" / "latest").read_text()
    step = int(latest.removeprefix("step-"))
    assert step == int(done[-1]) >= 1  # no older than the last finished step
    assert (run / "checkpoints" / latest / "model.safetensors").is_file()
    assert f"terminated (SIGTERM): step {step} saved to run/checkpoints/{latest}; run the same command " \
           "again to resume" in out
    assert "Traceback" not in out
    r = rlgate(work, "train", "--config", "cfg.yaml", "--set", f"steps={step + 1}")
    assert r.code == 0, r.text
    assert f"resuming from run/checkpoints/{latest} (step {step})" in r.out
    assert (run / "checkpoints" / "latest").read_text() == f"step-{step + 1:06d}"


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_ctrl_c_message_is_the_documented_one_when_the_step_was_already_saved(work):
    """Friction 8: with checkpoint_every 1 (the walk-through's) Ctrl-C printed `interrupted: no step
    since …`, not the line docs/training.md shows."""
    import re
    import signal
    from pathlib import Path

    import yaml

    from train_helpers import base_config

    (work / "cfg.yaml").write_text(yaml.safe_dump(base_config(steps=1000, checkpoint_every=1)))
    code, out = _train_until(work, signal.SIGINT)
    assert code == 130, out
    latest = (work / "run" / "checkpoints" / "latest").read_text()
    doc = (Path(__file__).parents[1] / "docs" / "training.md").read_text()
    documented = re.search(r"`(interrupted: step N saved to [^`]+)`", doc).group(1)
    expected = documented.replace("step N", f"step {int(latest[5:])}").replace(
        "out_dir/checkpoints/step-NNNNNN", f"run/checkpoints/{latest}")
    assert expected in out, out


def _step_dump(step: int, version: int, *, train_version: bool) -> list:
    """One step's samples as a run dumps them: generated at ``version``, trained at step ``step``."""
    from rlgate.trajectory.sample import Sample

    out = []
    for k in range(2):
        s = Sample(id=f"chatcmpl-{step}-{k}", input_ids=[1, 2, 3, 4], loss_mask=[0, 0, 1, 1],
                   logprobs=[0.0, 0.0, -0.5, -0.1], versions=[-1, -1, version, version], reward=float(k),
                   session_id=f"s{step}-g0-{k}", task_id=f"s{step}-g0", group_id=f"s{step}-g0", episode=k, step=step)
        if train_version:
            s.train_version = step - 1
        out.append(s)
    return out


@pytest.mark.parametrize("train_version", [True, False], ids=["dumps-now", "dumps-before-the-fix"])
def test_rlgate_view_of_a_runs_dumps_flags_no_stale_tokens_when_none_were_stale(tmp_path, train_version):
    """Friction 5: every step more than 4 behind the newest was flagged `stale tokens` although
    stale_samples was 0: the reference must be the version each step trained, not the newest."""
    from rlgate.trajectory.export import read_samples, write_parquet
    from rlgate.ui.static_export import write_view

    dumps = tmp_path / "trajectories"
    dumps.mkdir()
    for step in range(1, 11):  # on-policy: step k's samples were generated by version k - 1
        write_parquet(_step_dump(step, step - 1, train_version=train_version), dumps / f"step-{step:06d}.parquet")
    if train_version:
        assert {s.train_version for s in read_samples(dumps / "step-000003.parquet")} == {2}
    _, run = write_view([dumps], tmp_path / "view.html")  # what `rlgate view DIR` does
    assert len(run.episodes) == 20
    assert not [e.id for e in run.episodes for t in e.turns if "stale" in t.flags]
    # a sample that really was stale is still flagged
    stale = _step_dump(11, 3, train_version=train_version)
    stale[1].versions = [-1, -1, 10, 10]  # its group-mate is fresh: the step trained version 10
    write_parquet(stale, dumps / "step-000011.parquet")
    _, run = write_view([dumps], tmp_path / "view.html")  # what `rlgate view DIR` does
    assert sorted(e.id for e in run.episodes for t in e.turns if "stale" in t.flags) == ["s11-g0-0"]


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_live_viewer_during_rlgate_train(work):
    """Friction 4: `gateway.ui` was an unknown key and the in-process admin key was never shown."""
    import re
    import signal
    import subprocess
    import sys
    import time

    import httpx
    import yaml

    from train_helpers import base_config

    (work / "cfg.yaml").write_text(yaml.safe_dump(base_config(steps=1000, checkpoint_every=500,
                                                              gateway={"ui": True})))
    log = work / "out.txt"
    with log.open("w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "rlgate.cli", "train", "--config", "cfg.yaml"], cwd=work,
                                stdout=f, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 900
        while " step 1/1000 " not in log.read_text():  # the gateway is up and has recorded episodes
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        url, path = re.search(r"viewer: (\S+)/ui \(log in with the admin key in (\S+), mode 0600",
                              log.read_text()).groups()
        key_file = work / path
        assert key_file == work / "run" / "admin_key" and (key_file.stat().st_mode & 0o777) == 0o600
        key = key_file.read_text().strip()
        page = httpx.get(f"{url}/ui", headers={"Authorization": f"Bearer {key}"}, timeout=60)
        assert page.status_code == 200 and "s0-g0" in page.text, page.text[:500]
        assert httpx.get(f"{url}/ui", timeout=60).status_code in (303, 401, 403)  # admin only: to the login form
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(600)
    assert key not in log.read_text()  # never in the output


async def test_the_live_viewers_raw_request_shows_the_tools(make_app, asgi_client, tokenizer):
    """Friction 8: docs/viewer.md says the raw request shows the tools; the live turn page never did."""
    from helpers import admin_headers, key_headers, start_session
    from rlgate.engine.fake import FakeEngine

    tool = {"type": "function", "function": {"name": "lookup_capital", "description": "Find a country's capital.",
                                             "parameters": {"type": "object", "properties": {"country": {"type": "string"}}}}}
    async with asgi_client(make_app(FakeEngine(tokenizer, script=["Paris."]), ui=True)) as c:
        sid, key = await start_session(c)
        r = await c.post("/v1/chat/completions", headers=key_headers(key),
                         json={"messages": [{"role": "user", "content": "Capital of France?"}], "tools": [tool]})
        page = await c.get("/ui/turn", params={"session": sid, "id": r.json()["id"]}, headers=admin_headers())
    assert page.status_code == 200
    assert "lookup_capital" in page.text and "Find a country" in page.text


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_stopping_a_run_with_episodes_in_flight_prints_no_errors(work):
    """Friction 8: stopping a run while episodes generate printed uvicorn's `ERROR: Cancel N running
    task(s)`, a `503` warning per request and a guard ALARM (and took the 10 s shutdown timeout)."""
    import json
    import signal

    import yaml

    from train_helpers import base_config

    with (work / "long.jsonl").open("w") as f:  # long replies: the next step's episodes are mid-generation
        for a in range(10, 34):
            f.write(json.dumps({"question": f"Which is larger, {a} or {a + 3}?", "max_tokens": 200}) + "\n")
    (work / "cfg.yaml").write_text(yaml.safe_dump(base_config(steps=1000, checkpoint_every=500, dataset="long.jsonl",
                                                              grpo={"max_staleness": 2})))
    code, out = _train_until(work, signal.SIGINT)
    assert code == 130, out
    assert "interrupted: step" in out
    for noise in ("ERROR", "ALARM", "Traceback"):
        assert noise not in out, out
    # a 503 status, not the digits inside a number such as "tok/s 4,228,503"
    assert not re.search(r"(?<![\d,.])503(?![\d,.])", out), out


TOOL_AGENT = '''
import json

from openai import AsyncOpenAI

TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look a word up.",
          "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}}}]


class LookupAgent:
    """Calls `lookup` once, then answers; reward 1 when it used the tool and answered."""

    async def run(self, data, *, base_url, api_key, http_client=None):
        client = AsyncOpenAI(base_url=base_url, api_key=api_key, http_client=http_client, max_retries=0)
        messages = [{"role": "user", "content": f"What does {data['word']} mean?"}]
        used = False
        try:
            for _ in range(3):
                reply = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS,
                                                             max_tokens=64)
                msg = reply.choices[0].message
                if not msg.tool_calls:
                    break
                used = True
                messages.append(msg.model_dump(exclude_none=True))
                for call in msg.tool_calls:
                    word = json.loads(call.function.arguments).get("word", "")
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": f"{word}: a thing"})
        finally:
            if http_client is None:
                await client.close()
        return float(used and bool(msg.content))
'''


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_tool_agents_whole_loop_checks_and_trains_on_the_scripted_engine(work):
    """Friction 3: the tiny model never emits a tool call that parses and `check` / `train` had no
    scripted engine, so a tool agent's loop could not be checked offline."""
    import json

    import yaml

    from train_helpers import base_config, rlgate

    (work / "tool_agent.py").write_text(TOOL_AGENT)
    with (work / "words.jsonl").open("w") as f:
        f.writelines(json.dumps({"word": w}) + "\n" for w in ("apple", "river", "stone"))
    cfg = base_config(dataset="words.jsonl", agent="tool_agent:LookupAgent", gateway={"engine": "scripted"},
                      rollout={"export_style": "concat"})
    r = rlgate(work, "check", "--config", "cfg.yaml", config=cfg)
    assert r.code == 0, r.text
    assert "reward 1.0" in r.out and "finish stop" in r.out and "<tool_call>" in r.out and "lookup" in r.out, r.out
    # a file of replies, cycled: one episode answers at once (reward 0), the next calls the tool (reward 1)
    (work / "replies.yaml").write_text(yaml.safe_dump([
        "No idea.", '<tool_call>\n{"name": "lookup", "arguments": {"word": "apple"}}\n</tool_call>', "It is a fruit."]))
    cfg = base_config(dataset="words.jsonl", agent="tool_agent:LookupAgent", steps=2,
                      gateway={"engine": "scripted", "script": "replies.yaml"},
                      rollout={"export_style": "concat", "concurrency": 1})
    r = rlgate(work, "train", "--config", "cfg.yaml", config=cfg)
    assert r.code == 0, r.text
    metrics = [json.loads(x) for x in (work / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1.0, 2.0] and [m["version"] for m in metrics] == [1.0, 2.0]
    assert all(m["reward"] == 0.5 for m in metrics), metrics
    r = rlgate(work, "check", "--config", "cfg.yaml", "--set", "gateway.script=nowhere.yaml", config=None)
    assert r.code == 2 and "gateway.script: 'nowhere.yaml' is no file" in r.err, r.text
