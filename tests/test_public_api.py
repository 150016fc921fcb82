"""The public surface of ``rlgate``: complete, documented, and light to import."""

from __future__ import annotations

import re
import subprocess
import sys

import rlgate


def test_every_public_name_resolves_and_is_documented():
    names = [n for n in rlgate.__all__ if n != "__version__"]
    for name in names:
        obj = getattr(rlgate, name)
        assert getattr(obj, "__name__", name) == name, name
    documented = set(re.findall(r"\b[A-Za-z_]\w+\b", rlgate.__doc__.split("::", 1)[1].split("Names are", 1)[0]))
    assert set(names) <= documented, set(names) - documented
    # and nothing documented is missing from __all__ (capitalised words in the table are names)
    public_words = {w for w in documented if w[0].isupper() and w not in ("Gateway", "Trajectories", "Rollout",
                                                                         "Training", "GRPO", "Names", "FastAPI")}
    assert public_words <= set(names) | {"Agent"}, public_words - set(names)
    assert sorted(dir(rlgate)) == sorted(rlgate.__all__)


def test_the_training_api_is_importable_from_the_top():
    from rlgate import GRPOTrainer, RolloutRunner, Sample, TrainConfig, grpo_loop, run_training  # noqa: F401

    assert TrainConfig.model_fields["rollout"].default_factory is not None


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
                                             "RunError"}),
                      (rlgate.train.run, {"Prepared", "Outcome", "Trackers", "ConfigError", "TrainConfig", "RunError"})):
        public = {n for n, o in vars(mod).items() if inspect.isclass(o) and not n.startswith("_")
                  and o.__module__ == mod.__name__}
        assert public - skip <= set(rlgate.__all__), (mod.__name__, public - skip - set(rlgate.__all__))


def test_import_rlgate_pulls_neither_torch_nor_fastapi():
    code = "import sys, rlgate; rlgate.Sample; rlgate.TrainConfig; print('torch' in sys.modules, 'fastapi' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
