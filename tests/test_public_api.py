"""The public surface of ``rlgate``: complete, documented, and light to import."""

from __future__ import annotations

import importlib
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

import rlgate


@pytest.mark.torch  # the GRPO trainer imports torch
def test_every_public_name_resolves_and_is_documented():
    names = [n for n in rlgate.__all__ if n != "__version__"]
    for name in names:
        obj = getattr(rlgate, name)
        assert getattr(obj, "__name__", name) == name, name
    documented = set(re.findall(r"\b[A-Za-z_]\w+\b", rlgate.__doc__.split("::", 1)[1].split("Public modules", 1)[0]))
    assert set(names) <= documented, set(names) - documented
    # and nothing documented is missing from __all__ (capitalised words in the table are names)
    public_words = {w for w in documented if w[0].isupper() and w not in ("Gateway", "Trajectories", "Rollout",
                                                                         "Training", "GRPO", "Names", "FastAPI")}
    assert public_words <= set(names) | {"Agent"}, public_words - set(names)
    assert sorted(dir(rlgate)) == sorted(rlgate.__all__)


@pytest.mark.torch  # the GRPO trainer imports torch
def test_the_training_api_is_importable_from_the_top():
    from rlgate import GRPOTrainer, RolloutRunner, Sample, TrainConfig, grpo_loop, run_training  # noqa: F401

    assert TrainConfig.model_fields["rollout"].default_factory is not None


@pytest.mark.torch  # the GRPO trainer imports torch
def test_every_public_module_is_reexported():
    """Each public class of the training API modules is in ``rlgate.__all__``."""
    import inspect

    import rlgate.rollout.runner
    import rlgate.train.config
    import rlgate.train.run

    for mod, skip in ((rlgate.rollout.runner, {"RolloutCounters", "GatewayClient", "GatewayClientError",
                                               "AgentError", "RunError", "TooManyFailures", "FinishedEpisode",
                                               "Sample"}),
                      (rlgate.train.config, {"DatasetSource", "RolloutSettings", "GatewaySettings",
                                             "TrackingSettings", "RaySettings", "TrainerSettings", "MetricsSettings",
                                             "ModelSettings", "LoraSettings", "WarmStartSettings",
                                             "RunError"}),
                      (rlgate.train.run, {"Prepared", "Outcome", "Terminated", "Trackers", "ConfigError", "TrainConfig",
                                          "RunError"})):
        public = {n for n, o in vars(mod).items() if inspect.isclass(o) and not n.startswith("_")
                  and o.__module__ == mod.__name__}
        assert public - skip <= set(rlgate.__all__), (mod.__name__, public - skip - set(rlgate.__all__))


def test_import_rlgate_pulls_neither_torch_nor_fastapi():
    code = "import sys, rlgate; rlgate.Sample; rlgate.TrainConfig; print('torch' in sys.modules, 'fastapi' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


# ``from rlgate.X import a, b`` (also parenthesised over lines), and "rlgate.X:name" (an agent or task named
# by its import path)
_FROM = re.compile(r"^\s*from (rlgate(?:\.\w+)*) import (\([^)]*\)|[^\n]*)", re.MULTILINE)
_PATH = re.compile(r"[\"'`](rlgate(?:\.\w+)+):(\w+)")


def _taught() -> dict[str, set[str]]:
    """module -> the names the docs, the README and the examples import from it."""
    root = Path(rlgate.__file__).resolve().parents[2]
    texts = [p.read_text() for p in [root / "README.md", *(root / "docs").glob("*.md"), *(root / "examples").glob("*.py")]]
    taught: dict[str, set[str]] = {}
    for text in texts:
        for module, names in _FROM.findall(text):
            names = names.split("#")[0].strip("() \n")
            taught.setdefault(module, set()).update(n.split(" as ")[0].strip() for n in names.split(",") if n.strip())
        for module, name in _PATH.findall(text):
            taught.setdefault(module, set()).add(name)
    return taught


def test_what_the_docs_teach_is_public():
    """Every module the docs and examples import from is ``rlgate`` or in ``PUBLIC_MODULES``, and every
    name they import is in that module's ``__all__``: the public list is complete."""
    taught = _taught()
    assert {"rlgate.trajectory.export", "rlgate.cluster", "rlgate.agents"} <= set(taught)  # the parser finds them
    for module, names in sorted(taught.items()):
        assert module == "rlgate" or module in rlgate.PUBLIC_MODULES, f"the docs import from internal {module}"
        exported = set(importlib.import_module(module).__all__)
        assert names <= exported, f"{module}: {sorted(names - exported)} taught but not in its __all__"


def test_every_public_module_declares_what_it_exports():
    """Each public module has an ``__all__`` whose names resolve (a name that needs torch may say so)."""
    torch_missing = importlib.util.find_spec("torch") is None
    for module in rlgate.PUBLIC_MODULES:
        mod = importlib.import_module(module)
        assert mod.__all__ and len(set(mod.__all__)) == len(mod.__all__), module
        for name in mod.__all__:
            try:
                getattr(mod, name)
            except ImportError as exc:
                assert torch_missing and "torch" in str(exc), (module, name, exc)


def test_create_app_is_public_with_the_types_it_takes():
    import inspect

    params = inspect.signature(rlgate.create_app).parameters
    assert "Engine" in str(params["engine"].annotation) and "Store" in str(params["store"].annotation)
    assert {"create_app", "Engine", "Store", "open_store", "GatewayConfig"} <= set(rlgate.__all__)
