"""One check of a weight update's checkpoint directory, made by every engine (issue 23, finding 8).

Before, ``POST /rl/update_weights {"path": "/"}`` answered 200 (version + 1) on the fake engine and
on the remote engines in front of fake backends, and 400 on the local engine. Now every engine
calls ``engine/weights_path.checkpoint_dir`` first: the same refusal (400 ``weight_update_failed``,
same message) whichever engine serves, and the version does not move."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

from helpers import admin_headers, dummy_checkpoint
from remote_helpers import serve_remotely
from rlgate.engine.base import WeightUpdateError
from rlgate.engine.fake import FakeEngine
from rlgate.engine.weights_path import checkpoint_dir


def _bad_paths(tmp_path: Path) -> dict[str, str]:
    """Paths no engine may load, and what the refusal says."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("x")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "pytorch_model.bin").write_bytes(b"x")
    escape = Path(dummy_checkpoint(tmp_path / "escape"))
    (escape / "model.safetensors").unlink()
    (escape / "model.safetensors").symlink_to(Path(dummy_checkpoint(tmp_path / "elsewhere")) / "model.safetensors")
    fifo = Path(dummy_checkpoint(tmp_path / "fifo"))
    os.mkfifo(fifo / "shard-2.safetensors")  # reading it would block forever
    subdir = Path(dummy_checkpoint(tmp_path / "subdir"))
    (subdir / "extra.safetensors").mkdir()
    return {
        "/": "no \\*\\.safetensors files in '/'",
        "": "non-empty",
        "relative/ckpt": "not absolute",
        str(tmp_path / "missing"): "not found",
        str(tmp_path / "file"): "not a directory",
        str(tmp_path / "empty"): "no \\*\\.safetensors files",
        str(tmp_path / "bin"): "no \\*\\.safetensors files",
        str(escape): "outside the checkpoint directory",
        str(fifo): "not a regular file",
        str(subdir): "not a regular file",
        str(tmp_path) + "/nul\x00byte": "control characters",
        "/" + "x" * 5000: "too long",
    }


def test_checkpoint_dir_refuses_what_is_not_a_checkpoint(tmp_path):
    for path, message in _bad_paths(tmp_path).items():
        with pytest.raises(WeightUpdateError, match=message) as err:
            checkpoint_dir(path)
        assert err.value.status == 400 and err.value.code == "weight_update_failed", path


def test_checkpoint_dir_accepts_symlinked_directories_and_shards_inside(tmp_path):
    real = Path(dummy_checkpoint(tmp_path / "sync-000042"))
    (real / "parts").mkdir()
    (real / "parts" / "b.safetensors").write_bytes((real / "model.safetensors").read_bytes())
    (real / "z.safetensors").symlink_to(real / "parts" / "b.safetensors")  # inside the directory: fine
    (tmp_path / "latest").symlink_to(real)
    ckpt = checkpoint_dir(str(tmp_path / "latest"))
    assert ckpt.directory == real.resolve()
    assert [f.name for f in ckpt.files] == ["model.safetensors", "b.safetensors"]
    assert checkpoint_dir(tmp_path / "latest").files == ckpt.files  # a PathLike works too


async def test_every_engine_refuses_the_same_paths_the_same_way(make_app, asgi_client, tokenizer, tiny_model_dir,
                                                                 tmp_path):
    from rlgate.engine.local import LocalEngine

    bad = [p for p in _bad_paths(tmp_path) if p]  # "" is refused by the route's schema (422), before any engine
    local = LocalEngine(tiny_model_dir, device="cpu")
    answers: dict[str, list[tuple[int, str, str]]] = {}
    try:
        with contextlib.ExitStack() as backends:
            engines = {
                "fake": FakeEngine(tokenizer),
                "local": local,
                "sglang": serve_remotely(backends, "sglang", FakeEngine(tokenizer), tokenizer, tiny_model_dir),
                "vllm": serve_remotely(backends, "vllm", FakeEngine(tokenizer), tokenizer, tiny_model_dir),
            }
            for name, engine in engines.items():
                async with asgi_client(make_app(engine)) as c:
                    answers[name] = []
                    for path in bad:
                        r = await c.post("/rl/update_weights", json={"path": path}, headers=admin_headers())
                        err = r.json()["error"]
                        assert err["param"] == "path" and err["type"] == "invalid_request_error", (name, path)
                        answers[name].append((r.status_code, err["code"], err["message"]))
                    assert (await c.get("/health")).json()["version"] == 0, name
                    # a real checkpoint still loads (the local engine reads it: the tiny model's own weights)
                    good = str(tiny_model_dir) if name == "local" else dummy_checkpoint(tmp_path / f"good-{name}")
                    r = await c.post("/rl/update_weights", json={"path": good}, headers=admin_headers())
                    assert r.status_code == 200 and r.json()["version"] == 1, (name, r.text)
    finally:
        await local.close()
    root = answers["fake"][bad.index("/")]
    assert root == (400, "weight_update_failed", "no *.safetensors files in '/'")
    for name in ("local", "sglang", "vllm"):
        assert answers[name] == answers["fake"], name
    assert all(status == 400 and code == "weight_update_failed" for status, code, _ in answers["fake"])
