"""The frameworks and trainers the tests play against a gateway, each in a cached environment of its own.

Their pins conflict with the project's and with each other's (verl 0.9.1 pins transformers<5.11; CrewAI
openai<3 and pydantic<2.13), so none of them is installed in the project's venv: each environment below
is a venv (or an npm prefix) under ``$RLGATE_ENV_CACHE`` (default ``~/.cache/rlgate-envs``), named after
the hash of its lock file in ``tests/envs/`` and reused until that file changes. ``make framework-envs``
(a step of ``make test``) installs the missing ones:

    python tests/framework_envs.py install [NAME ...]    # what make does
    python tests/framework_envs.py lock NAME             # re-resolve tests/envs/NAME.in into NAME.txt

A test takes an environment with :func:`require` (skipped, with the installer's reason, when it could not
be installed) and runs its framework there as a subprocess against the gateway on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import venv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPECS = ROOT / "tests" / "envs"
CLOSED = "http://127.0.0.1:9/"  # a registry URL nothing answers: a run-time download attempt fails at once
TORCH = "torch==2.13.0"  # the CPU wheel (README); never a plain `torch` requirement: that pulls a CUDA build


@dataclass(frozen=True)
class Env:
    name: str
    kind: str = "venv"  # "venv" (pip, tests/envs/NAME.txt: every package pinned) or "npm" (NAME.txt: pkg@version lines)
    torch_first: bool = False  # pip install torch==2.13.0 before the rest, so that no other torch build is chosen
    sdists: tuple[str, ...] = ()  # packages published without a wheel (built from source); the rest: wheels only
    rlgate_deps: bool = False  # the lock also resolves rlgate's own requirements (it runs rlgate from src/)
    what: str = ""


ENVS: dict[str, Env] = {e.name: e for e in (
    Env("agents", what="mini-swe-agent (LiteLLM), pydantic-ai, LangChain / LangGraph, the Claude Agent SDK, "
                       "AutoGen, AG2, DSPy, the Google ADK: openai 3.x"),
    Env("agents-openai2", what="CrewAI, LlamaIndex, Strands Agents: each pins openai<3 (CrewAI also "
                               "pydantic<2.13 and mcp<2)"),
    Env("verl", torch_first=True, sdists=("pylatexenc", "antlr4-python3-runtime"), rlgate_deps=True,
        what="verl 0.9.1 with its pins (transformers<5.11) and rlgate's requirements, torch 2.13.0 CPU"),
    Env("opencode", kind="npm", what="opencode (npm opencode-ai) and the provider package it loads"),
    Env("ai-sdk", kind="npm", what="the Vercel AI SDK: ai, @ai-sdk/openai, @ai-sdk/anthropic"),
)}


def cache_root() -> Path:
    return Path(os.environ.get("RLGATE_ENV_CACHE") or Path.home() / ".cache" / "rlgate-envs")


def lock_file(env: Env) -> Path:
    return SPECS / f"{env.name}.txt"


def env_dir(name: str) -> Path:
    """Where the environment lives: NAME-<12 hex digits of its lock file's hash and the Python version>."""
    env = ENVS[name]
    digest = hashlib.sha256(lock_file(env).read_bytes())
    digest.update(f"{sys.version_info.major}.{sys.version_info.minor}".encode())
    return cache_root() / f"{name}-{digest.hexdigest()[:12]}"


def _done(d: Path) -> Path:
    return d / ".rlgate-complete"


def _failed(d: Path) -> Path:
    return d.with_name(d.name + ".failed")


def _pins(env: Env) -> list[str]:
    lines = [ln.split("#", 1)[0].strip() for ln in lock_file(env).read_text().splitlines()]
    return [ln for ln in lines if ln]


def _pip(python: Path, *args: str, timeout: float = 1800) -> None:
    proc = subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *args],
                          capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        tail = "\n".join(ln for ln in proc.stderr.splitlines() if "is ignored" not in ln)[-1500:]
        raise RuntimeError(f"pip install {' '.join(args)[:200]} failed: {tail}")


def _binary_args(env: Env) -> list[str]:
    args = ["--only-binary", ":all:"]
    if env.sdists:
        args += ["--no-binary", ",".join(env.sdists)]
    return args


def _install_venv(env: Env, d: Path) -> None:
    """The lock file as it is: every package pinned, so no resolution (``--no-deps``; ``pip check`` after),
    and no byte-compiling of the ~10^4 files the first imports do not need (``--no-compile``)."""
    venv.create(d, with_pip=True, clear=True)
    python = d / "bin" / "python"
    pins = _pins(env)
    if env.torch_first:  # whatever build pip's configuration offers for torch==2.13.0 (the lock says +cpu)
        _pip(python, TORCH)
        pins = [p for p in pins if not p.startswith("torch==")]
    reqs = d / "requirements.txt"
    reqs.write_text("\n".join(pins) + "\n")
    _pip(python, "--no-deps", "--no-compile", *_binary_args(env), "-r", str(reqs))
    check = subprocess.run([str(python), "-m", "pip", "check"], capture_output=True, text=True, check=False)
    if check.returncode != 0:
        raise RuntimeError(f"pip check: {check.stdout.strip()[-1500:]}")


def _install_npm(env: Env, d: Path) -> None:
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm is not installed (make agent-clis installs Debian's nodejs + npm)")
    d.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([npm, "install", "--no-audit", "--no-fund", "--prefix", str(d), *_pins(env)],
                          capture_output=True, text=True, timeout=1800, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"npm install failed: {proc.stderr.strip()[-1500:]}")


@contextlib.contextmanager
def _locked(d: Path) -> Iterator[None]:
    d.parent.mkdir(parents=True, exist_ok=True)
    with open(d.with_name(d.name + ".lock"), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # one installer per environment at a time (parallel make, two checkouts)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def install(name: str) -> tuple[Path, float | None]:
    """Install the environment if it is not complete; ``(dir, seconds it took or None if it was there)``.
    A failure leaves ``DIR.failed`` with the reason (the tests that need it skip saying so) and raises."""
    env, d = ENVS[name], env_dir(name)
    with _locked(d):
        if _done(d).is_file():
            return d, None
        t0 = time.perf_counter()
        shutil.rmtree(d, ignore_errors=True)  # a half-made one (interrupted install)
        try:
            (_install_npm if env.kind == "npm" else _install_venv)(env, d)
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            _failed(d).write_text(str(exc))
            shutil.rmtree(d, ignore_errors=True)
            raise
        _failed(d).unlink(missing_ok=True)
        _done(d).write_text(lock_file(env).read_text())
        for old in d.parent.glob(f"{name}-*"):  # the same environment for an older lock file (and its marks)
            stale = re.fullmatch(re.escape(name) + r"-([0-9a-f]{12})(\.lock|\.failed)?", old.name)
            if stale and stale.group(1) != d.name[-12:] and old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
            elif stale and stale.group(1) != d.name[-12:]:
                old.unlink(missing_ok=True)
        return d, time.perf_counter() - t0


def require(name: str) -> Path:
    """The installed environment's directory, else skip the calling test with the reason."""
    import pytest

    d = env_dir(name)
    if _done(d).is_file():
        return d
    failed = _failed(d)
    if failed.is_file():
        pytest.skip(f"the {name} environment could not be installed: {failed.read_text().strip()[-400:]}")
    pytest.skip(f"the {name} environment is not installed in {d} (make framework-envs installs it)")


def python(name: str) -> Path:
    return require(name) / "bin" / "python"


def pinned(name: str, package: str) -> str | None:
    """The version the environment's lock file pins ``package`` at."""
    for pin in _pins(ENVS[name]):
        if pin.split("==")[0].lower() == package.lower():
            return pin.split("==", 1)[1]
    return None


def opencode_env(cache: Path) -> dict[str, str]:
    """opencode's settings for a run offline: a throwaway cache, no update check, no models.dev fetch, and npm /
    bun pointed at a closed port, so that a package it would fetch at run time fails the test (1.18 bundles
    the ``@ai-sdk/openai-compatible`` provider: it fetched nothing, measured)."""
    return {"XDG_CACHE_HOME": str(cache), "OPENCODE_DISABLE_AUTOUPDATE": "1", "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "NPM_CONFIG_REGISTRY": CLOSED, "BUN_CONFIG_REGISTRY": CLOSED}


def rlgate_requirements() -> list[str]:
    """rlgate's own requirements and its ``sdk`` extra (an environment that runs rlgate from src/)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return list(project["dependencies"]) + list(project["optional-dependencies"]["sdk"])


def lock(name: str) -> None:
    """Resolve tests/envs/NAME.in (plus rlgate's requirements where the environment runs rlgate) in a fresh
    venv and write every installed distribution, pinned, to tests/envs/NAME.txt."""
    env = ENVS[name]
    src = SPECS / f"{name}.in"
    if env.kind == "npm":
        raise SystemExit(f"{name}: an npm environment's {lock_file(env).name} lists its pins by hand")
    with tempfile.TemporaryDirectory(prefix=f"rlgate-lock-{name}-") as tmp:
        d = Path(tmp)
        venv.create(d, with_pip=True)
        python_ = d / "bin" / "python"
        if env.torch_first:
            _pip(python_, TORCH)
        reqs = ["-r", str(src)] + (rlgate_requirements() if env.rlgate_deps else [])
        _pip(python_, *_binary_args(env), *reqs)
        # setuptools stays in (llama-index-core and torch require a newer one than the venv's own)
        freeze = subprocess.run([str(python_), "-m", "pip", "freeze", "--all", "--exclude", "pip"],
                                capture_output=True, text=True, check=True).stdout
    header = (f"# Generated by `python tests/framework_envs.py lock {name}` from {src.name}"
              + (" and rlgate's requirements (pyproject.toml)" if env.rlgate_deps else "") + ".\n"
              f"# {env.what}\n")
    lock_file(env).write_text(header + freeze)


def main(argv: list[str]) -> int:
    if argv[:1] == ["lock"] and len(argv) == 2:
        lock(argv[1])
        return 0
    if argv[:1] != ["install"]:
        print(__doc__, file=sys.stderr)
        return 2
    for name in argv[1:] or list(ENVS):
        try:
            d, seconds = install(name)
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            print(f"framework env {name}: NOT installed, its tests will be skipped: {str(exc)[-600:]}", file=sys.stderr)
            continue
        print(f"framework env {name}: {d}" + (f" (installed in {seconds:.0f} s)" if seconds is not None else " (cached)"))
    return 0  # as make agent-clis: a missing environment skips its tests (saying why), it does not stop the run


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
