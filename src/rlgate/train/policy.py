"""The policy as the trainer holds it (``train:`` in the config): dtype, gradient checkpointing, LoRA.

* ``train.dtype`` — ``float32`` (default) or ``bfloat16``: the weights, gradients and AdamW state in
  that dtype (bfloat16 has no float32 master copy: half the memory, coarser updates); ``mixed``: float32
  weights, gradients and AdamW state, the forward and backward passes in bfloat16 (``torch.autocast``:
  2-3x faster on a CPU with AVX-512 bf16; the trainer's logprobs then differ from a float32 engine's
  by ~0.03 nats on SmolLM2, which ``behav_logprob_abs_err`` shows).
* ``train.gradient_checkpointing`` — activations are recomputed in the backward pass.
* ``train.lora`` — LoRA adapters through PEFT: only the adapters have gradients and optimiser
  state. The serving engine gets **merged** weights (``W + (alpha / r) · B @ A`` per adapted layer,
  computed out of place: the trained base weights are never touched), so every engine serves a
  LoRA run unchanged; checkpoints hold the adapter (``adapter_model.safetensors``), and a resumed
  run loads the base model and that adapter.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlgate.rollout.errors import RunError
from rlgate.train.config import ConfigError, ModelSettings, TrainConfig


def check_lora(settings: ModelSettings) -> None:
    """ConfigError if ``train.lora`` is set but peft is not installed."""
    import importlib.util

    if settings.lora is not None and importlib.util.find_spec("peft") is None:
        raise ConfigError("train.lora is set but the peft package is not installed (pip install peft, "
                          "or pip install 'rlgate[train]'; or remove train.lora)")


def is_adapter(path: Path) -> bool:
    return (path / "adapter_config.json").is_file()


def load_policy(cfg: TrainConfig, base: Path, checkpoint: Path | None = None) -> Any:
    """The model to train: ``checkpoint`` (a resumed run; with LoRA: ``base`` + its adapter) else ``base``."""
    import torch
    from transformers import AutoModelForCausalLM

    lora = cfg.train.lora
    base = base.resolve()  # recorded in a LoRA checkpoint (adapter_config.json): `rlgate serve` finds it there
    source = checkpoint if checkpoint is not None and lora is None else base
    if checkpoint is not None and (lora is None) == is_adapter(checkpoint):
        raise RunError(f"resume: {checkpoint} holds {'a LoRA adapter' if is_adapter(checkpoint) else 'full weights'}"
                       f" but train.lora is {'unset' if lora is None else 'set'}: match the run's setting, or "
                       "start a new out_dir")
    dtype = torch.bfloat16 if cfg.train.dtype == "bfloat16" else torch.float32
    model: Any = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
    return shape_policy(model, cfg.train, adapter=checkpoint if lora is not None else None)


def shape_policy(model: Any, settings: ModelSettings, *, adapter: Path | None = None) -> Any:
    """``model`` as ``train:`` says the trainer holds it: in its dtype, with LoRA adapters (``adapter``: a saved
    one to go on training) and gradient checkpointing. ``rlgate train`` and the online trainer both use it."""
    import torch

    if settings.dtype == "bfloat16" and model.dtype != torch.bfloat16:
        model = model.to(torch.bfloat16)
    lora = settings.lora
    if lora is not None:
        from peft import LoraConfig, PeftModel, get_peft_model

        if adapter is not None:
            model = PeftModel.from_pretrained(model, adapter, is_trainable=True)
        else:
            model = get_peft_model(model, LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                                     target_modules=lora.target_modules, task_type="CAUSAL_LM"))
    if settings.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def _is_peft(model: Any) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def serving_state_dict(model: Any) -> dict[str, Any]:
    """The weights an engine serves: the model's own, or for a LoRA model the base model's keys with
    each adapted weight merged (out of place)."""
    import torch

    if not _is_peft(model):
        return {k: v.detach() for k, v in model.state_dict().items()}
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    adapter = model.active_adapter if isinstance(model.active_adapter, str) else model.active_adapter[0]
    out: dict[str, Any] = {}
    with torch.no_grad():
        layers: list[tuple[str, Any]] = [(name, m) for name, m in base.named_modules()
                                         if isinstance(m, LoraLayer) and adapter in m.lora_A]
        deltas = {name: m.get_delta_weight(adapter) for name, m in layers}
        for key, value in base.state_dict().items():
            if ".lora_" in key:
                continue
            if ".base_layer." in key:
                layer, _, leaf = key.partition(".base_layer.")
                if leaf == "weight" and layer in deltas:
                    value = value + deltas[layer].to(value.dtype)
                key = f"{layer}.{leaf}"
            out[key] = value.detach()
    return out


def save_for_serving(model: Any, path: Path) -> None:
    """A checkpoint directory any engine loads (``save_pretrained``; LoRA: the merged weights), with a
    tied output layer written as a tensor of its own and the weight probe the gateway checks the
    engine against (train/weight_probe.py)."""
    from rlgate.train.weight_probe import serving_tensors, write_probe

    base = model.get_base_model() if _is_peft(model) else model
    if not hasattr(base, "get_input_embeddings"):
        # weights without their module (TRL's streamed weights, integrations/trl_async.py): nothing to run the
        # probe with, so the checkpoint goes without one and the gateway's check of it is skipped (and counted)
        base.save_pretrained(path, safe_serialization=True)
        return
    base.save_pretrained(path, state_dict=serving_tensors(model, serving_state_dict(model)), safe_serialization=True)
    write_probe(model, path)


def save_adapter_for_serving(model: Any, path: Path) -> None:
    """A LoRA run's adapter alone (``adapter_config.json`` + ``adapter_model.safetensors``) and the weight
    probe of base + adapter: what a vLLM gateway loads through vLLM's runtime LoRA API
    (``gateway.push: adapter``; docs/remote-engines.md)."""
    from rlgate.train.weight_probe import write_probe

    if not _is_peft(model):
        raise RunError("gateway.push is 'adapter' but the model has no LoRA adapter (set train.lora)")
    model.save_pretrained(path, safe_serialization=True)
    write_probe(model, path)


def merge_adapter(base: Path, adapter: Path, out: Path) -> Path:
    """A full checkpoint directory (weights merged, tokenizer files of ``adapter``) from a LoRA
    checkpoint: what ``rlgate eval`` serves for one, and what ``rlgate serve --model`` takes::

        python -c "from pathlib import Path; from rlgate.train.policy import merge_adapter; \\
                   merge_adapter(Path('BASE'), Path('runs/x/checkpoints/step-000100'), Path('merged'))"
    """
    import shutil

    from transformers import AutoModelForCausalLM

    try:
        from peft import PeftModel
    except ImportError:
        raise ConfigError(f"{adapter} is a LoRA adapter; loading it needs peft (pip install peft)") from None

    from rlgate.train.checkpoint import TOKENIZER_FILES

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapter)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    save_for_serving(model, tmp)
    for name in TOKENIZER_FILES:
        for src in (adapter / name, base / name):
            if src.is_file() and not (tmp / name).exists():
                shutil.copy(src, tmp / name)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out
