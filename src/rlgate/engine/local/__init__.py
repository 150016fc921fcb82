"""The in-process engine: a Hugging Face causal LM with continuous batching (needs torch).

``engine`` holds :class:`LocalEngine` and its worker thread; ``cache`` the left-padded KV
cache; ``batch`` the worker-side request and batch state; ``sampling`` per-request seeded
sampling; ``weights`` checkpoint loading.
"""

from __future__ import annotations

from rlgate.engine.local.engine import LocalEngine
from rlgate.engine.local.sampling import sample_tokens
from rlgate.engine.local.weights import load_safetensors_dir, match_state_dict

__all__ = ["LocalEngine", "load_safetensors_dir", "match_state_dict", "sample_tokens"]
