"""Black-box CLI agents as RL agents: one subprocess per episode.

:class:`CLIAgent` fulfils the rollout agent contract (``rlgate.rollout.agent``): its ``run``
gets the gateway root and a session key and returns a reward. Per episode it

1. makes a fresh working directory and a throwaway HOME under a temporary directory;
2. lets the task fill the working directory (``setup``, e.g. write a small repo);
3. starts the CLI (``Claude Code``, ``Codex``...) in that directory with the gateway URL and
   the session key in its environment (and nothing else of this process's environment but
   ``PATH``, the locale and what ``env`` adds), the task prompt on its command line, and a
   time limit (then the whole process group is killed);
4. computes the reward with ``verifier(workdir, transcript, data)`` — e.g. "do the repo's
   tests pass" — after the CLI exited, then removes the directories.

Every call the CLI makes with the session key is recorded by the gateway; the runner sets
the reward on the session and exports it as usual. Subclasses say how to start one CLI
(:meth:`CLIAgent.command`). Objects are plain dataclasses with importable classes, so
they also work with the runner's ``subprocess`` mode.

Security: the CLI runs commands with this process's user rights (it is an agent: it edits
files and runs shells). Its HOME and working directory are throwaway, but nothing else is
isolated: train in a container or VM you are willing to let it change.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlgate.object_spec import load_object

Verifier = Callable[[Path, "Transcript", dict[str, Any]], Any]
Setup = Callable[[Path, dict[str, Any]], Any]

MAX_OUTPUT_BYTES = 8 * 1024 * 1024  # per stream; the rest of a chatty CLI's output is dropped


@dataclass
class Transcript:
    """What the CLI did, as seen from outside."""

    command: list[str]  # argv (the session key is never on it)
    returncode: int | None  # None: killed at the time limit
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool = False


def resolve(spec: Any) -> Any:
    """A callable, or ``"package.module:attribute"`` naming one (importable in subprocess mode)."""
    if not isinstance(spec, str):
        return spec
    return load_object(spec, "setup / verifier")


async def _call(fn: Any, *args: Any) -> Any:
    """Run a user hook: awaited if async, in a thread if blocking (a verifier may run tests)."""
    if inspect.iscoroutinefunction(fn):
        return await fn(*args)
    return await asyncio.to_thread(fn, *args)


async def _read_capped(stream: asyncio.StreamReader | None) -> bytes:
    if stream is None:
        return b""
    out = bytearray()
    while chunk := await stream.read(65536):
        if len(out) < MAX_OUTPUT_BYTES:
            out += chunk[: MAX_OUTPUT_BYTES - len(out)]
    return bytes(out)


@dataclass
class CLIAgent:
    """Base class: runs ``command(...)`` per episode; see the module docstring.

    ``data`` (one dataset row) must hold the task ``prompt``; ``setup`` and ``verifier`` are
    callables or ``"module:attr"`` strings.
    """

    verifier: Any  # (workdir, transcript, data) -> float (sync or async)
    setup: Any = None  # (workdir, data) -> None: fill the working directory
    time_limit: float = 600.0  # seconds; then the CLI's process group is killed (and scored)
    env: dict[str, str] = field(default_factory=dict)  # extra environment for the CLI
    extra_args: list[str] = field(default_factory=list)  # appended to the CLI's arguments
    keep_dirs: bool = False  # keep the working directory and HOME (debugging)
    last: Transcript | None = field(default=None, repr=False, compare=False)  # of the last episode (inline)

    # -- what a subclass provides ---------------------------------------------------------

    def command(self, prompt: str, *, workdir: Path, home: Path, base_url: str, api_key: str
                ) -> tuple[list[str], dict[str, str]]:
        """``(argv, environment additions)`` for one episode. ``home`` may receive config files."""
        raise NotImplementedError

    # -- the agent contract ---------------------------------------------------------------

    async def run(self, data: dict[str, Any], *, base_url: str, api_key: str, http_client: Any = None) -> float:
        prompt = data.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            raise ValueError("a CLI agent's data needs a non-empty 'prompt'")
        root = Path(tempfile.mkdtemp(prefix="rlgate-agent-"))
        workdir, home = root / "work", root / "home"
        workdir.mkdir()
        home.mkdir()
        try:
            if self.setup is not None:
                await _call(resolve(self.setup), workdir, data)
            argv, extra_env = self.command(prompt, workdir=workdir, home=home, base_url=base_url, api_key=api_key)
            env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TZ", "TERM")}
            env.update({"HOME": str(home), "TMPDIR": str(root), **extra_env, **self.env})
            transcript = await self._execute(argv, workdir, env)
            self.last = transcript
            reward = await _call(resolve(self.verifier), workdir, transcript, data)
            return float(reward)
        finally:
            if not self.keep_dirs:
                shutil.rmtree(root, ignore_errors=True)

    async def _execute(self, argv: list[str], workdir: Path, env: dict[str, str]) -> Transcript:
        start = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            *argv, cwd=workdir, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, start_new_session=True,  # its own process group: killed as one
        )
        reading = asyncio.gather(_read_capped(proc.stdout), _read_capped(proc.stderr))
        timed_out = False
        try:
            await asyncio.wait_for(proc.wait(), self.time_limit)
        except TimeoutError:
            timed_out = True
        finally:
            if proc.returncode is None:  # timed out, or this episode was cancelled
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
        out, err = await reading
        return Transcript(command=argv, returncode=None if timed_out else proc.returncode,
                          stdout=out.decode(errors="replace"), stderr=err.decode(errors="replace"),
                          seconds=time.monotonic() - start, timed_out=timed_out)
