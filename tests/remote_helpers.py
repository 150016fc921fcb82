"""Run tests against the remote engines: fake SGLang / vLLM servers on 127.0.0.1.

``engine_kind`` (a fixture in conftest.py, "local" unless a test parametrises it) decides
what ``make_app(engine)`` gives the gateway: the engine itself ("local"), or an SGLang /
vLLM engine driving a fake server (a :class:`ServerThread`) that serves that same engine
object. Tests keep inspecting the engine they built (``engine.requests``,
``engine.aborted``): it is what the fake backend runs.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from helpers import free_port, wait_healthy

KINDS = ("local", "sglang", "vllm")
REMOTE_KINDS = ("sglang", "vllm")


def fake_app(kind: str, engine: Any, tokenizer: Any, model_dir: Path | str, **kw: Any) -> Any:
    """A fake ``kind`` server (FastAPI app) serving ``engine``."""
    if kind == "sglang":
        from rlgate.testing.fake_sglang import create_app
    elif kind == "vllm":
        from rlgate.testing.fake_vllm import create_app
    else:
        raise ValueError(kind)
    return create_app(engine, tokenizer=tokenizer, model_path=str(model_dir), **kw)


def remote_engine(kind: str, urls: list[str], **kw: Any) -> Any:
    kw.setdefault("health_interval", 0)
    if kind == "sglang":
        from rlgate.engine.remote.sglang import SGLangEngine

        return SGLangEngine(urls, **kw)
    from rlgate.engine.remote.vllm import VLLMEngine

    return VLLMEngine(urls, **kw)


def serve_remotely(stack: contextlib.ExitStack, kind: str, engine: Any, tokenizer: Any, model_dir: Path | str,
                   **engine_kw: Any) -> Any:
    """Put ``engine`` behind a fake ``kind`` server; return the remote engine that drives it."""
    from rlgate.server.runner import ServerThread

    url = stack.enter_context(ServerThread(fake_app(kind, engine, tokenizer, model_dir)))
    engine_kw.setdefault("max_context_length", engine.max_context_length)
    return remote_engine(kind, [url], **engine_kw)


# --------------------------------------------------------------------------- subprocesses






def start_fake_backend(kind: str, model_dir: Path | str, *extra: str, port: int | None = None
                       ) -> tuple[str, subprocess.Popen]:
    """``python -m rlgate.testing.fake_<kind>`` as a subprocess; (url, process) once it is healthy."""
    port = port or free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", f"rlgate.testing.fake_{kind}", "--model", str(model_dir), "--port", str(port), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(os.environ),
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
    except BaseException:
        stop(proc)
        raise
    return url, proc


def start_gateway(model_dir: Path | str, engine: str, admin_key: str, *extra: str) -> tuple[str, subprocess.Popen]:
    """``rlgate serve`` as a subprocess; (url, process) once it is healthy."""
    port = free_port()
    env = {**os.environ, "RLGATE_ADMIN_KEY": admin_key}
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlgate.cli", "serve", "--model", str(model_dir), "--engine", engine,
         "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning", *extra],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
    except BaseException:
        stop(proc)
        raise
    return url, proc


def stop(proc: subprocess.Popen, *, kill: bool = False) -> str:
    if proc.poll() is None:
        proc.kill() if kill else proc.terminate()
    try:
        out, _ = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate(timeout=300)
    return out or ""
