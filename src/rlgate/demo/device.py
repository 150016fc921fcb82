"""``rlgate demo --device``: where the policy is served and trained; CUDA is refused in one line
when there is none (checked before anything is loaded, and without importing torch when torch is
not installed)."""

from __future__ import annotations

import importlib.util

__all__ = ["check_device"]


def check_device(device: str) -> str:
    """``device`` if it can be used ("cpu", "cuda", "cuda:N"), else SystemExit with what to do."""
    if device == "cpu":
        return device
    if device != "cuda" and not (device.startswith("cuda:") and device[5:].isdigit()):
        raise SystemExit(f"rlgate demo: --device {device!r}: expected cpu, cuda or cuda:N")
    if importlib.util.find_spec("torch") is None:
        raise SystemExit(f"rlgate demo: --device {device} needs PyTorch with CUDA; torch is not installed "
                         "(pip install torch), or run with --device cpu")
    import torch

    if not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise SystemExit(f"rlgate demo: --device {device}: no CUDA device is available (torch {torch.__version__}, "
                         f"{build}); run with --device cpu")
    index = int(device[5:]) if ":" in device else 0
    if index >= torch.cuda.device_count():
        raise SystemExit(f"rlgate demo: --device {device}: there are {torch.cuda.device_count()} CUDA devices")
    return device
