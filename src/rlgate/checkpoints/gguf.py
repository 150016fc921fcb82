"""A GGUF file as a Hugging Face checkpoint directory, converted once and cached.

transformers loads a GGUF file (``from_pretrained(dir, gguf_file=F)``, with the ``gguf`` and
``accelerate`` packages) by dequantising every tensor to float32: ~90 s for SmolLM2-135M on a
busy 2-core machine. rlgate's engines, trainer and tokenizer loading all take a checkpoint
directory, so the file is converted once into ``CACHE/gguf/<sha256 prefix>/`` (safetensors
weights, tokenizer, config, generation config) and every later start reads that (~1 s).

``save_pretrained`` refuses a GGUF-loaded model (its config carries a GGUF
``quantization_config``), so the model is rebuilt ``from_config`` without it and the
dequantised tensors loaded into it. The cache key is the file's sha256: the same file under
another name is not converted twice, and a changed file is converted again. The directory is
written beside its final name and renamed into place, so an interrupted conversion leaves no
half checkpoint behind.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path

log = logging.getLogger("rlgate.checkpoints")

COMPLETE = "rlgate-gguf.json"  # written last: the directory is a finished conversion
TEMPLATES = Path(__file__).parent / "templates"
# A GGUF without a chat template (a base model) gets its family's published turn format, and
# the tokens that end a turn in that format are added to the generation config's eos ids.
FALLBACK_TEMPLATES: dict[str, tuple[str, tuple[str, ...]]] = {
    "gemma3": ("gemma3.jinja", ("<end_of_turn>",)),
    "gemma3_text": ("gemma3.jinja", ("<end_of_turn>",)),
}


def cache_root() -> Path:
    """``$RLGATE_CACHE``, else ``$XDG_CACHE_HOME/rlgate``, else ``~/.cache/rlgate``."""
    env = os.environ.get("RLGATE_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "rlgate"


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def converted_dir(gguf: Path, digest: str | None = None) -> Path:
    return cache_root() / "gguf" / (digest or sha256_file(gguf))[:32]


def convert_gguf(gguf: str | Path, *, digest: str | None = None) -> Path:
    """The checkpoint directory of ``gguf`` (converted now if it is not in the cache yet)."""
    path = Path(gguf).expanduser().resolve()
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such GGUF file")
    digest = digest or sha256_file(path)
    out = converted_dir(path, digest)
    if (out / COMPLETE).is_file():
        return out
    log.warning("converting %s to a checkpoint directory (once; cached in %s)", path.name, out)
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        _convert(path, tmp)
        (tmp / COMPLETE).write_text(json.dumps({"source": path.name, "sha256": digest}) + "\n")
        try:
            tmp.rename(out)
        except OSError:  # another process finished first: keep its directory
            if not (out / COMPLETE).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _convert(path: Path, dst: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    d, f = str(path.parent), path.name
    tokenizer = AutoTokenizer.from_pretrained(d, gguf_file=f)
    loaded = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
    config = AutoConfig.from_pretrained(d, gguf_file=f)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.float32
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise ValueError(f"{path.name}: the dequantised weights do not fit the model "
                         f"(missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]})")
    if tied:
        model.tie_weights()
    gen = loaded.generation_config if loaded.generation_config is not None else GenerationConfig()
    fallback = FALLBACK_TEMPLATES.get(str(getattr(config, "model_type", "")))
    if not getattr(tokenizer, "chat_template", None) and fallback is not None:
        template, turn_ends = fallback
        tokenizer.chat_template = (TEMPLATES / template).read_text()
        eos = gen.eos_token_id if isinstance(gen.eos_token_id, list) else \
            ([gen.eos_token_id] if gen.eos_token_id is not None else [])
        for tok in turn_ends:
            tid = tokenizer.convert_tokens_to_ids(tok)
            if isinstance(tid, int) and tid != tokenizer.unk_token_id and tid not in eos:
                eos.append(tid)
        gen.eos_token_id = eos
        log.warning("%s has no chat template: using rlgate's %s (the published turn format)", path.name, template)
    model.save_pretrained(dst, safe_serialization=True)
    tokenizer.save_pretrained(dst)
    gen.save_pretrained(dst)
