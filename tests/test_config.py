"""Configuration: command-line flags generated from the configuration dataclasses."""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
from dataclasses import dataclass
from typing import Literal

import pytest

from rlgate.cli import ServeOptions, add_serve_args
from rlgate.config import GatewayConfig, add_arguments, from_arguments, option
from rlgate.engine.options import EngineOptions
from rlgate.engine.remote.options import RemoteOptions
from rlgate.store import StoreOptions

CONFIG_CLASSES = [ServeOptions, GatewayConfig, EngineOptions, RemoteOptions, StoreOptions]


def serve_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_serve_args(p)
    return p


def test_no_flag_given_means_every_default(monkeypatch):
    monkeypatch.delenv("RLGATE_STORE", raising=False)
    args = serve_parser().parse_args(["--model", "m"])
    assert from_arguments(GatewayConfig, args, admin_key="k", model_name="rlgate") == GatewayConfig(admin_key="k")
    for cls in (EngineOptions, RemoteOptions, StoreOptions):
        assert from_arguments(cls, args) == cls()


def test_every_field_with_help_is_a_flag_with_its_default_in_help():
    p = serve_parser()
    flags = {a.dest: a for a in p._actions}
    for cls in CONFIG_CLASSES:
        for f in dataclasses.fields(cls):
            if not f.metadata.get("help"):
                # admin_key has its own flag (ServeOptions); image_placeholder only documents what
                # text-only templates render for an image (nothing reads it as a setting)
                assert f.name in ("admin_key", "image_placeholder") and cls is GatewayConfig
                continue
            action = flags[f.name]
            assert action.help.startswith(f.metadata["help"].replace("%", "%%")[:20])
            if f.default is not dataclasses.MISSING and "cli_default" not in f.metadata and f.default is not None:
                shown = ("on" if f.default else "off") if isinstance(f.default, bool) else str(f.default)
                assert f"(default: {shown})" in action.help or f"else {shown})" in action.help, f.name


def test_a_new_field_with_help_is_enough_for_a_flag():
    @dataclass
    class Knobs:
        count: int = option(3, "how many")
        ratio: float | None = option(None, "a ratio")
        mode: Literal["fast", "safe"] = option("safe", "how")
        verbose: bool = option(False, "say more")
        names: list[str] = option(help="a name (repeat)", factory=list, flag="--name")
        internal: int = 7  # no help: no flag

    p = argparse.ArgumentParser()
    add_arguments(p, Knobs)
    assert from_arguments(Knobs, p.parse_args([])) == Knobs()
    got = from_arguments(Knobs, p.parse_args(["--count", "5", "--ratio", "0.5", "--mode", "FAST", "--verbose",
                                               "--name", "a", "--name", "b"]))
    assert got == Knobs(count=5, ratio=0.5, mode="fast", verbose=True, names=["a", "b"])
    assert from_arguments(Knobs, p.parse_args(["--ratio", "none"])).ratio is None
    with pytest.raises(SystemExit):
        p.parse_args(["--internal", "1"])
    with pytest.raises(SystemExit):
        p.parse_args(["--mode", "reckless"])
    with pytest.raises(SystemExit):
        p.parse_args(["--count", "many"])
    assert "(default: 3)" in p.format_help() and "(default: safe)" in p.format_help()


def test_flags_reach_the_config():
    args = serve_parser().parse_args([
        "--model", "m", "--tool-parser", "none", "--max-tokens-cap", "9", "--cors-origin", "http://a",
        "--cors-origin", "http://b", "--stop-token-id", "5", "--engine", "sglang", "--backend-url", "http://x:1",
        "--failover", "move", "--strict-logprobs", "--store-sync", "normal",
    ])
    config = from_arguments(GatewayConfig, args, admin_key="k")
    assert config.tool_parser is None and config.max_tokens_cap == 9
    assert config.cors_origins == ["http://a", "http://b"] and config.stop_token_ids == [5]
    remote = from_arguments(RemoteOptions, args)
    assert remote.backend_url == ["http://x:1"] and remote.failover == "move" and remote.strict_logprobs
    assert from_arguments(StoreOptions, args).store_sync == "normal"


def test_engines_take_their_defaults_from_the_options():
    """The library's defaults are the command line's: written once."""
    import inspect

    from rlgate.engine.fake import FakeEngine
    from rlgate.engine.remote import RemoteEngine, SGLangEngine, VLLMEngine

    remote = inspect.signature(RemoteEngine.__init__).parameters
    assert remote["failover"].default == RemoteOptions.failover
    assert remote["health_interval"].default == RemoteOptions.health_interval
    assert remote["read_timeout"].default == RemoteOptions.backend_timeout
    assert remote["max_connections"].default == RemoteOptions.backend_max_connections
    assert inspect.signature(SGLangEngine.__init__).parameters["pause_mode"].default == RemoteOptions.sglang_pause_mode
    assert inspect.signature(VLLMEngine.__init__).parameters["pause_mode"].default == RemoteOptions.vllm_pause_mode
    assert inspect.signature(FakeEngine.__init__).parameters["output_tokens"].default == EngineOptions.fake_output_tokens


def test_serve_help_lists_every_flag_with_its_default():
    out = subprocess.run([sys.executable, "-m", "rlgate.cli", "serve", "--help"], capture_output=True, text=True,
                         check=True).stdout
    for needle in ("--max-sessions N", "(default: 10000)", "--backend-url URL", "--store-sync {full,normal}",
                   "(default: full)", "--engine {local,fake,sglang,vllm}"):
        assert needle in out
