"""Find (or install from npm) the agent CLIs: ``@anthropic-ai/claude-code`` and ``@openai/codex``.

Both packages ship native binaries in per-platform optional dependencies; npm installs the
one for this machine. Claude Code's wrapper package only links its binary in a postinstall
script (which npm >= 11 does not run without approval), so the binary is taken from the
platform package directly. Codex's ``bin/codex.js`` launcher finds its binary itself.

The cache directory defaults to ``$RLGATE_NPM_CACHE``, else ``~/.cache/rlgate-npm``.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

CLAUDE_CODE = "@anthropic-ai/claude-code"
CODEX = "@openai/codex"


class CLINotFound(RuntimeError):
    pass


def cache_dir() -> Path:
    return Path(os.environ.get("RLGATE_NPM_CACHE") or Path.home() / ".cache" / "rlgate-npm")


@dataclass(frozen=True)
class CLI:
    package: str
    version: str
    argv: tuple[str, ...]  # how to start it (prepend to the CLI's own arguments)


def npm_install(packages: list[str], prefix: Path | None = None, timeout: float = 900.0) -> None:
    """``npm install --prefix PREFIX PACKAGES`` (raises CLINotFound if npm is missing or fails)."""
    npm = shutil.which("npm")
    if npm is None:
        raise CLINotFound("npm is not installed (Debian: apt-get install npm)")
    prefix = prefix or cache_dir()
    prefix.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([npm, "install", "--no-audit", "--no-fund", "--prefix", str(prefix), *packages],
                          capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise CLINotFound(f"npm install {' '.join(packages)} failed: {proc.stderr.strip()[-2000:]}")


def _platform_suffix() -> str:
    machine = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(platform.machine().lower())
    system = {"Linux": "linux", "Darwin": "darwin"}.get(platform.system())
    if machine is None or system is None:
        raise CLINotFound(f"no agent CLI build for {platform.system()} {platform.machine()}")
    musl = system == "linux" and not platform.libc_ver()[0].startswith("glibc")
    return f"{system}-{machine}" + ("-musl" if musl else "")


def _version(package_dir: Path) -> str:
    return str(json.loads((package_dir / "package.json").read_text())["version"])


def find_cli(package: str, prefix: Path | None = None) -> CLI | None:
    """The installed CLI under ``prefix``'s node_modules, or None."""
    modules = (prefix or cache_dir()) / "node_modules"
    base = modules / package
    if not (base / "package.json").is_file():
        return None
    if package == CLAUDE_CODE:
        binary = modules / f"{CLAUDE_CODE}-{_platform_suffix()}" / "claude"
        return CLI(package, _version(base), (str(binary),)) if binary.is_file() else None
    if package == CODEX:
        node = shutil.which("node")
        launcher = base / "bin" / "codex.js"
        return CLI(package, _version(base), (node, str(launcher))) if node and launcher.is_file() else None
    raise ValueError(f"unknown agent CLI package {package!r}")


def ensure_cli(package: str, prefix: Path | None = None, *, install: bool = True) -> CLI:
    """The CLI from the cache, installing it with npm first if it is missing."""
    cli = find_cli(package, prefix)
    if cli is None and install:
        npm_install([package], prefix)
        cli = find_cli(package, prefix)
    if cli is None:
        raise CLINotFound(f"{package} is not installed under {prefix or cache_dir()}")
    return cli
