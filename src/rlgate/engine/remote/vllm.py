"""vLLM servers as the engine, through ``/v1/completions`` with token-id prompts.

Wire format followed (vLLM 0.33 / main; ``vllm/entrypoints/openai/serving_completion.py``
and the dev-mode routers; see ``docs/remote-engines.md`` for the exact sources):

Request ``POST /v1/completions``::

    {"model": <served name>, "prompt": [token ids], "max_tokens", "temperature", "top_p",
     "top_k" (-1: off), "seed" (when given), "stop_token_ids", "skip_special_tokens": false,
     "logprobs": 1, "return_token_ids": true, "return_tokens_as_token_ids": true,
     "stream": true, "n": 1, "echo": false}

Response: server-sent events ``data: {"id", "object": "text_completion", "choices": [{"index",
"text", "logprobs": {"tokens", "token_logprobs", "top_logprobs", "text_offset"},
"finish_reason", "stop_reason", "prompt_token_ids" (first event only), "token_ids"}]}``,
each holding only the new tokens, then ``data: [DONE]``. ``return_token_ids`` needs vLLM
>= 0.10.2. Errors: HTTP 4xx/5xx with ``{"error": {"message", "type", "param", "code"}}``
(``{"object": "error", "message", ...}`` on older servers); an error during streaming is
sent as one such event.

Logprobs: vLLM reports what its ``--logprobs-mode`` says. The default ``raw_logprobs`` is
``log_softmax(logits)`` *before* temperature, penalties and top-k/top-p: equal to
``engine/base.py``'s distribution only at T = 1 (or greedy). ``processed_logprobs`` is the
distribution after temperature and top-k/top-p, renormalised over the kept tokens: equal
to the contract whenever top_p = 1 and top-k is off. ``logprobs_mode`` must match the
server; in dev mode the engine reads it from ``/server_info`` and uses the server's value.
``raw_logits`` / ``processed_logits`` are refused (they are not logprobs).

Weights (``VLLM_SERVER_DEV_MODE=1`` is required for these routes): ``POST /pause?mode=abort``
(requests in flight are aborted, ``finish_reason: "abort"``, and new ones wait; the engine
resumes each aborted request from the tokens it already has once generation continues, see
``engine.py``; ``mode=wait`` lets them finish first, ``mode=keep`` freezes them),
``POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": path}}`` (the
workers reload the weights in place from ``path``: vLLM 0.32's ``reload_weights``; a server
whose ``reload_weights`` has no ``weights_path`` gets the older ``update_config`` with
``{"model_config": {"model": path}}`` then ``reload_weights``; vLLM 0.32.0's ``update_config``
itself fails, ``Field '_hf_config_revision' not found in ModelConfig``),
``POST /reset_prefix_cache`` (no stale KV is reused), ``POST /resume``, then the weight check
(``prompt_logprobs`` of the checkpoint's probe, engine/weight_check.py; the gateway admits no new
request until it passed). A LoRA adapter directory (``adapter_config.json``) goes through the
runtime LoRA API instead (``POST /v1/load_lora_adapter``; servers started with ``--enable-lora``
and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1``): requests name the adapter from then on.
vLLM responses carry no weight version: with ``abort`` and ``wait`` no request runs across a
weight change, so every token is tagged with the version current when its request was sent
(exact); with ``keep`` tokens are tagged when they arrive (a token produced just before the
pause but read after the update gets the new version).
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

import httpx

from rlgate.engine.base import FinishReason, GenerateRequest
from rlgate.engine.remote.adapters import RemoteAdapters
from rlgate.engine.remote.backend import Backend
from rlgate.engine.remote.engine import PROBE_TIMEOUT, RemoteEngine
from rlgate.engine.remote.errors import (
    BackendAborted,
    BackendFailed,
    BackendRejected,
    LoadRefused,
    MalformedResponse,
    error_message,
    error_text,
)
from rlgate.engine.remote.options import RemoteOptions, VLLMLogprobsMode, VLLMPauseMode
from rlgate.engine.remote.wire import Chunk, StreamState, as_float, as_int_list

log = logging.getLogger("rlgate.engine.vllm")

_MODES = {"raw_logprobs": "raw", "processed_logprobs": "processed"}


# **vLLM's CPU build (0.32) computes a base-model row of a batch that also holds LoRA rows with one of those
# adapters** (measured: tests/test_vllm_real.py, two adapter policies and the base generating at once: the base
# request's logprobs were one adapter's to 2e-5, 0.4-0.8 nats from the base's; alone it is exact). So while
# adapter policies are loaded, base-model requests name this adapter instead: a zero LoRA (B = 0), loaded before
# the first policy and unloaded after the last, whose update adds exactly nothing. Not a policy name (``#``).
IDENTITY = "#rlgate-identity"


class VLLMEngine(RemoteEngine):
    kind = "vllm"
    generate_path = "/v1/completions"
    health_path = "/health"

    def __init__(self, backend_urls: Any, *, logprobs_mode: VLLMLogprobsMode = RemoteOptions.vllm_logprobs_mode,
                 pause_mode: VLLMPauseMode = RemoteOptions.vllm_pause_mode, **kwargs: Any) -> None:
        super().__init__(backend_urls, **kwargs)
        if logprobs_mode not in _MODES:
            raise ValueError(f"logprobs_mode must be one of {sorted(_MODES)} (logits are not logprobs)")
        if pause_mode not in ("wait", "keep", "abort"):
            raise ValueError("pause_mode must be wait, keep or abort")
        self.vllm_logprobs_mode = logprobs_mode
        self.logprobs_mode = _MODES[logprobs_mode]
        self.pause_mode = pause_mode
        self._identity_dirs: list[str] = []  # the zero adapters written (IDENTITY), removed with it

    @property
    def tags_by_start(self) -> bool:
        return self.pause_mode in ("wait", "abort")  # no request runs across a weight change

    # ------------------------------------------------------------------ info

    async def probe_backend(self, b: Backend) -> None:
        models = await self.pool.get_json(b, "/v1/models", timeout=PROBE_TIMEOUT)
        data = models.get("data") if isinstance(models, dict) else None
        if not isinstance(data, list) or not data or not isinstance(data[0], dict):
            raise MalformedResponse(f"/v1/models lists no model: {str(models)[:200]}")
        card = data[0]  # the base model (LoRA adapters follow it)
        if isinstance(card.get("id"), str):
            b.info["base_model"] = card["id"]
            if "adapter" not in b.info:  # with an adapter pushed, requests name it (set by load_weights)
                b.info["model"] = card["id"]
        root = card.get("root")
        b.model_path = root if isinstance(root, str) and root else b.model_path
        mml = card.get("max_model_len")
        if isinstance(mml, int) and mml > 0:
            b.max_model_len = mml
        await self._detect_logprobs_mode(b)

    async def _detect_logprobs_mode(self, b: Backend) -> None:
        """Dev-mode servers expose their config; trust the server's logprobs mode over ours."""
        try:
            r = await self.pool.call(b, "GET", "/server_info", params={"config_format": "json"}, timeout=PROBE_TIMEOUT)
            cfg = r.json().get("vllm_config") if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError):
            return
        mode = cfg.get("model_config", {}).get("logprobs_mode") if isinstance(cfg, dict) else None
        if isinstance(mode, str) and mode != self.vllm_logprobs_mode:
            if mode not in _MODES:
                log.error("backend %s runs --logprobs-mode %s, which reports logits, not logprobs; its answers "
                          "will be rejected", b.url, mode)
                return
            log.warning("backend %s runs --logprobs-mode %s (configured: %s); using the server's",
                        b.url, mode, self.vllm_logprobs_mode)
            self.vllm_logprobs_mode = "raw_logprobs" if mode == "raw_logprobs" else "processed_logprobs"
            self.logprobs_mode = _MODES[mode]

    # ------------------------------------------------------------------ generation

    def payload(self, b: Backend, request: GenerateRequest) -> dict[str, Any]:
        s = request.sampling
        body: dict[str, Any] = {
            "prompt": list(request.input_ids),
            "max_tokens": s.max_new_tokens,
            "temperature": s.temperature,
            "top_p": s.top_p,
            "top_k": s.top_k if s.top_k > 0 else -1,
            "stop_token_ids": list(s.stop_token_ids),
            "skip_special_tokens": False,
            "logprobs": 1,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "stream": True,
            "n": 1,
            "echo": False,
        }
        if request.adapter is not None:  # a LoRA adapter is named as a model (engine/remote/adapters.py)
            body = {"model": request.adapter, **body}
        elif IDENTITY in self._lora and "adapter" not in b.info:  # no row of a LoRA batch without an adapter
            body = {"model": IDENTITY, **body}
        elif "model" in b.info:
            body = {"model": b.info["model"], **body}
        if s.seed is not None:
            body["seed"] = s.seed % (2**63)
        return body

    def parse_event(self, st: StreamState, obj: Any) -> Chunk | None:
        if not isinstance(obj, dict):
            raise MalformedResponse(f"an event is not a JSON object: {str(obj)[:200]}")
        if "error" in obj or obj.get("object") == "error":  # an error after the stream started: a backend failure
            msg = error_message(obj)
            if msg in (None, "", "None"):  # older vLLM's error event for a request aborted on the server
                raise BackendAborted("an error event without a message (vLLM sends this when it aborts a request)")
            raise BackendRejected(msg)
        choices = obj.get("choices")
        if not isinstance(choices, list):
            raise MalformedResponse("an event has no choices")
        if not choices:
            return None  # the usage event
        if len(choices) != 1 or not isinstance(choices[0], dict):
            raise MalformedResponse(f"expected one choice, got {len(choices)}")
        c = choices[0]
        if c.get("token_ids") is None:
            raise MalformedResponse("the choice has no token_ids: the server ignored return_token_ids "
                                    "(vLLM >= 0.10.2 is needed)")
        ids = as_int_list(c["token_ids"], "token_ids")
        prompt = c.get("prompt_token_ids")
        if prompt is not None and prompt != st.request.input_ids:
            raise MalformedResponse("prompt_token_ids differ from the token ids rlgate sent")
        logprobs: list[float] = []
        if ids:
            lp = c.get("logprobs")
            if not isinstance(lp, dict) or not isinstance(lp.get("token_logprobs"), list):
                raise MalformedResponse("the choice has no logprobs.token_logprobs")
            values = lp["token_logprobs"]
            if len(values) != len(ids):
                raise MalformedResponse(f"{len(ids)} token_ids but {len(values)} token_logprobs")
            tokens = lp.get("tokens")
            if isinstance(tokens, list) and len(tokens) == len(ids):
                for tok, name in zip(ids, tokens, strict=True):
                    if isinstance(name, str) and name.startswith("token_id:") and name != f"token_id:{tok}":
                        raise MalformedResponse(f"logprobs.tokens names {name!r} where token_ids has {tok}")
            logprobs = [as_float(v, "a token logprob") for v in values]
        finish = _finish(c.get("finish_reason"))
        if not ids and finish is None:
            return None
        return Chunk(ids, logprobs, finish)

    # ------------------------------------------------------------------ weights

    async def pause_backend(self, b: Backend) -> bool:
        r = await self.pool.call(b, "POST", "/pause", params={"mode": self.pause_mode}, timeout=self.update_timeout)
        if r.status_code == 404:
            log.warning("backend %s has no /pause (dev mode off or an older vLLM); updating without a pause", b.url)
            return False
        if r.status_code != 200:
            raise BackendRejected(f"/pause -> HTTP {r.status_code}: {error_text(r)}", r.status_code)
        return True

    async def resume_backend(self, b: Backend) -> None:
        r = await self.pool.call(b, "POST", "/resume", timeout=self.update_timeout)
        if r.status_code not in (200, 404):
            raise BackendRejected(f"/resume -> HTTP {r.status_code}: {error_text(r)}", r.status_code)

    async def _rpc(self, b: Backend, method: str, *, args: list[Any] | None = None,
                   kwargs: dict[str, Any] | None = None) -> httpx.Response:
        body: dict[str, Any] = {"method": method, "timeout": self.update_timeout}
        if args:
            body["args"] = args
        if kwargs:
            body["kwargs"] = kwargs
        return await self.pool.call(b, "POST", "/collective_rpc", json_body=body, timeout=self.update_timeout + 30)

    async def load_weights(self, b: Backend, path: str, label: str) -> None:
        if await asyncio.to_thread(_is_adapter, path):
            await self._load_adapter(b, path, label)
            return
        r = await self._rpc(b, "reload_weights", kwargs={"weights_path": path})
        if r.status_code == 404:
            raise LoadRefused(f"{b.url} has no /collective_rpc: start vLLM with VLLM_SERVER_DEV_MODE=1 to let "
                              "rlgate reload weights")
        if r.status_code != 200 and "weights_path" in error_text(r) and "unexpected keyword" in error_text(r):
            await self._load_by_config(b, path)  # a vLLM whose reload_weights reads only the model config
        elif r.status_code != 200:
            raise BackendFailed(f"{b.url}: reload_weights from {path} failed on the server: HTTP {r.status_code}: "
                                f"{error_text(r)}")
        await self._reset_prefix_cache(b)
        b.info["checkpoint"] = path
        await self._drop_adapter(b)  # full weights: requests name the base model again

    async def _reset_prefix_cache(self, b: Backend) -> None:
        r = await self.pool.call(b, "POST", "/reset_prefix_cache", timeout=self.update_timeout)
        if r.status_code not in (200, 404):
            raise BackendFailed(f"{b.url}: /reset_prefix_cache -> HTTP {r.status_code}: {error_text(r)}")

    async def _load_adapter(self, b: Backend, path: str, label: str) -> None:
        """A LoRA adapter directory (``adapter_config.json``): vLLM's runtime LoRA API loads it under a new
        name and the engine's requests name it from now on (the base weights stay as they are)."""
        name = f"rlgate-{label}"
        r = await self.pool.call(b, "POST", "/v1/load_lora_adapter", json_body={"lora_name": name, "lora_path": path},
                                 timeout=self.update_timeout)
        if r.status_code in (404, 405):
            raise LoadRefused(f"{b.url} has no /v1/load_lora_adapter: start vLLM with --enable-lora (and a "
                              "--max-lora-rank of at least the adapter's) and VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 "
                              "to let rlgate push LoRA adapters")
        if r.status_code != 200:
            raise BackendFailed(f"{b.url}: /v1/load_lora_adapter {path} failed on the server: HTTP {r.status_code}: "
                                f"{error_text(r)}")
        await self._reset_prefix_cache(b)
        previous = b.info.get("adapter")
        b.info.update(model=name, adapter=name, checkpoint=path)
        if previous is not None and previous != name:
            await self._unload_adapter(b, previous)

    async def _drop_adapter(self, b: Backend) -> None:
        previous = b.info.pop("adapter", None)
        if "base_model" in b.info:
            b.info["model"] = b.info["base_model"]
        if previous is not None:
            await self._unload_adapter(b, previous)

    async def _unload_adapter(self, b: Backend, name: str) -> None:
        """Best effort: an adapter left loaded costs memory, not correctness (no request names it)."""
        try:
            r = await self.pool.call(b, "POST", "/v1/unload_lora_adapter", json_body={"lora_name": name},
                                     timeout=self.update_timeout)
            if r.status_code != 200:
                log.warning("backend %s: could not unload the LoRA adapter %s: HTTP %d %s", b.url, name,
                            r.status_code, error_text(r))
        except httpx.HTTPError as exc:
            log.warning("backend %s: could not unload the LoRA adapter %s: %s", b.url, name, exc)

    async def _load_by_config(self, b: Backend, path: str) -> None:
        """Older vLLM: point the model config at ``path``, then reload from it."""
        r = await self._rpc(b, "update_config", args=[{"model_config": {"model": path}}])
        if r.status_code != 200:
            raise LoadRefused(f"{b.url} refused the new checkpoint path (update_config): HTTP {r.status_code}: "
                              f"{error_text(r)}")
        r = await self._rpc(b, "reload_weights")
        if r.status_code != 200:
            raise BackendFailed(f"{b.url}: reload_weights from {path} failed on the server: HTTP {r.status_code}: "
                                f"{error_text(r)}")

    async def score_backend(self, b: Backend, input_ids: list[int]) -> list[float]:
        """``prompt_logprobs`` of a one-token completion: vLLM's teacher-forced ``log_softmax(logits)`` of
        every prompt token after the first (prompt tokens skip the sampler, whatever ``--logprobs-mode``)."""
        body: dict[str, Any] = {"prompt": input_ids, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0,
                                "stream": False}
        if "model" in b.info:
            body["model"] = b.info["model"]
        r = await self.pool.call(b, "POST", "/v1/completions", json_body=body, timeout=self.update_timeout)
        if r.status_code != 200:
            raise BackendRejected(f"/v1/completions (prompt_logprobs) -> HTTP {r.status_code}: {error_text(r)}",
                                  r.status_code)
        try:
            entries = r.json()["choices"][0]["prompt_logprobs"]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise MalformedResponse(f"no choices[0].prompt_logprobs in the answer: {r.text[:200]}") from exc
        if not isinstance(entries, list) or len(entries) != len(input_ids):
            raise MalformedResponse(f"prompt_logprobs has {len(entries) if isinstance(entries, list) else 'no'} "
                                    f"entries for {len(input_ids)} prompt tokens")
        out: list[float] = []
        for tok, entry in zip(input_ids[1:], entries[1:], strict=True):
            value = entry.get(str(tok)) if isinstance(entry, dict) else None
            if not isinstance(value, dict):
                raise MalformedResponse(f"prompt_logprobs has no entry for prompt token {tok}: {str(entry)[:200]}")
            out.append(as_float(value.get("logprob"), "a prompt logprob"))
        return out

    # ------------------------------------------------------------------ LoRA adapters (engine/remote/adapters.py)

    async def load_adapter(self, name: str, path: str, version: int | None = None) -> int:
        """An adapter policy; the first one brings the identity adapter (see :data:`IDENTITY`) before it."""
        if IDENTITY not in self._lora:
            identity = await asyncio.to_thread(zero_adapter, path)
            try:
                await RemoteAdapters.load_adapter(self, IDENTITY, identity)
            finally:
                self._identity_dirs.append(identity)
        try:
            return await RemoteAdapters.load_adapter(self, name, path, version)
        except BaseException:
            await self._drop_identity()
            raise

    async def unload_adapter(self, name: str) -> None:
        await RemoteAdapters.unload_adapter(self, name)
        await self._drop_identity()

    async def _drop_identity(self) -> None:
        """No adapter policy left: base requests name the base model again."""
        if set(self._lora) == {IDENTITY}:
            await RemoteAdapters.unload_adapter(self, IDENTITY)
        if IDENTITY not in self._lora:
            for d in self._identity_dirs:
                await asyncio.to_thread(shutil.rmtree, d, True)
            self._identity_dirs.clear()

    def adapter_versions(self) -> dict[str, int]:
        return {k: v for k, v in RemoteAdapters.adapter_versions(self).items() if k != IDENTITY}

    async def load_lora(self, b: Backend, name: str, path: str, replace: bool) -> None:
        body: dict[str, Any] = {"lora_name": name, "lora_path": path}
        if replace:
            body["load_inplace"] = True
        await self.lora_call(b, "/v1/load_lora_adapter", body)

    async def unload_lora(self, b: Backend, name: str) -> None:
        await self.lora_call(b, "/v1/unload_lora_adapter", {"lora_name": name}, missing_ok=True)


def zero_adapter(like: str) -> str:
    """A LoRA adapter whose update is exactly zero (``like``'s configuration and A matrices, every B zero: the
    bytes of a float zero are zeros whatever the dtype), written beside ``like`` (the backends see that
    directory) or, where that is not writable, in the temporary directory; its path."""
    src = Path(like)
    try:
        dst = Path(tempfile.mkdtemp(prefix=".rlgate-identity-lora-", dir=src.parent))
    except OSError:
        dst = Path(tempfile.mkdtemp(prefix="rlgate-identity-lora-"))
    shutil.copy(src / "adapter_config.json", dst / "adapter_config.json")
    data = bytearray((src / "adapter_model.safetensors").read_bytes())
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + size])
    for key, info in header.items():
        if key != "__metadata__" and "lora_B" in key:
            begin, end = info["data_offsets"]
            data[8 + size + begin:8 + size + end] = bytes(end - begin)
    (dst / "adapter_model.safetensors").write_bytes(bytes(data))
    return str(dst.resolve())


def _is_adapter(path: str) -> bool:
    return (Path(path) / "adapter_config.json").is_file()


def _finish(value: Any) -> FinishReason | None:
    if value is None:
        return None
    if value == "stop":
        return "stop"
    if value == "length":
        return "length"
    if value == "abort":
        raise BackendAborted("the backend aborted the request")
    raise MalformedResponse(f"unknown finish_reason {value!r}")


__all__ = ["VLLMEngine"]
