"""``TrainConfig``: everything ``rlgate train`` / ``check`` / ``eval`` read, validated before any work.

Read from YAML with ``--set key=value`` overrides (dotted keys, YAML values). Strict:

* an unknown key anywhere (YAML or ``--set``) is an error that names it and suggests the
  closest valid key, also across sections (``lr`` -> ``grpo.lr``) and from other
  trainers' vocabularies (``learning_rate`` -> ``grpo.lr``, ``num_generations`` ->
  ``rollout.group_size``);
* types and ranges are checked up front, all errors reported at once;
* the saved ``out_dir/config.yaml`` is the full resolved config (every default written out).
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from rlgate.config import ClusterConfig, GatewayConfig, OnlineConfig, embedded
from rlgate.engine.options import EngineOptions
from rlgate.rollout.errors import RunError
from rlgate.rollout.runner import CONCURRENCY, EPISODE_TIMEOUT_S, GROUP_SIZE, MAX_CONSECUTIVE_FAILURES
from rlgate.trajectory.export import DEFAULT_EXPORT_STYLE, NO_DISCOUNT, PAD_TOKEN_ID

# The PPO-clip loss's defaults (train/loss.py takes them from here: GRPOConfig is their owner).
CLIP_LOW = 0.2
IMPORTANCE_CAP = 5.0


class ConfigError(RunError):
    """The configuration is invalid; the message lists every problem."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GRPOConfig(_Strict):
    """Optimisation hyper-parameters (rollout settings live in the runner). Unknown keys are errors."""

    lr: float = Field(default=OnlineConfig.lr, gt=0, description="AdamW learning rate (the peak, with lr_schedule)")
    lr_schedule: Literal["constant", "linear", "cosine"] = Field(
        default="constant", description="after warmup: constant, linear or cosine decay to 0 at the last step")
    warmup_steps: int = Field(default=0, ge=0, description="steps of linear warmup from lr/(warmup_steps+1) to lr")
    weight_decay: float = Field(default=0.0, ge=0, description="AdamW weight decay")
    betas: tuple[float, float] = Field(default=(0.9, 0.999), description="AdamW betas")
    max_grad_norm: float = Field(default=1.0, gt=0, description="gradient clipping (global L2 norm)")
    clip_low: float = Field(default=CLIP_LOW, gt=0, lt=1, description="PPO clip: ratio >= 1 - clip_low")
    clip_high: float | None = Field(default=None, gt=0, description="ratio <= 1 + clip_high (None: = clip_low)")
    importance_cap: float = Field(default=IMPORTANCE_CAP, ge=1, description="max off-policy weight pi_prox / pi_behav")
    proximal: Literal["recorded", "trainer"] = Field(
        default="trainer", description="what the PPO ratio of an on-policy token is taken against: the trainer's own "
        "logprob at the start of the step (trainer: the engine's recorded one then only weights the token, "
        "min(pi_trainer / pi_engine, importance_cap), correcting a train-inference mismatch such as bfloat16 compute "
        "instead of clipping it; docs/training.md §3, 16 seeds on two tasks), or the logprob the engine recorded "
        "(recorded: the clip then binds wherever the two disagree)")
    kl_coef: float = Field(default=0.0, ge=0, description="> 0: k3 KL to a frozen copy of the start")
    scale_adv_by_std: bool = Field(default=False, description="divide advantages by the group std")
    micro_batch_size: int = Field(default=16, ge=1, description="samples per forward/backward")
    minibatches: int = Field(default=1, ge=1, description="optimiser updates per batch")
    groups_per_step: int = Field(default=8, ge=1, description="kept groups per step")
    max_staleness: int = Field(default=0, ge=0, description="versions an episode may lag; 0 = on-policy")
    dynamic_sampling: bool = Field(default=False, description="a group whose rewards are all equal (no learning "
                                   "signal) is replaced by a fresh group, up to max_resampled_groups per step (DAPO)")
    max_resampled_groups: int | None = Field(default=None, ge=0, description="dynamic_sampling: groups replaced per "
                                             "step at most (None: groups_per_step); then the step trains as is")
    truncated_reward: float | None = Field(
        default=None, allow_inf_nan=False, description="an episode with a reply cut by max_tokens (finish_reason "
        "length) earns this reward instead of its own, e.g. 0: a cut reply is not an answer (DAPO's overlong "
        "filtering); None: the agent's")
    skip_no_signal_updates: bool = Field(default=True, description="a step whose every advantage is 0 applies no "
                                         "update (AdamW's momentum would move the weights with no signal) and "
                                         "pushes no weights")
    max_dropped_groups_in_a_row: int = Field(
        default=64, ge=0, description="that many dropped groups in a row stop the run (0: never)")
    pad_token_id: int = Field(default=PAD_TOKEN_ID, ge=0, description="padding id for batching")
    device: str | None = Field(default=None, description="trainer device; None: cuda if available else cpu")
    share_prompt: bool = Field(default=True, description="run the prompt a group's samples share once in the "
                               "training forward and backward (the same gradient; off for sliding-window models "
                               "and with gradient checkpointing)")
    trim_logits: bool = Field(default=True, description="compute logits (and their log-softmax) only from the "
                              "position before the earliest generated token on, not over the whole prompt")


class LoraSettings(_Strict):
    """``train.lora``: train LoRA adapters (PEFT) instead of every weight."""

    r: int = Field(default=16, ge=1, description="adapter rank")
    alpha: int = Field(default=32, ge=1, description="scaling: the update is (alpha / r) * B @ A")
    target_modules: list[str] | str = Field(default="all-linear", description="module names to adapt, e.g. "
                                            "[q_proj, v_proj]; 'all-linear': every linear layer but the output")
    dropout: float = Field(default=0.0, ge=0, lt=1, description="dropout on the adapter's input")


class ModelSettings(_Strict):
    """``train``: how the policy is held while it learns."""

    dtype: Literal["float32", "bfloat16", "mixed"] = Field(
        default="float32", description="the trained weights' dtype (bfloat16: half the memory, no float32 master "
        "copy; mixed: float32 weights and AdamW, forward and backward in bfloat16 under torch.autocast)")
    gradient_checkpointing: bool = Field(default=False, description="recompute activations in the backward "
                                         "pass: less memory, more time")
    lora: LoraSettings | None = Field(default=None, description="train LoRA adapters only (needs peft); None: "
                                      "full fine-tuning")


class DatasetSource(_Strict):
    """Where prompts come from. A plain string is the ``path``."""

    path: str = Field(description="JSONL (.jsonl/.json), Parquet (.parquet), or a directory written by "
                      "datasets' save_to_disk")
    split: str | None = Field(default=None, description="split of a saved DatasetDict (default: its only split, "
                              "else 'train')")
    limit: int | None = Field(default=None, ge=1, description="use only the first N items")


class RolloutSettings(_Strict):
    group_size: int = Field(default=GROUP_SIZE, description="episodes per prompt (the GRPO group); at least 2")
    concurrency: int = Field(default=CONCURRENCY, ge=1, description="episodes in flight at once")
    episode_timeout: float = Field(default=EPISODE_TIMEOUT_S, gt=0, description="seconds before an episode is failed")
    mode: Literal["inline", "subprocess"] = Field(default="inline", description="where agent.run executes "
                                                  "(a `ray:` section makes it a Ray task per episode)")
    export_style: Literal["individual", "concat"] = Field(default=DEFAULT_EXPORT_STYLE, description="sample layout")
    discount: float = Field(default=NO_DISCOUNT, ge=0.0, le=1.0, description="reward discount up the conversation tree")
    max_consecutive_failures: int = Field(
        default=MAX_CONSECUTIVE_FAILURES, ge=0,
        description="that many failed episodes in a row (e.g. the first N) stop the run; 0: never")
    reward_range: tuple[float, float] | None = Field(
        default=None, description="[low, high]: a reward outside stops the run (None: any finite float)")
    seed: int | None = Field(default=None, description="seed the in-process local engine's sampling: a run's "
                             "samples are reproducible (None: fresh randomness)")
    batch_starts: bool = Field(default=True, description="episodes that start together start their sessions in "
                               "one call (POST /rl/start_sessions; not through a cluster router); false: one "
                               "start_session each")
    fused_finish: bool = Field(default=True, description="without a reward_fn, an episode ends, is rewarded and "
                               "exported in one call (POST /rl/finish_session); false: end_session, set_reward "
                               "and export_trajectories")

    @field_validator("group_size")
    @classmethod
    def _group(cls, v: int) -> int:
        if v < 2:
            raise ValueError(f"is {v}; GRPO compares episodes within a group, so a group needs at least 2")
        return v

    @field_validator("reward_range")
    @classmethod
    def _range(cls, v: tuple[float, float] | None) -> tuple[float, float] | None:
        if v is not None and not v[0] < v[1]:
            raise ValueError(f"[{v[0]}, {v[1]}] is empty; write [low, high] with low < high")
        return v


class GatewaySettings(_Strict):
    url: str | None = Field(default=None, description="a running gateway (weights pushed as checkpoints); "
                            "None: start one in this process")
    admin_key: str | None = Field(default=None, description="remote gateway's admin key (default: $RLGATE_ADMIN_KEY)")
    sync_dir: str | None = Field(default=None, description="remote: a directory the gateway can read "
                                 "(default out_dir/sync)")
    sync_keep: int = Field(default=2, ge=1, description="remote: weight pushes kept in sync_dir")
    push: Literal["merged", "adapter"] = Field(default="merged", description="remote, train.lora: what a weight "
                                               "push holds: the merged weights (any engine) or the LoRA adapter "
                                               "alone (a gateway on vLLM servers started with --enable-lora and "
                                               "VLLM_ALLOW_RUNTIME_LORA_UPDATING=1: vLLM's runtime LoRA API)")
    port: int | None = Field(default=None, ge=0, le=65535, description="in-process gateway's port (None or 0: "
                             "a free one); with ray.replicas, the router's")
    host: str = Field(default="127.0.0.1", description="interface the in-process gateway (with ray.replicas: "
                      "the router) binds; 0.0.0.0 when episodes run on other nodes (rollout mode ray on a "
                      "multi-node cluster): they get this node's IP")
    # the in-process gateway's rendering options: rlgate serve's own (config.GatewayConfig), embedded
    tool_parser: str | None = embedded(GatewayConfig, "tool_parser")
    # off unless set (rlgate serve: 'auto'): a training agent scores the reply's content, and a reasoning parser
    # moves text out of it; the recorded tokens are the same either way
    reasoning_parser: str | None = embedded(GatewayConfig, "reasoning_parser", default=None)
    tool_prompt: Literal["off", "auto"] = embedded(GatewayConfig, "tool_prompt")
    trajectory_mode: Literal["token_exact", "rerender"] = embedded(GatewayConfig, "trajectory_mode")
    context_length: int | None = embedded(GatewayConfig, "context_length")
    max_tokens_cap: int | None = embedded(GatewayConfig, "max_tokens_cap")
    device: str | None = embedded(EngineOptions, "device")
    engine_threads: int | None = Field(default=None, ge=1, description="in-process engine on the CPU: torch threads "
                                       "(None: all cores but one, which the gateway's and agents' Python gets)")
    engine: Literal["local", "scripted"] = Field(default="local", description="in-process: the model (local) or "
                                                 "replies from gateway.script, for a dry run of an agent's loop")
    script: str | None = Field(default=None, description="engine scripted: 'tools' (default: call the first listed "
                               "tool, then answer), a JSON/YAML/JSONL file of replies, or module:fn(prompt) -> str")
    ui: bool = Field(default=False, description="serve the trajectory viewer at /ui during the run (in-process "
                     "gateway or ray.replicas' router); its admin key is written to out_dir/admin_key (0600)")
    policy: str | None = Field(default=None, max_length=64, description="gateway.url: train this adapter policy "
                               "(needs train.lora): created on the gateway at the start, sessions bound to it, "
                               "only the adapter pushed; other runs train their own on the same gateway "
                               "(docs/policies.md)")


class TrainerSettings(_Strict):
    """``ray.trainer``: the run itself (model, optimiser, GRPO loop) as one Ray actor with this
    resource request, instead of in the ``rlgate train`` process (train/remote.py)."""

    num_cpus: float = Field(default=1.0, ge=0, description="CPUs Ray reserves for the trainer")
    num_gpus: float = Field(default=0.0, ge=0, description="GPUs Ray reserves for the trainer (its CUDA devices)")
    memory_gb: float | None = Field(default=None, gt=0, description="memory Ray reserves for the trainer, in GiB")
    resources: dict[str, float] = Field(default_factory=dict, description="custom Ray resources, e.g. "
                                        "{trainer_node: 1} to land on a labelled node")


class RaySettings(_Strict):
    """Run on a Ray cluster (the ``cluster`` extra): every episode a Ray task (rollout mode ``ray``)
    and, with ``replicas``, the gateway as that many replicas behind a router in the trainer's
    process (each with a local engine), weights synced through the router's controller. With
    ``trainer``, the trainer too runs on the cluster, as one Ray actor."""

    address: str | None = Field(default=None, description="an existing cluster ('auto', HOST:6379), which must "
                                "run with Ray's token authentication; None: start a local one (token "
                                "authentication, every port on 127.0.0.1)")
    token_file: str | None = Field(default=None, description="Ray's token file: a local cluster's new token is "
                                   "written here (mode 0600; None: a private temporary directory); with "
                                   "`address`, the cluster's token is read from here (None: $RAY_AUTH_TOKEN_PATH, "
                                   "$RAY_AUTH_TOKEN, ~/.ray/auth_token)")
    allow_unauthenticated: bool = Field(default=False, description="join `address` even if that cluster runs "
                                        "WITHOUT authentication (anyone who reaches its ports can run code as its "
                                        "user); false: refuse to start")
    num_cpus: int | None = Field(default=None, ge=1, description="local cluster only: CPUs it may schedule")
    # the replicas' settings: rlgate serve --replicas' own (config.ClusterConfig), embedded
    replicas: int = embedded(ClusterConfig, "replicas")
    replica_num_cpus: float = embedded(ClusterConfig, "replica_num_cpus")
    replica_num_gpus: float = embedded(ClusterConfig, "replica_num_gpus")
    replica_host: str = embedded(ClusterConfig, "replica_host")
    episode: dict[str, Any] = Field(default_factory=lambda: {"num_cpus": 1},
                                    description="each episode's Ray resource request, e.g. {num_cpus: 1}")
    data_dir: str | None = Field(default=None, description="replicas' stores (default out_dir/replicas; "
                                 "must exist on each node)")
    trainer: TrainerSettings | None = Field(default=None, description="run the trainer as a Ray actor with "
                                            "this resource request (None: in the rlgate train process)")


class MetricsSettings(_Strict):
    """Per-step training metrics for Prometheus (train/telemetry.py)."""

    port: int | None = Field(default=None, ge=0, le=65535, description="serve GET /metrics on this port "
                             "(0: any free port; with the in-process gateway, its metrics too)")
    host: str = Field(default="127.0.0.1", description="address of that bind")
    pushgateway: str | None = Field(default=None, description="Pushgateway URL to push to after every step")
    job: str = Field(default="rlgate-train", description="Pushgateway job name")


class TrackingSettings(_Strict):
    stdout: bool = Field(default=True, description="one line per step on stdout")
    tensorboard: bool = Field(default=True, description="event files in out_dir/tensorboard")
    wandb: bool = Field(default=False, description="log to Weights & Biases (needs `pip install wandb`)")
    wandb_project: str = Field(default="rlgate", description="W&B project")
    mlflow: bool = Field(default=False, description="log to MLflow (needs `pip install mlflow-skinny`)")
    mlflow_tracking_uri: str | None = Field(default=None, description="None: MLflow's default ($MLFLOW_TRACKING_URI)")
    mlflow_experiment: str = Field(default="rlgate", description="MLflow experiment name")
    run_name: str | None = Field(default=None, description="W&B / MLflow run name (default: out_dir's name)")
    trajectories: bool = Field(default=False, description="write each step's samples to "
                               "out_dir/trajectories/step-NNNNNN.parquet")
    plot: bool = Field(default=True, description="write out_dir/reward_curve.png")


class WarmStartSettings(_Strict):
    """``warm_start``: supervised steps on example conversations before RL (train/warm_start.py)."""

    dataset: DatasetSource = Field(description="conversations, one per item: {\"messages\": [...], \"tools\": [...]} "
                                   "as in a Chat Completions request (assistant replies and tool calls are learnt)")
    steps: int = Field(default=8, ge=1, description="AdamW steps, full weights (the result is cached in "
                       "out_dir/warm-start/ and the run starts from it)")
    lr: float = Field(default=3e-5, gt=0, description="learning rate")
    batch_size: int = Field(default=8, ge=1, description="conversations per step")

    @field_validator("dataset", mode="before")
    @classmethod
    def _path_only(cls, v: Any) -> Any:
        return {"path": v} if isinstance(v, (str, Path)) else v


class TrainConfig(_Strict):
    model: str = Field(description="Hugging Face checkpoint directory (weights + tokenizer)")
    out_dir: str = Field(default="runs/rlgate", description="checkpoints, metrics, logs")
    dataset: DatasetSource = Field(description="training prompts; each item is the agent's `data`")
    eval_dataset: DatasetSource | None = Field(default=None, description="held-out items for evaluation")
    eval_every: int = Field(default=0, ge=0, description="steps between evaluations (0: only start and end)")
    eval_samples_per_item: int = Field(default=1, ge=1, description="episodes per evaluation item")
    eval_temperature: float = Field(default=0.0, ge=0, description="added to each eval item as data['temperature']")
    agent: str = Field(description="'module:attr' — a class (built with agent_kwargs), an object with run(), or "
                       "an async function with run's signature; imported from the current directory too")
    agent_kwargs: dict[str, Any] = Field(default_factory=dict, description="keyword arguments for the agent class")
    reward: str | None = Field(default=None, description="'module:fn' scoring each finished episode (then the "
                               "agent's return value is not its reward)")
    reward_kwargs: dict[str, Any] = Field(default_factory=dict, description="keyword arguments if reward is a class")
    steps: int = Field(default=100, ge=0, description="total GRPO steps, including resumed ones")
    seed: int = Field(default=0, description="torch seed and prompt order")
    checkpoint_every: int = Field(default=10, ge=1, description="steps between checkpoints")
    keep_checkpoints: int = Field(default=3, ge=0, description="checkpoints kept (oldest deleted first; 0: all)")
    resume: bool = Field(default=True, description="continue from out_dir's latest checkpoint")
    grpo: GRPOConfig = Field(default_factory=GRPOConfig)
    train: ModelSettings = Field(default_factory=ModelSettings)
    rollout: RolloutSettings = Field(default_factory=RolloutSettings)
    gateway: GatewaySettings = Field(default_factory=GatewaySettings)
    tracking: TrackingSettings = Field(default_factory=TrackingSettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    ray: RaySettings | None = Field(default=None, description="run rollouts (and, with replicas, the gateway) "
                                    "on Ray; None: no Ray")
    warm_start: WarmStartSettings | None = Field(default=None, description="supervised steps on example "
                                                 "conversations before RL (None: start from model as it is)")

    @field_validator("dataset", "eval_dataset", mode="before")
    @classmethod
    def _path_only(cls, v: Any) -> Any:
        return {"path": v} if isinstance(v, (str, Path)) else v

    @field_validator("agent", "reward")
    @classmethod
    def _spec(cls, v: str | None) -> str | None:
        if v is not None and (v.count(":") != 1 or not all(v.split(":"))):
            raise ValueError(f"{v!r} must look like 'package.module:Name'")
        return v

    @property
    def replicas(self) -> int:
        """Gateway replicas on Ray (0: one gateway, in this process or at gateway.url)."""
        return self.ray.replicas if self.ray is not None else 0

    @model_validator(mode="after")
    def _remote_only(self) -> TrainConfig:
        if self.replicas and self.gateway.url is not None:
            raise ValueError("ray.replicas starts the gateway as replicas on Ray; it does not combine with "
                             "gateway.url (a running gateway): set one of them")
        if self.gateway.engine == "scripted" and (self.gateway.url is not None or self.replicas):
            raise ValueError("gateway.engine scripted is the in-process gateway's; it does not combine with "
                             "gateway.url or ray.replicas")
        if self.gateway.script is not None and self.gateway.engine != "scripted":
            raise ValueError("gateway.script only applies with gateway.engine: scripted")
        if self.gateway.url is not None and self.gateway.ui:
            raise ValueError("gateway.ui serves the viewer from the gateway this run starts; a running gateway "
                             "(gateway.url) serves its own: start it with `rlgate serve --ui`")
        if self.gateway.url is None and self.gateway.admin_key:
            raise ValueError("gateway.admin_key only applies with gateway.url (a remote gateway)")
        if self.gateway.policy is not None and (self.gateway.url is None or self.train.lora is None):
            raise ValueError("gateway.policy trains an adapter policy on a running gateway: it needs gateway.url "
                             "and train.lora")
        if self.warm_start is not None and (self.gateway.url is not None or self.replicas
                                            or self.gateway.engine == "scripted"):
            raise ValueError("warm_start trains the model the in-process gateway serves: it does not combine with "
                             "gateway.url, ray.replicas or gateway.engine scripted")
        if self.gateway.url is None and not self.replicas and self.gateway.sync_dir:
            raise ValueError("gateway.sync_dir only applies with gateway.url (a remote gateway) or ray.replicas")
        return self

    def to_yaml(self) -> str:
        """The full resolved config, keys redacted (written to out_dir/config.yaml)."""
        data = self.model_dump(mode="json")
        if data["gateway"].get("admin_key"):
            data["gateway"]["admin_key"] = "<redacted>"  # keys are never written out
        return yaml.safe_dump(data, sort_keys=False)


# --------------------------------------------------------------------------- strict keys

# Names other trainers (TRL, verl, OpenRLHF...) use, mapped to ours.
SYNONYMS = {
    "learning_rate": "grpo.lr", "learningrate": "grpo.lr", "lr_rate": "grpo.lr",
    "num_generations": "rollout.group_size", "n_samples": "rollout.group_size", "n": "rollout.group_size",
    "rollout_n": "rollout.group_size", "num_samples": "rollout.group_size",
    "beta": "grpo.kl_coef", "kl_beta": "grpo.kl_coef", "kl": "grpo.kl_coef", "init_kl_coef": "grpo.kl_coef",
    "epsilon": "grpo.clip_low", "clip_range": "grpo.clip_low", "clip_ratio": "grpo.clip_low",
    "max_steps": "steps", "total_steps": "steps", "num_steps": "steps", "total_training_steps": "steps",
    "output_dir": "out_dir", "model_name_or_path": "model", "model_path": "model",
    "train_dataset": "dataset", "train_files": "dataset", "data": "dataset", "eval_steps": "eval_every",
    "val_files": "eval_dataset", "save_steps": "checkpoint_every", "save_total_limit": "keep_checkpoints",
    "batch_size": "grpo.groups_per_step", "per_device_train_batch_size": "grpo.micro_batch_size",
    "gradient_accumulation_steps": "grpo.micro_batch_size", "max_grad_norm": "grpo.max_grad_norm",
    "report_to": "tracking", "logging": "tracking", "log": "tracking", "temperature": "eval_temperature",
}


def _model_fields(model: type[BaseModel]) -> dict[str, type[BaseModel] | None]:
    """Field name -> nested strict model (None for leaves)."""
    out: dict[str, type[BaseModel] | None] = {}
    for name, f in model.model_fields.items():
        ann = f.annotation
        nested = None
        for cand in (ann, *getattr(ann, "__args__", ())):
            if isinstance(cand, type) and issubclass(cand, BaseModel):
                nested = cand
        out[name] = nested
    return out


def all_keys(model: type[BaseModel] = TrainConfig, prefix: str = "") -> list[str]:
    keys = []
    for name, nested in _model_fields(model).items():
        keys.append(prefix + name)
        if nested is not None and nested is not DatasetSource:
            keys += all_keys(nested, prefix + name + ".")
    return keys


def suggest(key: str, section: str = "") -> str | None:
    """The valid key closest to ``key`` (dotted, as written under ``section``)."""
    leaf = key.rsplit(".", 1)[-1].lower()
    valid = all_keys()
    if leaf in SYNONYMS:
        return SYNONYMS[leaf]
    full = f"{section}.{key}" if section else key
    close = difflib.get_close_matches(full, valid, n=1, cutoff=0.6)
    if close:
        return close[0]
    # the same leaf name in another section (lr -> grpo.lr)
    same = [k for k in valid if k.rsplit(".", 1)[-1] == leaf]
    if same:
        return same[0]
    close = difflib.get_close_matches(leaf, [k.rsplit(".", 1)[-1] for k in valid], n=1, cutoff=0.75)
    if close:
        return next(k for k in valid if k.rsplit(".", 1)[-1] == close[0])
    return None


def unknown_keys(raw: Any, model: type[BaseModel] = TrainConfig, prefix: str = "") -> list[str]:
    """Dotted keys in ``raw`` that ``model`` does not have (recursing into nested sections)."""
    if not isinstance(raw, dict):
        return []
    fields = _model_fields(model)
    bad = []
    for key, value in raw.items():
        if key not in fields:
            bad.append(prefix + str(key))
        elif fields[key] is not None and isinstance(value, dict):
            bad += unknown_keys(value, fields[key], prefix + key + ".")  # type: ignore[arg-type]
    return bad


def _unknown_message(key: str, where: str) -> str:
    section = key.rsplit(".", 1)[0] if "." in key else ""
    hint = suggest(key.rsplit(".", 1)[-1], section)
    return f"{key}: unknown key{where}" + (f"; did you mean {hint}?" if hint else "")


# --------------------------------------------------------------------------- loading


def parse_override(item: str) -> tuple[list[str], Any]:
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise ConfigError(f"--set expects key=value, got {item!r}")
    return key.split("."), _scalar(yaml.safe_load(value))


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for item in overrides:
        parts, value = parse_override(item)
        node = raw
        for p in parts[:-1]:
            if not isinstance(node.get(p), dict):
                node[p] = {} if node.get(p) is None else node[p]
            node = node[p]
            if not isinstance(node, dict):
                raise ConfigError(f"--set {item}: {'.'.join(parts[:-1])} is not a section")
        node[parts[-1]] = value
    return raw


def _scalar(v: Any) -> Any:
    """YAML 1.1 reads ``3e-5`` as a string; numbers written that way are numbers here."""
    if isinstance(v, str):
        for cast in (int, float):
            try:
                return cast(v)
            except ValueError:
                pass
    return v


def _format_validation(exc: ValidationError) -> list[str]:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"] if not str(p).startswith("function-"))
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "missing":
            lines.append(f"{loc}: required, not set")
        elif err["type"] == "extra_forbidden":
            lines.append(_unknown_message(loc, ""))
        elif err["type"] == "value_error":
            lines.append(f"{loc or 'config'}: {msg}")
        else:
            lines.append(f"{loc or 'config'}: {msg} (got {err.get('input')!r})")
    return lines


def validate_config(raw: Any, overrides: list[str] | None = None, *, source: str = "the config") -> TrainConfig:
    """A :class:`TrainConfig` from a parsed YAML mapping and ``--set`` overrides, or :class:`ConfigError`."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping of keys to values, got {type(raw).__name__}")
    problems = [_unknown_message(k, f" in {source}") for k in unknown_keys(raw)]
    for item in overrides or []:
        parts, value = parse_override(item)
        nested = {parts[-1]: value}
        for p in reversed(parts[:-1]):
            nested = {p: nested}
        problems += [_unknown_message(k, f" (--set {item})") for k in unknown_keys(nested)]
    try:
        cfg = TrainConfig.model_validate(apply_overrides(raw, overrides or []))
    except ValidationError as exc:  # every problem at once; unknown keys were reported above, with their source
        problems += [line for err, line in zip(exc.errors(), _format_validation(exc), strict=True)
                     if err["type"] != "extra_forbidden"]
    if problems:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(problems))
    return cfg


# --------------------------------------------------------------------------- online training


class OnlineTrainConfig(_Strict):
    """``rlgate serve --online-train --online-train-config FILE``: the ``grpo:`` and ``train:`` sections of
    ``rlgate train``'s configuration, for the online trainer (train/online.py): KL, clipping, warmup,
    micro-batches, device, the trained weights' dtype, LoRA and gradient checkpointing."""

    grpo: GRPOConfig = Field(default_factory=GRPOConfig)
    train: ModelSettings = Field(default_factory=ModelSettings)


# grpo keys only the offline loop reads (it collects groups per step from its own rollouts): what says it online
OFFLINE_LOOP_KEYS = {
    "groups_per_step": "a step takes --train-batch rewarded samples",
    "max_staleness": "--max-staleness-versions and --max-staleness-hours bound a sample's age",
    "dynamic_sampling": "live groups are not played again; a group without signal has zero advantages",
    "max_resampled_groups": "live groups are not played again",
    "max_dropped_groups_in_a_row": "nothing stops serving; dropped samples are counted in GET /rl/online",
    "truncated_reward": "a live episode's reward is the client's (POST /v1/feedback): score a cut reply there",
}


def load_online_train_config(path: str | Path, *, lr: float) -> OnlineTrainConfig:
    """The online trainer's settings from ``path`` (YAML, ``grpo:`` and ``train:`` only), or
    :class:`ConfigError` listing every problem. ``lr`` (``--online-lr``) is ``grpo.lr`` unless the file sets it."""
    source = f"--online-train-config {path}"
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"{source}: no such file") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {exc}") from None
    raw = {} if raw is None else raw
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping with grpo: and train:, got {type(raw).__name__}")
    problems = [f"{key}: not read online (only grpo: and train: are; the rest is rlgate train's)"
                for key in raw if key not in OnlineTrainConfig.model_fields]
    grpo = raw.get("grpo") or {}
    if isinstance(grpo, dict):
        problems += [f"grpo.{key}: the offline loop's; online, {why}"
                     for key, why in OFFLINE_LOOP_KEYS.items() if key in grpo]
        if grpo.get("lr_schedule", "constant") != "constant":
            problems.append(f"grpo.lr_schedule: {grpo['lr_schedule']!r} decays to 0 at a run's last step, and "
                            "online training has none; use constant (with grpo.warmup_steps if wanted)")
        raw["grpo"] = {"lr": lr, **grpo}
    sections = {k: v for k, v in raw.items() if k in OnlineTrainConfig.model_fields}
    problems += [_unknown_message(k, "") for k in unknown_keys(sections, OnlineTrainConfig)]
    cfg = None
    try:
        cfg = OnlineTrainConfig.model_validate(sections)
    except ValidationError as exc:
        problems += [line for err, line in zip(exc.errors(), _format_validation(exc), strict=True)
                     if err["type"] != "extra_forbidden"]
    if problems or cfg is None:
        raise ConfigError(f"{source}: invalid:\n  " + "\n  ".join(problems))
    return cfg


def load_config(path: str | Path, overrides: list[str] | None = None) -> TrainConfig:
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"--config {path}: no such file") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"--config {path}: not valid YAML: {exc}") from None
    return validate_config(raw, overrides, source=str(path))
