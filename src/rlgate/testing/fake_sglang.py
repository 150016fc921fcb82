"""A fake SGLang server for tests (``python -m rlgate.testing.fake_sglang --model DIR --port P``).

It implements the parts of SGLang's HTTP API that rlgate uses, with SGLang's field names,
SSE framing and error bodies (SGLang 0.5.x, ``python/sglang/srt/entrypoints/http_server.py``,
``managers/io_struct.py``, ``managers/tokenizer_manager.py`` on main; see
``docs/remote-engines.md``), backed by an rlgate engine: a ``LocalEngine`` on the model
(real tokens and logprobs), or a ``FakeEngine`` with ``--zero-latency``.

Routes: ``POST /generate`` (``input_ids`` only, streaming or not), ``GET /health`` and
``/health_generate``, ``GET /model_info`` (+ deprecated ``/get_model_info``),
``GET /server_info`` (+ ``/get_server_info``), ``GET /v1/models``, ``GET /weight_version``
(+ ``/get_weight_version``), ``POST /update_weights_from_disk``, ``POST /pause_generation``,
``POST /continue_generation``, ``/flush_cache``, ``POST /abort_request``; the LoRA routes
``POST /load_lora_adapter`` and ``POST /unload_lora_adapter`` (``--enable-lora``; ``/generate`` names an
adapter in ``lora_path``: testing/fake_lora.py); plus the test-only ``/_fake/*`` routes
(``testing/fake_backend.py``).

Logprobs are the engine's: ``log_softmax(logits / T)`` like SGLang's default;
``--return-original-logprob`` emulates ``SGLANG_RETURN_ORIGINAL_LOGPROB=1`` (``log_softmax(logits)``,
recomputed with a teacher-forced pass; LocalEngine only). Streaming events are cumulative
like SGLang's default, or incremental with ``--incremental-streaming-output``. A non-streamed
``/generate`` with ``return_logprob`` and ``logprob_start_len`` >= 0 also reports
``input_token_logprobs`` from that position (teacher-forced ``log_softmax(logits)``, None for the
first token; LocalEngine only): what rlgate's weight check reads.

Not emulated: text prompts, batches, ``n > 1``, top logprobs, sessions (``/open_session``),
the one-second sleep of SGLang's health check.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from rlgate.engine.base import EngineError, GenerateRequest, SamplingParams
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

FAKE_VERSION = "0.5.x (rlgate fake)"


def _error(message: str, status: int = 400) -> JSONResponse:
    """SGLang's ``_create_error_response`` shape."""
    return JSONResponse({"error": {"message": message}}, status_code=status)


def create_app(engine: Any, *, tokenizer: Any = None, model_path: str, model_name: str | None = None,
               max_model_len: int | None = None, weight_version: str = "default",
               incremental_streaming_output: bool = False, chunk_delay: float = 0.0,
               return_original_logprob: bool = False) -> FastAPI:
    """A fake SGLang server serving ``engine`` (any rlgate Engine)."""
    fb = FakeBackend(engine, tokenizer=tokenizer, model_path=model_path,
                     model_name=model_name or Path(model_path).name,
                     max_model_len=max_model_len or engine.max_context_length, weight_version=weight_version,
                     chunk_delay=chunk_delay, raw_logprobs=return_original_logprob)
    incremental = incremental_streaming_output
    loras = FakeLoras(engine)
    quiet_injected_resets()

    app = engine_app("fake SGLang (rlgate tests)", engine, fb)

    # -------------------------------------------------------------- info

    @app.get("/health")
    @app.get("/health_generate")
    async def health() -> Response:
        return Response(status_code=200 if fb.healthy else 503)

    def model_info() -> dict[str, Any]:
        return {"model_path": fb.model_path, "tokenizer_path": fb.launch_path, "is_generation": True,
                "preferred_sampling_params": None, "weight_version": fb.label,
                "has_image_understanding": False, "has_audio_understanding": False}

    app.add_api_route("/model_info", model_info, methods=["GET"])
    app.add_api_route("/get_model_info", model_info, methods=["GET"])

    def weight_version_route() -> dict[str, Any]:
        return {"weight_version": fb.label}

    app.add_api_route("/weight_version", weight_version_route, methods=["GET"])
    app.add_api_route("/get_weight_version", weight_version_route, methods=["GET"])

    def server_info() -> dict[str, Any]:
        return {"model_path": fb.model_path, "context_length": fb.max_model_len,
                "max_req_input_len": fb.max_model_len - 1, "incremental_streaming_output": incremental,
                "weight_version": fb.label, "internal_states": [], "version": FAKE_VERSION}

    app.add_api_route("/server_info", server_info, methods=["GET"])
    app.add_api_route("/get_server_info", server_info, methods=["GET"])

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {"id": fb.model_name, "object": "model", "created": int(fb.started), "owned_by": "sglang",
                "root": fb.model_name, "parent": None, "max_model_len": fb.max_model_len}
        return {"object": "list", "data": [card, *loras.cards(fb.model_name, "sglang")]}

    @app.post("/load_lora_adapter")
    async def load_lora_adapter(request: Request) -> JSONResponse:
        body = await request.json()
        body = body if isinstance(body, dict) else {}
        error = await loras.load(body.get("lora_name"), body.get("lora_path"), replace=False)
        return JSONResponse({"success": error is None, "error_message": error or "",
                             "loaded_adapters": dict(loras.paths)}, status_code=200 if error is None else 400)

    @app.post("/unload_lora_adapter")
    async def unload_lora_adapter(request: Request) -> JSONResponse:
        body = await request.json()
        error = await loras.unload(body.get("lora_name") if isinstance(body, dict) else None)
        return JSONResponse({"success": error is None, "error_message": error or "",
                             "loaded_adapters": dict(loras.paths)}, status_code=200 if error is None else 400)

    # -------------------------------------------------------------- generate

    @app.api_route("/generate", methods=["POST", "PUT"])
    async def generate(request: Request) -> Response:
        try:
            body = await request.json()
        except ValueError as exc:
            return _error(f"JSON decode error: {exc}")
        if not isinstance(body, dict):
            return _error("the request body must be a JSON object")
        ids = body.get("input_ids")
        if ids is None:
            return _error("Either text, input_ids or input_embeds should be provided.")
        if not isinstance(ids, list) or not ids or any(type(t) is not int for t in ids):
            return _error("fake SGLang: input_ids must be one non-empty list of token ids (no batches)")
        if len(ids) >= fb.max_model_len:
            return _error(f"The input ({len(ids)} tokens) is longer than the model's context length "
                          f"({fb.max_model_len} tokens).")
        adapter = body.get("lora_path")
        if adapter is not None and adapter not in loras.paths:
            return _error(f"LoRA adapter {adapter!r} is not loaded; loaded: {sorted(loras.paths)}")
        sp = body.get("sampling_params") or {}
        try:
            top_k = int(sp.get("top_k", -1))
            sampling = SamplingParams(
                max_new_tokens=int(sp.get("max_new_tokens", 128)),
                temperature=float(sp.get("temperature", 1.0)),
                top_p=float(sp.get("top_p", 1.0)),
                top_k=0 if top_k in (-1, 1 << 30) else top_k,
                stop_token_ids=tuple(int(t) for t in sp.get("stop_token_ids") or ()),
                seed=sp.get("sampling_seed"),
            )
        except (TypeError, ValueError) as exc:
            return _error(str(exc))
        rid = body.get("rid") or new_id()
        stream = bool(body.get("stream", False))
        want_logprobs = bool(body.get("return_logprob", False))
        fb.record(request, request_id=rid, n_input=len(ids), stream=stream)
        req = GenerateRequest(list(ids), sampling, request_id=rid, adapter=adapter)
        fault = fb.take_fault()
        if fault is not None and fault.name in ("http_500", "http_503"):
            return _error("fake SGLang: injected failure", 500 if fault.name == "http_500" else 503)
        if not stream:
            out: list[int] = []
            lps: list[float] = []
            last: Event | None = None
            try:
                async for ev in fb.events(req):
                    out += ev.ids
                    lps += ev.logprobs
                    last = ev
            except EngineError as exc:
                return _error(exc.message, 400 if exc.status == 400 else 500)
            meta = _meta(rid, ids, out, lps, last, want_logprobs, sampling)
            start = body.get("logprob_start_len")
            if want_logprobs and isinstance(start, int) and 0 <= start < len(ids):  # input logprobs from `start`
                try:
                    values = await fb.score(ids)
                except EngineError as exc:
                    return _error(exc.message, 500)
                meta["input_token_logprobs"] = [[None if i == 0 else values[i - 1], t, None]
                                                for i, t in enumerate(ids) if i >= start]
            return JSONResponse({"text": fb.decode(out), "output_ids": out, "meta_info": meta})
        return streaming(_stream(fb, req, ids, rid, want_logprobs, incremental, fault))

    # -------------------------------------------------------------- weights

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(request: Request) -> JSONResponse:
        body = await request.json()
        if not isinstance(body, dict) or not isinstance(body.get("model_path"), str):
            return JSONResponse({"object": "error", "message": "model_path: Field required", "type": "Bad Request",
                                 "param": None, "code": 400}, status_code=400)
        ok, message = await fb.load(body["model_path"], body.get("weight_version"))
        if ok and body.get("weight_version") is not None:
            message += f" Weight version updated to {body['weight_version']}."
        return JSONResponse({"success": ok, "message": message, "num_paused_requests": 0},
                            status_code=200 if ok else 400)

    @app.post("/pause_generation")
    async def pause_generation(request: Request) -> JSONResponse:
        raw = await request.body()
        mode = "abort"
        if raw:
            with contextlib.suppress(ValueError, AttributeError):
                mode = (await request.json()).get("mode", "abort")
        if mode not in ("abort", "retract", "in_place"):
            return JSONResponse({"object": "error", "message": f"Invalid mode: {mode!r}. Expected one of "
                                 "['abort', 'retract', 'in_place'].", "type": "Bad Request", "param": None,
                                 "code": 400}, status_code=400)
        await fb.pause(mode)
        return JSONResponse({"message": "Generation paused successfully.", "status": "ok"})

    @app.post("/continue_generation")
    async def continue_generation() -> JSONResponse:
        fb.resume()
        return JSONResponse({"message": "Generation continued successfully.", "status": "ok"})

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> PlainTextResponse:
        return PlainTextResponse("Cache flushed.\nPlease check backend logs for more details. (When there are "
                                 "running or waiting requests, the operation will not be performed.)\n")

    @app.post("/abort_request")
    async def abort_request(request: Request) -> Response:
        body = await request.json()
        if body.get("abort_all"):
            fb.abort_epoch += 1
        return Response(status_code=200)

    fb.install_routes(app)
    return app


def _finish_obj(ev: Event | None, out: list[int], sampling: SamplingParams) -> dict[str, Any] | None:
    if ev is None or ev.finish is None:
        return None
    if ev.finish == "stop":
        return {"type": "stop", "matched": out[-1] if out else None}
    if ev.finish == "length":
        return {"type": "length", "length": sampling.max_new_tokens}
    return {"type": "abort", "message": "Abort in waiting queue", "status_code": None, "err_type": None}


def _meta(rid: str, ids: list[int], out: list[int], lps: list[float], ev: Event | None, want_logprobs: bool,
          sampling: SamplingParams, offset: int = 0) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": _finish_obj(ev, out, sampling),
        "prompt_tokens": len(ids),
        "weight_version": ev.label if ev is not None else None,
        "completion_tokens": len(out),
        "cached_tokens": 0,
    }
    if want_logprobs:
        meta["input_token_logprobs"] = [[None, ids[-1], None]] if offset == 0 else []
        meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(lps[offset:], out[offset:], strict=True)]
    return meta


async def _stream(fb: FakeBackend, req: GenerateRequest, ids: list[int], rid: str, want_logprobs: bool,
                  incremental: bool, fault: Any) -> AsyncIterator[bytes]:
    out: list[int] = []
    lps: list[float] = []
    sent = 0
    text = ""
    try:
        async for ev in fb.events(req):
            offset = len(out)
            out += ev.ids
            lps += ev.logprobs
            delta_text = fb.decode(ev.ids) or ""
            text += delta_text
            if incremental:
                obj = {"text": delta_text, "output_ids": list(ev.ids),
                       "meta_info": _meta(rid, ids, out, lps, ev, want_logprobs, req.sampling, offset)}
            else:
                obj = {"text": text, "output_ids": list(out),
                       "meta_info": _meta(rid, ids, out, lps, ev, want_logprobs, req.sampling)}
            if fault is not None and sent >= fault.after:
                done = _apply_fault(fault.name, obj)
                if isinstance(done, bytes):
                    yield done
                    return
                if fault.name == "truncate":
                    return
                if fault.name == "reset":
                    raise InjectedReset("fake SGLang: connection reset on purpose")
                if fault.name == "stall":
                    await asyncio.sleep(3600)
                yield sse(obj)
                if fault.name in ("missing_logprobs", "wrong_lengths", "wrong_token_ids", "finish_abort"):
                    yield SSE_DONE
                    return
                continue
            yield sse(obj)
            sent += 1
    except EngineError as exc:
        yield sse({"error": {"message": exc.message}})
    yield SSE_DONE


def _apply_fault(name: str, obj: dict[str, Any]) -> bytes | None:
    meta = obj["meta_info"]
    entries = meta.get("output_token_logprobs")
    if name == "non_json":
        return b"data: {this is not json\n\n"
    if name == "stream_error":
        return sse({"error": {"message": "fake SGLang: injected error in the stream"}}) + SSE_DONE
    if name == "missing_logprobs":
        meta.pop("output_token_logprobs", None)
    elif name == "wrong_lengths" and entries is not None:
        meta["output_token_logprobs"] = entries[:-1] if entries else [[-1.0, 0, None]]
    elif name == "wrong_token_ids" and entries:
        entries[-1] = [entries[-1][0], entries[-1][1] + 1, None]
    elif name == "finish_abort":
        meta["finish_reason"] = {"type": "abort", "message": "fake SGLang: request aborted", "status_code": 503,
                                 "err_type": None}
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rlgate.testing.fake_sglang", description=__doc__.split("\n")[0])
    add_common_args(p)
    p.add_argument("--weight-version", default="default", help="initial weight_version label")
    p.add_argument("--incremental-streaming-output", action="store_true",
                   help="stream only new tokens per event (SGLang's --incremental-streaming-output)")
    p.add_argument("--return-original-logprob", action="store_true",
                   help="report log_softmax(logits) (SGLang's SGLANG_RETURN_ORIGINAL_LOGPROB=1)")
    args = p.parse_args(argv)
    engine, tokenizer, ctx = build_engine(args.model, zero_latency=args.zero_latency,
                                          output_tokens=args.output_tokens, device=args.device,
                                          max_batch_size=args.max_batch_size)
    app = create_app(engine, tokenizer=tokenizer, model_path=str(Path(args.model).resolve()),
                     model_name=args.served_model_name, max_model_len=ctx, weight_version=args.weight_version,
                     incremental_streaming_output=args.incremental_streaming_output, chunk_delay=args.chunk_delay,
                     return_original_logprob=args.return_original_logprob)
    app.state.fake.fail_weight_updates = args.fail_weight_updates
    print(f"fake SGLang serving {args.model} on http://{args.host}:{args.port} "
          f"({'zero-latency' if args.zero_latency else 'LocalEngine'}) at {time.strftime('%H:%M:%S')}", flush=True)
    run_server(app, args.host, args.port, args.log_level)
    return 0


if __name__ == "__main__":
    sys.exit(main())
