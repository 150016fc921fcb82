"""Every shell and Python block in docs/*.md runs (issue 40), so that a doc cannot drift from the code.

A doc's blocks run in order, in one scratch directory (one session per doc). A block runs as
written unless an HTML comment right before it (one directive a line) says otherwise:

==========================  ===========================================================================
``<!-- docs-test: ... -->`` what happens
==========================  ===========================================================================
(none)                      bash: ``bash -e`` in the scratch directory, must exit 0; variables it
                            exports carry to the next blocks. Python: run with ``python -``, must exit
                            0; one whose first line is ``# NAME.py`` is saved under that name instead
                            (the text then runs it)
``skip REASON``             not run: it needs what this machine cannot have (a GPU, several nodes, an
                            npm CLI and minutes of prefill, a package index); listed in the test's
                            output with REASON, and only a bash syntax check / Python compile runs
``fragment NAME, ...``      Python that uses names the text defines around it (``session``,
                            ``admin_key``...): run inside an ``async`` function after preludes that
                            define NAMES against a gateway the test serves (tiny tokenizer, fake
                            engine) — :data:`PRELUDES`
``excerpt PATH``            an excerpt of the source: every line of it is in PATH (spaces normalised)
``synopsis``                a usage synopsis: every ``--flag`` of each ``rlgate ...`` /
                            ``python -m ...`` line is in that command's ``--help``
``server``                  each line starts a server: started, waited on until ``/health`` answers
                            on ``$PORT``, stopped
``sub A => B``              run with A replaced by B: a shortened form (fewer steps, a tiny model for a
                            path); listed
``files PATH ...``          inputs the text assumes exist (a run's trajectories, an export, ``tiny``,
                            a checkpoint ``ckpt/...``): made by the test first
==========================  ===========================================================================

Rules for every block: ``8000`` in URLs and ``--port 8000`` is a free port (``$PORT``); ``rlgate serve``
without ``--port`` gets ``--port $PORT``; a line that starts ``rlgate serve ... &`` is followed by waiting
until its ``/health`` answers (what a person does before typing the next line); the clone's ``examples/``
is linked into the scratch directory; processes a block leaves behind are stopped at the end.
``docs/training.md``'s walk-through (§0) is run by ``tests/test_docs_walkthrough.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from helpers import ADMIN_KEY, dummy_checkpoint, free_port

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
RUNNABLE = ("bash", "sh", "shell", "python")
_FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[\w-]*)[ \t]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$",
                    flags=re.M | re.S)
_DIRECTIVE = re.compile(r"<!--\s*docs-test:\s*(?P<text>.*?)\s*-->")

# Names a ``fragment`` may use, and the Python that defines them (inside ``async def main()``; the gateway's
# URL and admin key are in the environment).
PRELUDES = {
    "admin_key": 'admin_key = os.environ["RLGATE_ADMIN_KEY"]',
    "gateway_url": 'gateway_url = os.environ["RLGATE_URL"]',
    "client": 'from rlgate import GatewayClient\nclient = GatewayClient(os.environ["RLGATE_URL"], '
              'os.environ["RLGATE_ADMIN_KEY"])',
    "session": 'from rlgate import GatewayClient\nsession = await GatewayClient(os.environ["RLGATE_URL"], '
               'os.environ["RLGATE_ADMIN_KEY"]).start_session("docs")',
    "session_key": 'from rlgate import GatewayClient\nsession_key = (await GatewayClient(os.environ["RLGATE_URL"], '
                   'os.environ["RLGATE_ADMIN_KEY"]).start_session("docs")).api_key',
    "agent_or_factory": "from rlgate.demo.math_agent import MathAgent\nagent_or_factory = MathAgent()",
    "tok": 'from transformers import AutoTokenizer\ntok = AutoTokenizer.from_pretrained(os.environ["RLGATE_TOKENIZER"])',
    "samples": 'from rlgate.trajectory.export import read_jsonl\nsamples = read_jsonl("samples.jsonl")',
}


@dataclass
class Block:
    doc: str
    line: int
    lang: str
    code: str
    directives: list[str] = field(default_factory=list)

    @property
    def kind(self) -> str:
        kinds = [d.split()[0] for d in self.directives if d.split()[0] not in ("sub", "files")]
        return kinds[0] if kinds else "run"

    def arg(self, kind: str) -> str:
        return next((d[len(kind):].strip() for d in self.directives if d.split()[0] == kind), "")

    @property
    def subs(self) -> list[tuple[str, str]]:
        out = []
        for d in self.directives:
            if d.startswith("sub "):
                a, _, b = d[4:].partition(" => ")
                out.append((a, b))
        return out

    @property
    def files(self) -> list[str]:
        return [p for d in self.directives if d.startswith("files ") for p in d.split()[1:]]

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}"


def blocks(doc: str) -> list[Block]:
    """The doc's shell and Python blocks with their directives (named blocks of other languages too)."""
    text = (DOCS / doc).read_text()
    if doc == "training.md":  # §0 is tests/test_docs_walkthrough.py's
        start = text.index("## 0. Walk-through")
        end = text.index("\n## 1.", start)
        text = text[:start] + "\n" * text[start:end].count("\n") + text[end:]
    out = []
    for m in _FENCE.finditer(text):
        lang = m.group("lang")
        body = textwrap.dedent(m.group("indent") + m.group("body")) if m.group("indent") else m.group("body")
        named = re.match(r"#\s*\S+\.(py|ya?ml|json|toml)\s*$", body.split("\n", 1)[0])
        if lang not in RUNNABLE and not named:
            continue
        before = text[:m.start()].rstrip("\n").split("\n")
        directives = []
        while before and _DIRECTIVE.fullmatch(before[-1].strip()):
            directives.insert(0, _DIRECTIVE.fullmatch(before.pop().strip()).group("text"))  # type: ignore[union-attr]
        out.append(Block(doc, text[:m.start()].count("\n") + 2, lang, body, directives))
    return out


# --------------------------------------------------------------------------- what runs where

@dataclass(frozen=True)
class Doc:
    name: str
    gateway: bool = False  # the test serves a gateway (fake engine) on $PORT for the doc's blocks
    tiny: str | None = None  # "tokenizer" / "model": ./tiny is that (for the docs that assume one)


DOC_SETTINGS = [
    pytest.param(Doc("agents.md"), id="agents"),
    pytest.param(Doc("anthropic-messages.md", gateway=True), id="anthropic-messages"),
    pytest.param(Doc("http-api.md", gateway=True), id="http-api"),
    pytest.param(Doc("integrations.md", tiny="model"), id="integrations",
                 marks=[pytest.mark.slow, pytest.mark.torch, pytest.mark.timeout(1800)]),
    pytest.param(Doc("online.md"), id="online", marks=[pytest.mark.slow, pytest.mark.torch]),
    pytest.param(Doc("openai-responses.md", gateway=True), id="openai-responses"),
    pytest.param(Doc("operations.md", tiny="tokenizer"), id="operations", marks=[pytest.mark.slow]),
    pytest.param(Doc("policies.md"), id="policies", marks=[pytest.mark.slow, pytest.mark.torch]),
    pytest.param(Doc("remote-engines.md"), id="remote-engines"),
    pytest.param(Doc("scale-out.md", tiny="tokenizer"), id="scale-out",
                 marks=[pytest.mark.slow, pytest.mark.timeout(1800)]),
    pytest.param(Doc("trajectory-format.md"), id="trajectory-format", marks=[pytest.mark.torch]),
    pytest.param(Doc("training.md", gateway=True), id="training"),
    pytest.param(Doc("viewer.md", tiny="tokenizer"), id="viewer", marks=[pytest.mark.slow]),
]


def test_every_doc_with_a_runnable_block_is_run_here():
    """A new doc's blocks cannot go unrun: every doc with a shell or Python block is in DOC_SETTINGS."""
    covered = {p.values[0].name for p in DOC_SETTINGS}
    with_blocks = {p.name for p in DOCS.glob("*.md") if blocks(p.name)}
    assert with_blocks <= covered, with_blocks - covered


def test_the_blocks_not_run_and_the_shortened_ones_are_listed_with_a_reason():
    """The list the issue asks for: printed with ``pytest -s``; each skip names its reason."""
    listed = []
    for p in DOC_SETTINGS:
        for b in blocks(p.values[0].name):
            if b.kind == "skip":
                assert b.arg("skip"), f"{b}: a skip without a reason"
                listed.append(f"not run   {b}: {b.arg('skip')}")
            if b.subs:
                listed.append(f"shortened {b}: " + "; ".join(f"{a!r} -> {c!r}" for a, c in b.subs))
            unknown = [d for d in b.directives if d.split()[0] not in
                       ("skip", "fragment", "excerpt", "synopsis", "server", "sub", "files")]
            assert not unknown, f"{b}: unknown directives {unknown}"
    print("\n".join(listed))
    assert listed


def test_the_fragments_use_only_names_the_test_defines():
    for p in DOC_SETTINGS:
        for b in blocks(p.values[0].name):
            if b.kind == "fragment":
                names = [n.strip() for n in b.arg("fragment").split(",")]
                assert set(names) <= set(PRELUDES), f"{b}: {names}"


# --------------------------------------------------------------------------- the session


class Session:
    """One doc's scratch directory, environment and the processes its blocks left running."""

    def __init__(self, tmp: Path, port: int) -> None:
        self.dir = tmp
        self.port = port
        bin_dir = str(Path(sys.executable).parent)
        self.env = {**os.environ, "PORT": str(port), "RLGATE_ADMIN_KEY": ADMIN_KEY,
                    "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "HF_HUB_OFFLINE": "1",
                    "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        self.env.pop("RLGATE_STORE", None)
        self.env["RLGATE_DATA_DIR"] = str(tmp / "data")  # never the user's ~/.local/share/rlgate
        self.groups: list[int] = []  # process groups to stop at the end
        self._help: dict[str, str] = {}
        (tmp / "examples").symlink_to(ROOT / "examples")

    def close(self) -> None:
        for pgid in self.groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGTERM)
        deadline = time.monotonic() + 60
        for pgid in self.groups:
            while time.monotonic() < deadline:
                try:
                    os.killpg(pgid, 0)
                except (ProcessLookupError, PermissionError):
                    break
                time.sleep(0.1)
            else:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, signal.SIGKILL)

    def ports(self, code: str) -> str:
        code = re.sub(r"(?<=[:/])8000\b", str(self.port), code)
        code = re.sub(r"--port 8000\b", f"--port {self.port}", code)
        return code

    def wait_health(self, proc: subprocess.Popen | None = None, timeout: float = 600.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert proc is None or proc.poll() is None, f"the server exited ({proc.returncode})"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2).status_code == 200:
                    return
            time.sleep(0.2)
        raise TimeoutError(f"nothing answered on port {self.port}")

    def bash(self, code: str, block: Block, timeout: float = 1800) -> str:
        lines = []
        for line in code.splitlines():
            if re.match(r"\s*rlgate serve\b", line) and "--port" not in line:
                line = re.sub(r"rlgate serve\b", f"rlgate serve --port {self.port}", line, count=1)
            lines.append(line)
            if re.match(r"\s*rlgate serve\b.*&\s*(#.*)?$", line):
                lines.append(f"until curl -sf -o /dev/null http://127.0.0.1:{self.port}/health; do "
                             "kill -0 $! || exit 1; sleep 0.2; done")
        script = "\n".join(lines) + "\nenv -0 > .docs-test-env\n"
        log = self.dir / f".block-{block.line}.log"
        with log.open("w") as out:
            proc = subprocess.Popen(["bash", "-ec", script], cwd=self.dir, env=self.env, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            self.groups.append(proc.pid)
            rc = proc.wait(timeout=timeout)
        text = log.read_text()
        assert rc == 0, f"{block} exited {rc}:\n{code}\n--- output ---\n{text[-6000:]}"
        for item in (self.dir / ".docs-test-env").read_bytes().split(b"\0"):
            key, _, value = item.decode(errors="replace").partition("=")
            if key and key not in ("PWD", "OLDPWD", "SHLVL", "_"):
                self.env[key] = value
        return text

    def python(self, code: str, block: Block, timeout: float = 1800) -> str:
        done = subprocess.run([sys.executable, "-"], input=code, cwd=self.dir, env=self.env, capture_output=True,
                              text=True, timeout=timeout)
        assert done.returncode == 0, f"{block} exited {done.returncode}:\n{code}\n--- output ---\n" \
                                     f"{(done.stdout + done.stderr)[-6000:]}"
        return done.stdout

    def help(self, command: str) -> str:
        """``COMMAND --help`` (remembered)."""
        if command not in self._help:
            argv = shlex.split(command) + ["--help"]
            if argv[0] == "python":
                argv[0] = sys.executable
            done = subprocess.run(argv, cwd=self.dir, env=self.env, capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, f"{command} --help: {done.stderr[-2000:]}"
            self._help[command] = done.stdout
        return self._help[command]

    def server(self, line: str, block: Block) -> None:
        if "--port" not in line:
            line = re.sub(r"rlgate serve\b", f"rlgate serve --port {self.port}", line, count=1)
        log = (self.dir / f".server-{block.line}.log").open("w")
        proc = subprocess.Popen(["bash", "-c", "exec " + line.split("#", 1)[0]], cwd=self.dir, env=self.env,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            self.wait_health(proc)
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(120)


def _synopsis(code: str, session: Session, block: Block) -> None:
    """Every --flag of each command line is one its --help knows."""
    checked = 0
    for line in code.splitlines():
        line = line.split("#", 1)[0].strip()
        m = re.match(r"(rlgate(?: [a-z][\w-]*)?|python -m [\w.]+)", line)
        if not m:
            continue
        command = m.group(1)
        if command.startswith("rlgate ") and command.split()[1] not in session.help("rlgate").split(
                "positional arguments", 1)[0]:
            command = "rlgate"
        for flag in re.findall(r"(?<![\w-])--[a-z][\w-]*", line):
            assert flag in session.help(command), f"{block}: {command} has no {flag}"
        checked += 1
    assert checked, f"{block}: no command line in the synopsis"


def _excerpt(code: str, path: str, block: Block) -> None:
    source = {" ".join(line.split()) for line in (ROOT / path).read_text().splitlines()}
    for line in code.splitlines():
        if line.strip():
            assert " ".join(line.split()) in source, f"{block}: {line!r} is not in {path}"


def _fragment(code: str, names: list[str]) -> str:
    body = "\n".join(PRELUDES[n] for n in names) + "\n" + code
    return "import asyncio\nimport os\n\n\nasync def main():\n" + textwrap.indent(body, "    ") + \
        "\n\nasyncio.run(main())\n"


def _skip(code: str, block: Block) -> None:
    if block.lang == "python":
        compile(code, str(block), "exec", flags=0x2000)  # PyCF_ALLOW_TOP_LEVEL_AWAIT
    else:
        done = subprocess.run(["bash", "-n"], input=code, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, f"{block}: not valid bash: {done.stderr}"


# --------------------------------------------------------------------------- inputs the text assumes

def _samples(url: str) -> list[dict]:
    """Two sessions' samples from the test's gateway (what an export or a run's dump holds)."""
    import asyncio

    from openai import AsyncOpenAI

    from rlgate.client import GatewayClient

    async def play() -> list[dict]:
        out = []
        async with GatewayClient(url, ADMIN_KEY) as gw:
            for task in ("docs-a", "docs-b"):
                async with gw.session(task) as s:
                    oai = AsyncOpenAI(base_url=s.base_url, api_key=s.api_key, max_retries=0)
                    await oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "2+2?"}],
                                                      max_tokens=8)
                    await oai.close()
                    await s.set_reward(1.0)
                out += (await s.export())["interactions"]
        return out

    return asyncio.run(play())


def _make_files(paths: list[str], session: Session, samples_of: Callable[[], list[dict]],
                tiny: dict[str, Path]) -> None:
    from rlgate.trajectory.export import write_jsonl, write_parquet

    for rel in paths:
        target = session.dir / rel.rstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        if rel in ("tiny", "tok"):
            target.symlink_to(tiny["model" if rel == "tiny" and "model" in tiny else "tokenizer"])
            continue
        if rel.startswith("ckpt/"):  # a checkpoint the fake engine accepts (it reads no weights)
            dummy_checkpoint(target)
            continue
        samples = samples_of()
        if rel.endswith("/"):
            target.mkdir(exist_ok=True)
            write_parquet(samples, target / "step-000001.parquet")
            (target.parent / "config.yaml").write_text(f"model: {tiny['tokenizer']}\n")
        elif rel.endswith(".parquet"):
            write_parquet(samples, target)
        else:
            write_jsonl(samples, target)


# --------------------------------------------------------------------------- the test

@contextlib.contextmanager
def _gateway(tokenizer, stop_ids):
    from rlgate.config import GatewayConfig
    from rlgate.engine.fake import FakeEngine
    from rlgate.server.app import create_app
    from rlgate.server.runner import ServerThread
    from rlgate.store.base import MemoryStore

    app = create_app(GatewayConfig(admin_key=ADMIN_KEY), FakeEngine(tokenizer), MemoryStore(), tokenizer,
                     stop_token_ids=stop_ids)
    with ServerThread(app) as url:
        yield url


@pytest.mark.parametrize("doc", DOC_SETTINGS)
def test_the_docs_blocks_run(doc: Doc, tmp_path, request, tokenizer, stop_ids, tiny_tokenizer_dir):
    tiny = {"tokenizer": tiny_tokenizer_dir}
    if doc.tiny == "model":
        tiny["model"] = request.getfixturevalue("tiny_model_dir")
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(_gateway(tokenizer, stop_ids)) if doc.gateway else None

        def samples_of() -> list[dict]:  # from a gateway of the test's own, not the doc's port
            with _gateway(tokenizer, stop_ids) as own:
                return _samples(own)

        port = int(url.rsplit(":", 1)[1]) if url else free_port()
        session = Session(tmp_path, port)
        stack.callback(session.close)
        if url:
            session.env.update(RLGATE_URL=url)
        session.env["RLGATE_TOKENIZER"] = str(tiny_tokenizer_dir)
        if doc.tiny:
            (tmp_path / "tiny").symlink_to(tiny["model" if doc.tiny == "model" else "tokenizer"])
        ran = 0
        for b in blocks(doc.name):
            code = session.ports(b.code)
            for a, c in b.subs:
                assert a in code, f"{b}: sub {a!r}: not in the block"
                code = code.replace(a, c)
            _make_files(b.files, session, samples_of, tiny)
            if b.kind == "skip":
                _skip(b.code, b)
                continue
            if b.kind == "excerpt":
                _excerpt(code, b.arg("excerpt"), b)
            elif b.kind == "synopsis":
                _synopsis(code, session, b)
            elif b.kind == "server":
                for line in code.splitlines():
                    if line.strip() and not line.lstrip().startswith("#"):
                        session.server(line.strip(), b)
            elif b.kind == "fragment":
                if "samples" in b.arg("fragment"):
                    from rlgate.trajectory.export import write_jsonl

                    write_jsonl(samples_of(), tmp_path / "samples.jsonl")
                session.python(_fragment(code, [n.strip() for n in b.arg("fragment").split(",")]), b)
            elif b.lang == "python" or b.lang not in RUNNABLE:
                first = code.split("\n", 1)[0]
                named = re.match(r"#\s*(\S+\.\w+)\s*$", first)
                if named:
                    (tmp_path / named.group(1)).write_text(code)
                    continue
                session.python(code, b)
            else:
                session.bash(code, b)
            ran += 1
        assert ran or all(b.kind == "skip" for b in blocks(doc.name))
    print(json.dumps({"doc": doc.name, "ran": ran}))
