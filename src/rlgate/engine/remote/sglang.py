"""SGLang servers as the engine, through SGLang's native ``/generate`` (token ids in and out).

SGLang's OpenAI-compatible routes return text, not token ids, so they are never used.
Wire format followed (SGLang 0.5.x, ``python/sglang/srt/entrypoints/http_server.py`` and
``managers/io_struct.py`` on main; see ``docs/remote-engines.md`` for the exact sources):

Request ``POST /generate``::

    {"input_ids": [...], "rid": "<interaction id>", "return_logprob": true, "stream": true,
     "sampling_params": {"max_new_tokens", "temperature", "top_p", "top_k" (-1: off),
                         "stop_token_ids", "skip_special_tokens": false, "no_stop_trim": true,
                         "sampling_seed" (only when the request has a seed)}}

Response: server-sent events ``data: {...}`` ending with ``data: [DONE]``; each event is
``{"text", "output_ids", "meta_info": {"id", "finish_reason", "prompt_tokens",
"completion_tokens", "weight_version", "output_token_logprobs": [[logprob, token_id,
text|null], ...], ...}}``. By default every event repeats the whole output so far
(``output_ids`` and ``output_token_logprobs`` are cumulative); with
``--incremental-streaming-output`` they hold only the new tokens. The engine accepts both
and tells them apart per event with ``meta_info.completion_tokens``. ``finish_reason`` is
``null`` or ``{"type": "stop", "matched": id}`` / ``{"type": "length", "length": n}`` /
``{"type": "abort", "message": ...}``. Errors before streaming: HTTP 400
``{"error": {"message": ...}}``; during streaming: an event ``{"error": {"message": ...}}``.

Logprobs: SGLang's sampler reports ``log_softmax(logits / T)`` at the sampled token,
computed before top-k / top-p truncation: exactly ``engine/base.py``'s distribution.
Servers started with ``SGLANG_RETURN_ORIGINAL_LOGPROB=1`` report ``log_softmax(logits)``
instead (T = 1); tell the engine with ``return_original_logprob=True``
(``rlgate serve --sglang-return-original-logprob``).

Seeds: ``sampling_params.sampling_seed``. SGLang honours it only when launched with
``--enable-deterministic-inference``; otherwise the field is accepted and ignored.

Weights: ``POST /pause_generation {"mode": "retract"}`` (running requests go back to the
queue and keep their tokens; their KV cache is recomputed with the new weights),
``POST /update_weights_from_disk {"model_path", "weight_version"}`` (answers
``{"success", "message", "num_paused_requests"}``; on failure SGLang keeps its previous
weights), then ``GET /model_info`` to check that the server reports the new
``weight_version``, and ``POST /continue_generation``. Every event carries the
``weight_version`` label of the weights that produced it.
"""

from __future__ import annotations

import logging
from typing import Any

import httpx

from rlgate.engine.base import FinishReason, GenerateRequest
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
from rlgate.engine.remote.options import RemoteOptions, SGLangPauseMode
from rlgate.engine.remote.wire import Chunk, StreamState, as_float, as_int_list

log = logging.getLogger("rlgate.engine.sglang")



class SGLangEngine(RemoteEngine):
    kind = "sglang"
    reports_labels = True
    generate_path = "/generate"
    health_path = "/health"

    def __init__(self, backend_urls: Any, *, pause_mode: SGLangPauseMode = RemoteOptions.sglang_pause_mode,
                 return_original_logprob: bool = RemoteOptions.sglang_return_original_logprob, **kwargs: Any) -> None:
        super().__init__(backend_urls, **kwargs)
        if pause_mode not in ("retract", "in_place", "abort"):
            raise ValueError("pause_mode must be retract, in_place or abort")
        self.pause_mode = pause_mode
        self.logprobs_mode = "raw" if return_original_logprob else "scaled"

    # ------------------------------------------------------------------ info

    async def _model_info(self, b: Backend) -> dict[str, Any]:
        """``/model_info`` (current) or ``/get_model_info`` (older servers, deprecated alias)."""
        try:
            info = await self.pool.get_json(b, "/model_info", timeout=PROBE_TIMEOUT)
        except BackendRejected as exc:
            if exc.status != 404:
                raise
            info = await self.pool.get_json(b, "/get_model_info", timeout=PROBE_TIMEOUT)
        if not isinstance(info, dict):
            raise MalformedResponse(f"model info is not an object: {str(info)[:200]}")
        return info

    async def probe_backend(self, b: Backend) -> None:
        info = await self._model_info(b)
        b.model_path = b.model_path or info.get("model_path")  # what it was serving when first seen
        label = info.get("weight_version")
        b.label = None if label is None else str(label)
        if b.label is not None and not b.labels:
            b.labels[b.label] = 0  # whatever it was launched with is what the gateway calls version 0
        models = await self.pool.get_json(b, "/v1/models", timeout=PROBE_TIMEOUT)
        data = models.get("data") if isinstance(models, dict) else None
        if isinstance(data, list) and data and isinstance(data[0], dict):
            mml = data[0].get("max_model_len")
            if isinstance(mml, int) and mml > 0:
                b.max_model_len = mml
        try:
            server = await self.pool.get_json(b, "/server_info", timeout=PROBE_TIMEOUT)
        except (BackendRejected, MalformedResponse, httpx.HTTPError):
            server = None
        if isinstance(server, dict):
            flag = server.get("incremental_streaming_output", server.get("stream_output"))
            if isinstance(flag, bool):
                b.info["incremental"] = flag

    async def current_label(self, b: Backend) -> str | None:
        label = (await self._model_info(b)).get("weight_version")
        return None if label is None else str(label)

    # ------------------------------------------------------------------ generation

    def payload(self, b: Backend, request: GenerateRequest) -> dict[str, Any]:
        s = request.sampling
        params: dict[str, Any] = {
            "max_new_tokens": s.max_new_tokens,
            "temperature": s.temperature,
            "top_p": s.top_p,
            "top_k": s.top_k if s.top_k > 0 else -1,
            "stop_token_ids": list(s.stop_token_ids),
            "skip_special_tokens": False,
            "no_stop_trim": True,
        }
        if s.seed is not None:
            params["sampling_seed"] = s.seed % (2**63)
        body: dict[str, Any] = {
            "input_ids": list(request.input_ids),
            "sampling_params": params,
            "return_logprob": True,
            "stream": True,
        }
        if request.request_id:
            body["rid"] = request.request_id
        if request.adapter is not None:  # a LoRA adapter, by the name it was loaded as (engine/remote/adapters.py)
            body["lora_path"] = request.adapter
        return body

    # ------------------------------------------------------------------ LoRA adapters (engine/remote/adapters.py)

    async def load_lora(self, b: Backend, name: str, path: str, replace: bool) -> None:
        if replace:  # SGLang loads no adapter in place: unload, then load the new weights under the name
            await self.unload_lora(b, name)
        await self.lora_call(b, "/load_lora_adapter", {"lora_name": name, "lora_path": path})

    async def unload_lora(self, b: Backend, name: str) -> None:
        await self.lora_call(b, "/unload_lora_adapter", {"lora_name": name}, missing_ok=True)

    def parse_event(self, st: StreamState, obj: Any) -> Chunk | None:
        if not isinstance(obj, dict):
            raise MalformedResponse(f"an event is not a JSON object: {str(obj)[:200]}")
        if "error" in obj:
            raise BackendRejected(error_message(obj) or str(obj["error"])[:500])
        meta = obj.get("meta_info")
        if not isinstance(meta, dict):
            raise MalformedResponse("an event has no meta_info")
        ids = as_int_list(obj.get("output_ids"), "output_ids")
        entries = meta.get("output_token_logprobs")
        if not isinstance(entries, list):
            raise MalformedResponse("meta_info.output_token_logprobs is missing (return_logprob was requested)")
        if len(entries) != len(ids):
            raise MalformedResponse(f"{len(ids)} output_ids but {len(entries)} output_token_logprobs")
        start = self._new_from(st, ids, meta.get("completion_tokens"))
        new_ids = ids[start:]
        logprobs: list[float] = []
        for tok, entry in zip(new_ids, entries[start:], strict=True):
            if not isinstance(entry, list | tuple) or len(entry) < 2:
                raise MalformedResponse(f"an output_token_logprobs entry is not [logprob, token_id, ...]: {entry!r}")
            if entry[1] != tok:
                raise MalformedResponse(f"output_token_logprobs names token {entry[1]!r} where output_ids has {tok}")
            logprobs.append(as_float(entry[0], "an output token logprob"))
        finish = _finish(meta.get("finish_reason"))
        if not new_ids and finish is None:
            return None
        label = meta.get("weight_version")
        return Chunk(new_ids, logprobs, finish, None if label is None else str(label))

    def _new_from(self, st: StreamState, ids: list[int], done: Any) -> int:
        """Index in ``ids`` where this event's new tokens start (cumulative vs incremental events)."""
        seen = len(st.ids)
        if seen == 0:
            return 0
        if isinstance(done, int) and not isinstance(done, bool):
            if len(ids) == done:
                cumulative = True
            elif len(ids) == done - seen:
                cumulative = False
            else:
                raise MalformedResponse(f"completion_tokens={done} fits neither {len(ids)} cumulative nor "
                                        f"incremental output ids after {seen} tokens")
        else:
            cumulative = not st.backend.info.get("incremental", False)
        if not cumulative:
            return 0
        if len(ids) < seen or ids[:seen] != st.ids:
            raise MalformedResponse("a cumulative event does not start with the tokens already streamed")
        return seen

    # ------------------------------------------------------------------ weights

    async def pause_backend(self, b: Backend) -> bool:
        r = await self.pool.call(b, "POST", "/pause_generation", json_body={"mode": self.pause_mode},
                             timeout=self.update_timeout)
        if r.status_code == 404:
            log.warning("backend %s has no /pause_generation; updating its weights without a pause", b.url)
            return False
        if r.status_code != 200:
            raise BackendRejected(f"/pause_generation -> HTTP {r.status_code}: {error_text(r)}", r.status_code)
        return True

    async def resume_backend(self, b: Backend) -> None:
        r = await self.pool.call(b, "POST", "/continue_generation", json_body={}, timeout=self.update_timeout)
        if r.status_code not in (200, 404):
            raise BackendRejected(f"/continue_generation -> HTTP {r.status_code}: {error_text(r)}", r.status_code)

    async def load_weights(self, b: Backend, path: str, label: str) -> None:
        r = await self.pool.call(b, "POST", "/update_weights_from_disk",
                             json_body={"model_path": path, "weight_version": label}, timeout=self.update_timeout)
        try:
            body = r.json()
        except ValueError:
            body = None
        success = body.get("success") if isinstance(body, dict) else None
        message = (body.get("message") if isinstance(body, dict) else None) or error_text(r)
        if success is False:  # SGLang keeps (or restores) its previous weights
            raise LoadRefused(f"{b.url} refused {path}: {message}")
        if r.status_code != 200 or success is not True:
            raise BackendFailed(f"{b.url}: /update_weights_from_disk -> HTTP {r.status_code}: {message}")
        now = await self.current_label(b)
        if now != label:
            raise BackendFailed(f"{b.url} loaded {path} but reports weight_version {now!r}, not {label!r}")
        b.label = label

    async def score_backend(self, b: Backend, input_ids: list[int]) -> list[float]:
        """``input_token_logprobs`` of a one-token greedy generation from ``logprob_start_len`` 0: SGLang's
        teacher-forced ``log_softmax(logits)`` of every input token after the first."""
        body = {"input_ids": input_ids, "return_logprob": True, "logprob_start_len": 0, "stream": False,
                "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}}
        r = await self.pool.call(b, "POST", "/generate", json_body=body, timeout=self.update_timeout)
        if r.status_code != 200:
            raise BackendRejected(f"/generate (input logprobs) -> HTTP {r.status_code}: {error_text(r)}",
                                  r.status_code)
        try:
            entries = r.json()["meta_info"]["input_token_logprobs"]
        except (ValueError, KeyError, TypeError) as exc:
            raise MalformedResponse(f"no meta_info.input_token_logprobs in the answer: {r.text[:200]}") from exc
        if not isinstance(entries, list) or len(entries) != len(input_ids):
            raise MalformedResponse(f"input_token_logprobs has {len(entries) if isinstance(entries, list) else 'no'} "
                                    f"entries for {len(input_ids)} input tokens")
        out: list[float] = []
        for tok, entry in zip(input_ids[1:], entries[1:], strict=True):
            if not isinstance(entry, list | tuple) or len(entry) < 2 or entry[1] != tok:
                raise MalformedResponse(f"an input_token_logprobs entry does not name input token {tok}: {entry!r}")
            out.append(as_float(entry[0], "an input token logprob"))
        return out


def _finish(value: Any) -> FinishReason | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise MalformedResponse(f"finish_reason is not an object: {value!r}")
    kind = value.get("type")
    if kind == "stop":
        return "stop"
    if kind == "length":
        return "length"
    if kind == "abort":
        status = value.get("status_code")
        raise BackendAborted(f"the backend aborted the request: {value.get('message') or 'no reason given'}",
                             status if isinstance(status, int) else 503)
    raise MalformedResponse(f"unknown finish_reason {value!r}")


__all__ = ["SGLangEngine"]
