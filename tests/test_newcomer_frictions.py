"""Issue 40's frictions of a newcomer following only the README and docs/, each pinned by a test."""

from __future__ import annotations

import logging
import re
import subprocess
import sys

import pytest

from helpers import ADMIN_KEY, free_port
from online_helpers import chat, new_tenant, online_app

USER = [{"role": "user", "content": "my order is late"}]


def _metric(text: str, name: str) -> float:
    """The sum of a metric's samples in a Prometheus exposition."""
    return sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, flags=re.M))


# --------------------------------------------------------------------------- online counters


async def test_online_counters_survive_a_restart_and_the_restart_says_conversations_not_interrupted(
        tokenizer, stop_ids, asgi_client, tmp_path, caplog):
    """Friction 4: one thumbs up, a restart on the same store, another: the page and /metrics showed
    1 feedback event and 1 turn with feedback (turns came back, feedback did not); the restart logged
    the tenant's open conversation as "1 interrupted", at WARNING."""
    from rlgate.store.sqlite import SQLiteStore

    auth = {"Authorization": f"Bearer {ADMIN_KEY}"}
    path = tmp_path / "online.sqlite"
    app = online_app(tokenizer, stop_ids, SQLiteStore(path), implicit_scan_interval=3600)
    async with asgi_client(app) as c, app.router.lifespan_context(app):
        _, tenant = await new_tenant(c)
        first = await chat(c, tenant, USER, conversation="a")
        r = await c.post("/v1/feedback", json={"kind": "thumbs", "value": True, "interaction_id": first},
                         headers=tenant)
        assert r.status_code == 200, r.text
        app.state.online.implicit.scan()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="rlgate.sessions"):
        app = online_app(tokenizer, stop_ids, SQLiteStore(path), implicit_scan_interval=3600)
    restored = [r for r in caplog.records if "restored" in r.getMessage()]
    assert restored and restored[0].levelno == logging.INFO, [r.getMessage() for r in caplog.records]
    assert "1 conversations open at the stop" in restored[0].getMessage()
    assert "interrupted" not in restored[0].getMessage()
    async with asgi_client(app) as c, app.router.lifespan_context(app):
        second = await chat(c, tenant, USER, conversation="a")
        r = await c.post("/v1/feedback", json={"kind": "thumbs", "value": True, "interaction_id": second},
                         headers=tenant)
        assert r.status_code == 200, r.text
        app.state.online.implicit.scan()
        text = (await c.get("/metrics", headers=auth)).text
    assert _metric(text, "rlgate_feedback_events_total") == 2
    assert _metric(text, "rlgate_online_turns_total") == 2
    assert _metric(text, "rlgate_online_turns_with_feedback_total") == 2
    assert _metric(text, "rlgate_online_rewarded_turns") == 2


async def test_a_training_sessions_interruption_is_still_a_warning(make_app, asgi_client, tmp_path, caplog):
    """The calmer wording is for tenant conversations only: an RL episode cut by a restart is lost work."""
    from helpers import start_session
    from rlgate.store.sqlite import SQLiteStore

    app = make_app(store=SQLiteStore(tmp_path / "s.sqlite"))
    async with asgi_client(app) as c, app.router.lifespan_context(app):
        await start_session(c)
    with caplog.at_level(logging.INFO, logger="rlgate.sessions"):
        make_app(store=SQLiteStore(tmp_path / "s.sqlite"))
    restored = [r for r in caplog.records if "restored" in r.getMessage()]
    assert restored and restored[0].levelno == logging.WARNING
    assert "1 interrupted (active at the stop)" in restored[0].getMessage()


# --------------------------------------------------------------------------- the step line


def test_the_step_line_names_its_kl_estimator():
    """Friction 5: the step line printed "kl -3.10e-05" with no KL configured (the approx-KL estimator)."""
    from rlgate.train.tracking import StdoutTracker

    lines: list[str] = []
    metrics = {"step_s": 1.0, "reward": 0.5, "loss": 0.01, "approx_kl": -3.1e-05, "kl_ref": 0.0}
    StdoutTracker(4, lambda s, **_: lines.append(s)).log(1, metrics)
    StdoutTracker(4, lambda s, **_: lines.append(s), kl_ref=True).log(1, {**metrics, "kl_ref": 2e-3})
    assert " approx_kl -3.10e-05 " in lines[0] and " kl " not in lines[0]
    assert " kl_ref 2.00e-03 " in lines[1]


# --------------------------------------------------------------------------- the CLI


def test_rlgate_help_lists_every_command_without_rst_markup():
    """Friction 5: `rlgate --help` showed ``rlgate`` (RST backticks) and its summary omitted `models`."""
    out = subprocess.run([sys.executable, "-m", "rlgate.cli", "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "``" not in out.stdout
    summary = out.stdout.split("positional arguments", 1)[0]
    for command in ("serve", "tiny-model", "demo", "train", "check", "eval", "view", "export", "models"):
        assert command in summary.split("\n\n", 1)[1], command


@pytest.mark.slow  # two CLI runs that import transformers: ~10 s at load average 10
def test_models_fetch_names_the_model_not_only_its_cache_path():
    """Friction 5: `rlgate models fetch NAME` printed a bare hash path (`path` still does: for scripts)."""
    from rlgate.checkpoints import registry

    name = "smollm2-135m-instruct"
    if registry.local_file(name) is None:
        pytest.skip(f"{name} is not fetched (fetching it downloads ~100 MB)")
    fetched = subprocess.run([sys.executable, "-m", "rlgate.cli", "models", "fetch", name], capture_output=True,
                             text=True, timeout=600)
    path = subprocess.run([sys.executable, "-m", "rlgate.cli", "models", "path", name], capture_output=True,
                          text=True, timeout=600)
    assert fetched.returncode == 0 and path.returncode == 0, fetched.stderr + path.stderr
    assert fetched.stdout.startswith(f"{name}: SmolLM2-135M-Instruct") and "Q4_1" in fetched.stdout
    assert path.stdout.strip() in fetched.stdout and "\n" not in path.stdout.strip()


def test_the_demos_never_hard_wrap_their_output():
    """Friction 5: demo output redirected to a file was hard-wrapped at 80 columns (rich's Console, which
    takes 80 columns when the output is not a terminal): every Console the demos build soft-wraps."""
    from pathlib import Path

    import rlgate.demo

    sources = {p.name: p.read_text() for p in Path(rlgate.demo.__file__).parent.glob("*.py")}
    built = {name: re.findall(r"Console\(([^)]*)\)", text) for name, text in sources.items()}
    built = {name: calls for name, calls in built.items() if calls}
    assert built and all("soft_wrap=True" in c for calls in built.values() for c in calls), built


@pytest.mark.slow  # ~50 s at load average 10 (builds the tiny model, imports torch)
@pytest.mark.torch
@pytest.mark.timeout(600)
def test_the_scripted_demo_serves_on_the_port_it_is_given(tmp_path):
    """Friction 5: `rlgate demo --scripted --port N` served on a random port."""
    port = free_port()
    out = subprocess.run([sys.executable, "-m", "rlgate.cli", "demo", "--scripted", "--port", str(port), "--out",
                          str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"gateway on http://127.0.0.1:{port} " in out.stdout


@pytest.mark.parametrize("args", [["--model", "tiny"], ["--task", "tools"], ["--device", "cuda"]])
def test_demo_on_vllm_refuses_what_it_does_not_run_in_one_line(args, tmp_path):
    """``rlgate demo --engine vllm`` runs the real model's math task on the CPU; anything else is refused
    before a model, a gateway or a vLLM server starts."""
    done = subprocess.run([sys.executable, "-m", "rlgate.cli", "demo", "--engine", "vllm", "--out", str(tmp_path),
                           *args], capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1] == (
        "rlgate demo: --engine vllm runs the real model's math task on the CPU"), done.stderr
    assert list(tmp_path.iterdir()) == []  # nothing started, nothing written
