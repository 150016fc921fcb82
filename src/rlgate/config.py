"""Configuration: every knob and limit, with its default and its help text, in one place.

Each option is a dataclass field made by :func:`option`, whose ``metadata`` holds its help
text; the command line is generated from the fields (:func:`add_arguments`,
:func:`from_arguments`), so a default is written once and a new field
``x: int = option(3, "what x does")`` is a new ``rlgate serve`` flag, its default shown in
``--help``. Field metadata the generator reads:

* ``help``: the flag's help text (required for a flag; a field without it gets no flag);
* ``flag``: the flag's name when it is not ``--field-name`` (e.g. ``--cors-origin`` for a
  list whose flag is repeated once per item);
* ``choices``: allowed values of a ``str`` field (``Literal`` types give them already);
* ``metavar``: the value's name in ``--help`` (default: N, X or TEXT by type);
* ``env``: an environment variable that overrides the default when it is set;
* ``cli_default``: the flag's default when the command line derives the value itself (the
  help text says how); a flag left at None then leaves the field to its caller.

Types: ``int``, ``float``, ``str`` and ``Literal[...]`` take a value; ``bool`` fields are
``--flag`` / ``--no-flag``; ``list[X]`` flags are repeated once per item; for ``X | None``
fields the value ``none`` means None.

One configuration system: these classes are *pydantic* dataclasses, validated at construction
by the same library, with the same errors, as the training run's YAML sections
(``train/config.py``). :func:`option`'s help text is also the field's pydantic ``description``,
and its bounds (``ge``, ``gt``, ``le``, ``lt``) are pydantic's, so a value out of range is refused
whether it comes from a flag, a YAML key or code. A training section that takes a serving
option embeds this declaration (:func:`embedded`) instead of writing
its type, default, bounds and help again.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import types
import typing
from collections.abc import Callable
from dataclasses import field
from typing import TYPE_CHECKING, Any, Literal, TypeVar, Union

from pydantic import ConfigDict, ValidationError
from pydantic.dataclasses import dataclass
from pydantic.fields import FieldInfo

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = ["ClusterConfig", "GatewayConfig", "OnlineConfig", "add_arguments", "from_arguments", "option"]

T = TypeVar("T", bound="DataclassInstance")

# A generated token is stale when the weights moved more than this many versions since it was produced:
# the stale-token guard's default and the trajectory viewer's (rlgate view --stale-lag, the live /ui).
STALE_LAG = 4


# every options class: pydantic-validated at construction (engines, stores and pools are plain objects)
OPTIONS = ConfigDict(arbitrary_types_allowed=True)


def option(default: Any = dataclasses.MISSING, help: str = "", *, factory: Callable[[], Any] | None = None,
           **meta: Any) -> Any:
    """A dataclass field with its help text: ``x: int = option(3, "what x does")``; ``ge=1`` and the
    other bounds are checked by pydantic (a flag, a YAML key or code alike)."""
    metadata = {"help": help, "description": help, **meta}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def embedded(cls: type[Any], name: str, **overrides: Any) -> Any:
    """Options class ``cls``'s field ``name`` as a field of another pydantic section (the training run's
    ``gateway:`` takes the gateway's rendering options this way): its default, bounds and help are this
    module's; ``overrides`` (e.g. ``default=None``) only where that section's default differs on purpose.
    The section writes the field's type again for type checkers; tests/test_defaults_once.py checks it."""
    info: FieldInfo = cls.__pydantic_fields__[name]
    merged = FieldInfo.merge_field_infos(info, **overrides)
    merged.json_schema_extra = {"embeds": f"{cls.__name__}.{name}"}
    merged.init = merged.kw_only = None  # a dataclass's, not the section's
    return merged


LOG_LEVEL = "info"  # uvicorn's and rlgate's log level unless told otherwise (rlgate serve --log-level)


@dataclass(config=OPTIONS)
class GatewayConfig:
    """What the gateway does and how much it accepts (``rlgate serve`` flags of the same names)."""

    admin_key: str  # required for control routes; compared in constant time, never logged (own flag)
    capacity_mode: Literal["unlimited", "granted"] = option(
        "unlimited", "unlimited: any started session may generate; granted: only capacity granted by "
        "/rl/grant_capacity admits new sessions")
    trajectory_mode: Literal["token_exact", "rerender"] = option(
        "token_exact", "default trajectory mode of a session (token_exact: one exact token sequence per "
        "conversation; rerender: every turn rendered afresh)")
    model_family: str | None = option(
        None, "model family by chat/families name: renderer, parsers and stop tokens, e.g. qwen3, llama3, gpt_oss "
        "('jinja': the checkpoint's own template; none or 'auto': detected from config.json and the chat template)",
        flag="--renderer", metavar="NAME")
    tool_parser: str | None = option("auto", "tool-call parser ('auto': the model family's; 'none' disables "
                                     "tool-call parsing)")
    reasoning_parser: str | None = option("auto", "reasoning parser, e.g. 'think' ('auto': the model family's; "
                                          "'none': reasoning stays in the content)")
    tool_prompt: Literal["off", "auto"] = option(
        "off", "tools the chat template cannot show ('off': reported as dropped, the model never sees them; 'auto': "
        "described in the system message in the <tool_call> format the tool parser reads, as SmolLM2's model card "
        "does: docs/http-api.md#tools-a-template-cannot-show)")
    default_max_tokens: int | None = option(
        None, "generated tokens when a request sets no max tokens (none: up to the rest of the context, as the "
        "OpenAI API and vLLM do; a reply cut by this cap counts in the default_cap_cuts guard)", ge=1)
    max_tokens_cap: int | None = option(None, "hard cap on generated tokens per request (none: the context only)",
                                        ge=1)
    history_matchers: list[str] = option(
        help="a history matcher: finds the parent turn when a client re-serialises the model's reply "
        "(built in: smolagents, claude_code_compaction; or package.module:attribute); repeat for more; the "
        "built-in ones are on by default ('none' drops those named before it)",
        factory=lambda: ["smolagents", "claude_code_compaction"], flag="--history-matcher", metavar="NAME")
    context_length: int | None = option(None, "tokens of prompt + output a request may use (none: the engine's; "
                                        "raise it to serve long agent prompts, RoPE)", ge=1)
    stop_token_ids: list[int] | None = option(
        None, "a token id that ends generation (repeat for several; default: the tokenizer's eos and the "
        "model's generation_config eos)", flag="--stop-token-id", metavar="ID")
    model_name: str = option("rlgate", "the model name /v1/models lists and responses echo when a request names "
                             "none (default: the --model directory's name)", cli_default=None)
    max_policies: int = option(8, "LoRA adapter policies served at once beside the default policy (POST /rl/policies; "
                               "more -> 409 policy_limit_reached)", ge=0)
    session_idle_timeout: float = option(3600.0, "seconds without a request before the sweeper ends a session", ge=0)
    sweep_interval: float = option(60.0, "seconds between idle-session sweeps", ge=0)
    max_sessions: int = option(10_000, "open (active) sessions at once; more -> 429", ge=1)
    max_stored_sessions: int = option(100_000, "sessions held in any state (active, ended, interrupted); more -> 429", ge=1)
    max_interactions_per_session: int = option(10_000, "interactions per session; more -> 429", ge=1)
    max_concurrent_requests_per_session: int = option(64, "generations in flight for one session key; more -> 429", ge=1)
    max_messages_per_request: int = option(10_000, "messages in one generation request; more -> 400", ge=1)
    max_tools: int = option(512, "tools offered in one request; more -> 400", ge=1)
    max_stop_sequences: int = option(16, "stop strings in one request; more -> 400", ge=1)
    max_body_bytes: int = option(32 * 1024 * 1024, "largest request body in bytes (chunked bodies too); more -> 413", ge=1)
    retain_exported: float = option(0.0, "seconds an exported session is kept for audit (0: dropped at export)", ge=0)
    shutdown_timeout: float = option(30.0, "SIGTERM: seconds requests in flight get to finish before being aborted", ge=0)
    cors_origins: list[str] = option(help="allow this CORS origin (repeat for several; none: no CORS headers)",
                                     factory=list, flag="--cors-origin", metavar="ORIGIN")
    stream_keepalive_interval: float = option(
        10.0, "seconds without a streamed event before a keep-alive event (ping) is sent (0: never)", ge=0)
    image_placeholder: str = "<image>"  # informational: what text-only templates render for an image
    # ---- hardening (docs/operations.md "Limits", docs/security.md) ----
    allow_template_override: bool = option(
        False, "let clients set reserved chat_template_kwargs (chat_template, tokenize, ...): only for trusted "
        "clients; their templates then render in a worker bounded by --render-timeout")
    render_timeout: float = option(
        30.0, "seconds a request's prompt may take to render and tokenize in a worker thread; more -> 503", ge=0)
    render_workers: int = option(2, "worker threads that render and tokenize large prompts (small ones stay on the event loop)",
        ge=1)
    max_json_depth: int = option(64, "nesting depth of a request body; deeper -> 400", ge=1)
    max_image_bytes: int = option(10 * 1024 * 1024, "size of one image (base64 data or URL) in a request; larger -> 413", ge=1)
    max_image_bytes_per_session: int = option(
        64 * 1024 * 1024, "image bytes one session may record (each image counted where the store writes it); more -> 413", ge=1)
    rate_limit_per_key: float = option(
        0.0, "requests per second one session key may make (token bucket; 0: no limit); more -> 429 + Retry-After", ge=0)
    rate_limit_burst: int = option(32, "token bucket size of --rate-limit-per-key", ge=1)
    header_timeout: float = option(
        10.0, "seconds a client has to send a request's headers (from the connection or the request's first byte)", ge=0)
    body_timeout: float = option(
        60.0, "seconds a client has to send a whole request body once its headers arrived; slower -> 408", ge=0)
    max_buffered_body_bytes: int = option(
        512 * 1024 * 1024, "request bodies held in memory at once, all requests together; more -> 503 server_busy", ge=1)
    max_connections: int = option(
        2048, "open HTTP connections; more are answered 503 and closed (lowered to fit the open-file limit)", ge=1)

    # ---- metrics, silent-failure guards and the viewer (docs/operations.md, "Metrics and guards")
    metrics_port: int | None = option(None, "also serve GET /metrics without a key on this port (a separate bind for scrapers); "
                                      "None: only the admin-key /metrics on the main port", ge=0, le=65535)
    metrics_host: str = option("127.0.0.1", "address of the --metrics-port bind")
    ui: bool = option(False, "serve the trajectory viewer at /ui (admin key required: login form or Authorization header)")
    ui_login_ttl: float = option(12 * 3600.0, "seconds a /ui login cookie stays valid", ge=0)
    guard_window: int = option(500, "observations each silent-failure guard looks back over (a reply, an export, a store poll)",
        ge=1)
    guard_min_events: int = option(20, "events a guard needs in its window before its ratio can raise an alarm", ge=1)
    guard_poll_interval: float = option(
        5.0, "seconds between polls of the store's write counters (store guard, alarms without traffic)", ge=0)
    guard_tool_parse_failure_ratio: float = option(
        0.1, "alarm when more than this fraction of tool-call blocks the parser met did not parse", ge=0, le=1)
    guard_unparsed_tool_markup_ratio: float = option(
        0.05, "alarm when more than this fraction of replies show tool-call markup as text", ge=0, le=1)
    guard_empty_reply_ratio: float = option(
        0.1, "alarm when more than this fraction of replies are empty (no text, reasoning or tool call)", ge=0, le=1)
    guard_fork_ratio: float = option(
        0.25, "alarm when more than this fraction of follow-up turns fork instead of extending a parent", ge=0, le=1)
    guard_unaligned_turn_ratio: float = option(
        0.05, "alarm when more than this fraction of turns in concat exports are unaligned (no loss)", ge=0, le=1)
    guard_missing_reward_ratio: float = option(0.05, "alarm when more than this fraction of exported samples have no reward",
        ge=0, le=1)
    guard_stale_lag: int = option(
        STALE_LAG, "a generated token is stale at export when the weights moved more than this many versions since", ge=0)
    guard_stale_token_ratio: float = option(0.1, "alarm when more than this fraction of exported generated tokens are stale",
        ge=0, le=1)
    guard_abort_ratio: float = option(
        0.1, "alarm when more than this fraction of generations are aborted, fail or are cut by a restart", ge=0, le=1)
    guard_store_failure_ratio: float = option(0.0, "alarm when more than this fraction of store writes fail (0: any failure)",
        ge=0, le=1)
    guard_default_cap_cut_ratio: float = option(
        0.05, "alarm when more than this fraction of replies are cut by a token cap the client never asked "
        "for (--default-max-tokens, --max-tokens-cap)", ge=0, le=1)


@dataclass(config=OPTIONS)
class ClusterConfig:
    """Gateway replicas on Ray behind one router (``rlgate serve --replicas N``; see docs/scale-out.md)."""

    replicas: int = option(0, "run N gateway replicas as Ray actors behind a router on --host/--port (0: one plain "
                           "gateway)", ge=0)
    ray_address: str | None = option(
        None, "join this Ray cluster (e.g. 'auto' or HOST:6379) instead of starting a local one; it must run "
        "with Ray's token authentication (RAY_AUTH_MODE=token) and rlgate needs its token (--ray-token-file)")
    ray_token_file: str | None = option(
        None, "Ray's authentication token file. A local Ray cluster gets a new token at each start, written here "
        "with mode 0600 (default: ray-auth-token beside --admin-key-file, else in --data-dir, else in a "
        "private temporary directory); with --ray-address the cluster's token is read from here (default: "
        "where Ray looks: $RAY_AUTH_TOKEN_PATH, $RAY_AUTH_TOKEN, ~/.ray/auth_token)", cli_default=None, metavar="PATH")
    ray_allow_unauthenticated: bool = option(
        False, "join --ray-address even if that Ray cluster runs WITHOUT authentication (RAY_AUTH_MODE=disabled): "
        "anyone who can reach its ports can then run code as its user and read the admin key from the "
        "replicas (without it: refuse to start)")
    replica_num_cpus: float = option(1.0, "CPUs Ray reserves for each replica", ge=0)
    replica_num_gpus: float = option(0.0, "GPUs Ray reserves for each replica (1 with --engine local on GPU nodes)",
                                     ge=0)
    replica_host: str = option("127.0.0.1", "interface each replica's HTTP port binds; 0.0.0.0 when replicas run on other nodes")
    ray_num_cpus: int | None = option(
        None, "local Ray cluster only: CPUs it may schedule (default: the machine's, or what the replicas "
        "reserve if that is more)", ge=1)
    object_store_mb: int = option(128, "local Ray cluster only: object store size in MiB (the data plane does not use it)", ge=1)
    refresh_interval: float = option(0.5, "seconds between the router's refreshes of replica state and load", ge=0)
    namespace: str = option("rlgate", "Ray namespace of the replica actors")


@dataclass(config=OPTIONS)
class OnlineConfig:
    """The online mode (``rlgate serve --online``; docs/online.md), one class for both parts: serving real
    traffic (tenant keys, conversations, feedback and its rewards, data rights, fair limits) and learning
    from it (``--online-train``: live groups, the continuous trainer, the canary, reward-hacking guards)."""

    online: bool = option(False, "serve real traffic: API keys per tenant (POST /v1/tenants), conversations "
                          "recognised from a header or by token-exact parent matching, the feedback API "
                          "(POST /v1/feedback), implicit signals, deletion and retention (docs/online.md)")
    conversation_header: str = option("x-conversation-id", "request header naming a conversation (a tenant's "
                                      "requests without it share one session: conversations are its trees)",
                                      metavar="NAME")
    reward_weights: list[str] = option(
        help="KIND=WEIGHT: how much a kind of feedback counts in a turn's reward (kinds: thumbs, rating, "
        "preference, outcome, and the implicit regenerate, edit, abandon, tool_error); repeat for several; "
        "unnamed kinds keep their default",
        factory=lambda: ["thumbs=1", "rating=1", "preference=1", "outcome=1", "regenerate=-1", "edit=-0.5",
                         "tool_error=-1", "abandon=0"], flag="--reward-weight", metavar="KIND=W")
    reward_combine: Literal["mean", "sum"] = option(
        "mean", "how a turn's feedback makes one reward: mean (weighted mean of the signals, in [-1, 1] when "
        "outcomes are) or sum")
    abandon_after: float = option(1800.0, "seconds without a follow-up after a turn before it counts as "
                                  "abandoned (an implicit signal; 0: never)", ge=0)
    implicit_scan_interval: float = option(1.0, "seconds between scans of new turns for implicit signals "
                                           "(regenerate, edit, tool error, abandon)", ge=0)
    tool_error_pattern: str = option(
        r"^\s*(error|exception|traceback)\b", "a tool result whose text matches this (case-insensitive) "
        "regular expression is a failed tool call (Anthropic's is_error always is)", metavar="REGEX")
    data_retention_hours: float = option(0.0, "delete a conversation (turns, feedback) this many hours after "
                                         "its last activity (0: keep until deleted on request)", ge=0)
    retention_interval: float = option(60.0, "seconds between retention purges", ge=0)
    redaction_hook: str | None = option(
        None, "package.module:attribute: a function (messages) -> messages applied to every turn before it "
        "reaches the trainer (an operator's code, never a request's)", metavar="PATH")
    max_feedback_per_target: int = option(1000, "feedback events one turn or conversation may receive; "
                                          "more -> 429", ge=1)
    max_comment_chars: int = option(10_000, "longest feedback comment; longer -> 400", ge=0)
    max_feedback_metadata_bytes: int = option(4096, "largest feedback metadata object (its JSON, in bytes); "
                                              "larger -> 400", ge=0)
    outcome_low: float = option(-1.0, "lowest outcome value a feedback event may carry; lower -> 400")
    outcome_high: float = option(1.0, "highest outcome value a feedback event may carry; higher -> 400")
    max_tenants: int = option(10_000, "tenants (revoked ones included) at most; more -> 429", ge=1)
    # ---- fair limits per tenant (online/quotas.py): one tenant's traffic cannot refuse another's
    max_open_conversations_per_tenant: int = option(
        1000, "open conversations (sessions) one tenant may hold; at the limit its least recently active idle "
        "one is released to make room (429 only when all are busy)", ge=1)
    max_conversations_per_tenant: int = option(20_000, "conversations one tenant may hold in any state (until "
                                               "deleted, purged by retention or exported); more -> 429 for it", ge=1)
    max_feedback_per_tenant: int = option(200_000, "feedback events one tenant may have stored; more -> 429 for it", ge=1)
    conversation_release_s: float = option(
        300.0, "release (end) a tenant's conversation session after this many seconds without a turn; its next "
        "turn starts a new session (recorded as a new root). 0: only the gateway's hour-long idle sweeper", ge=0)

    # ==== online training (--online-train): live groups, the continuous trainer, the canary; read by
    # online/groups.py, online/trainer.py and online/canary.py (docs/online.md)

    train: bool = option(False, "learn while serving (with --online and --engine local): live groups, the "
                         "continuous trainer and the canary on a second engine (docs/online.md)", flag="--online-train")
    train_adapters: bool = option(
        False, "every adapter policy learns from its own users (with --online and --engine local): its own "
        "continuous trainer on its adapter, canary and guards; the base (the default policy) is frozen. Tenants "
        "bound to a policy (POST /v1/tenants/policy) train it (docs/policies.md)", flag="--online-train-adapters")
    lr: float = option(1e-5, "the online trainer's AdamW learning rate (grpo.lr of --online-train-config wins)",
                       flag="--online-lr", gt=0)
    train_config: str | None = option(
        None, "a YAML file with rlgate train's grpo: and train: sections for the online trainer (KL, clipping, "
        "warmup, micro-batches, dtype, LoRA; docs/online.md); the offline loop's batch keys are refused (none: "
        "rlgate train's defaults)", flag="--online-train-config", metavar="PATH")
    # ---- live groups
    group_fraction: float = option(0.0, "fraction of completed replies that get k-1 extra replies to the same "
                                   "prompt, sampled off the user's path and scored as one GRPO group (0: off)", ge=0, le=1)
    group_size: int = option(4, "k: replies per live group, the user's own included", ge=1)
    group_tokens_per_minute: int = option(20_000, "budget of extra generated tokens per minute for live groups "
                                          "(a group is skipped when its worst case does not fit)", ge=0)
    group_shed_waiting: int = option(0, "skip live groups while the engine has more than this many requests "
                                     "waiting for a batch row (user traffic first)", ge=0)
    group_reward: str | None = option(None, "the reward of live groups: package.module:attribute, a function "
                                      "(episode) -> float or awaitable, or an object with score_group(episodes)"
                                      " (none: live groups are off)", metavar="PATH")
    # ---- continuous trainer
    train_batch: int = option(32, "rewarded samples (fresh ones, replay excluded) before a training step", ge=1)
    train_batch_max: int = option(128, "fresh samples one step takes at most (the oldest first; the rest wait "
                                  "for the next step)", ge=1)
    candidate_steps: int = option(1, "training steps between two canary candidates (a candidate only a step "
                                  "away from stable differs little, and the canary needs many rewards to tell)", ge=1)
    max_staleness_versions: int = option(4, "drop a sample whose oldest token is more than this many versions "
                                         "behind the trainer", ge=0)
    max_staleness_hours: float = option(24.0, "drop a sample generated more than this many hours ago", ge=0)
    pending_limit: int = option(4096, "rewarded samples waiting for a step at most (the oldest are dropped "
                                "beyond it, counted)", ge=1)
    replay_fraction: float = option(0.25, "share of a step's samples drawn again from samples already trained "
                                    "on (within the staleness bounds)", ge=0, le=1)
    replay_capacity: int = option(512, "samples kept for replay at most", ge=0)
    retention_hours: float = option(24.0, "samples leave the replay buffer after this many hours", ge=0)
    tenant_train_share: float = option(0.5, "while other tenants' samples wait, one tenant's samples make at most "
                                       "this share of a step's fresh samples", ge=0, le=1)
    # ---- canary
    canary_share: float = option(0.2, "share of new conversations a candidate checkpoint serves", ge=0, le=1)
    canary_alpha: float = option(0.05, "error level of the canary's sequential test (confidence sequence)", ge=0, le=1)
    canary_margin: float = option(0.05, "promote once the canary is, with confidence, not worse than stable by "
                                  "more than this (in reward units)", ge=0)
    canary_min_samples: int = option(20, "rewards each version needs before an automatic decision", ge=1)
    canary_plan_samples: int = option(200, "sample size where the test's interval is tightest", ge=1)
    canary_floor: float | None = option(None, "a fixed quality floor: the canary is promoted only once its mean "
                                        "live reward is shown at or above it, rolled back once shown below it "
                                        "(none: only 'not worse than stable')")
    reward_low: float = option(-1.0, "lowest live reward (the test clips rewards to [low, high])")
    reward_high: float = option(1.0, "highest live reward")
    conversation_idle_s: float = option(60.0, "after a promotion the next candidate waits until the previous "
                                        "stable version's conversations have been idle this long (they keep "
                                        "their version until then; an idle one may move at its next turn)", ge=0)
    # ---- reward-hacking guards (online/hacking.py)
    hacking_action: Literal["alarm", "pause", "rollback"] = option(
        "pause", "what a reward-hacking guard firing on the canary does: alarm (log, /health, metrics), pause (also "
        "no automatic promotion while it fires) or rollback (the canary is rolled back)")
    hacking_reference_replies: int = option(200, "replies of the starting version that teach the guards the users' "
                                          "vocabulary, then as many that measure the reference rates", ge=1)
    hacking_window: int = option(200, "a version's last replies the guards look at", ge=1)
    hacking_min_replies: int = option(50, "replies of a version before its guards may fire (and before it may be "
                                    "promoted automatically unless hacking_action is alarm)", ge=1)
    hacking_margin: float = option(0.15, "a guard fires when a version's rate of a sign exceeds the reference's by "
                                 "more than this", ge=0)
    hacking_entropy_ratio: float = option(0.3, "entropy collapse: a version's mean surprisal per sampled token below "
                                        "this fraction of the reference's", ge=0, le=1)
    hacking_alarm_only: list[str] = option(
        help="a guard that only alarms: it never holds or rolls back a candidate (repeat for several), e.g. "
        "online_entropy_collapse for a task whose good replies are short and sure (online/hacking.py)",
        factory=list, flag="--hacking-alarm-only", metavar="GUARD")
    heldout_check: str | None = option(None, "package.module:attribute: an object with .prompts (lists of chat "
                                       "messages) and .score(messages, reply) -> float, run on every candidate and "
                                       "its stable version (operator code, loaded once; none: no held-out guard)",
                                       metavar="PATH")
    heldout_margin: float = option(0.1, "the held-out guard fires when a candidate scores more than this below "
                                   "stable", ge=0)
    heldout_max_tokens: int = option(32, "tokens per held-out reply (greedy)", ge=1)
    max_conversations: int = option(100_000, "conversation-to-version bindings kept at most (least recent "
                                    "dropped)", ge=1)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.outcome_low) and math.isfinite(self.outcome_high)
                and self.outcome_high > self.outcome_low):
            raise ValueError("outcome_high must be above outcome_low, both finite")
        for name in ("group_fraction", "replay_fraction", "canary_share", "tenant_train_share"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in [0, 1]")
        if self.candidate_steps < 1:
            raise ValueError("candidate_steps must be >= 1")
        if self.group_size < 2:
            raise ValueError("group_size must be >= 2 (a GRPO group compares replies)")
        if not self.reward_high > self.reward_low:
            raise ValueError("reward_high must be above reward_low")
        if not 0 < self.canary_alpha < 1:
            raise ValueError("canary_alpha must be in (0, 1)")


# --------------------------------------------------------------------------- command line


def _flag(f: dataclasses.Field[Any]) -> str:
    return str(f.metadata.get("flag") or "--" + f.name.replace("_", "-"))


def _unwrap(tp: Any) -> tuple[Any, bool]:
    """``X | None`` -> (X, True); anything else -> (tp, False)."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0], True
    return tp, False


_METAVARS = {int: "N", float: "X", str: "TEXT"}


def _converter(tp: Any, optional: bool) -> Callable[[str], Any]:
    if tp not in (int, float, str):
        raise TypeError(f"no command-line form for a field of type {tp!r}")

    def convert(text: str) -> Any:
        if optional and text.lower() == "none":
            return None
        return tp(text)

    convert.__name__ = tp.__name__  # argparse names the type in its error messages
    return convert


def _choice(choices: list[str], optional: bool) -> Callable[[str], Any]:
    """A converter that matches ``choices`` case-insensitively (argparse then checks membership)."""
    by_lower = {c.lower(): c for c in choices}

    def convert(text: str) -> Any:
        if optional and text.lower() == "none":
            return None
        return by_lower.get(text.lower(), text)

    convert.__name__ = "choice"
    return convert


def add_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup, cls: type[Any]) -> None:
    """Add a flag for every field of dataclass ``cls`` that has help text (see the module docstring)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if not f.metadata.get("help"):
            continue
        tp, optional = _unwrap(hints[f.name])
        kw: dict[str, Any] = {"dest": f.name, "help": _help(f)}
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:  # a field without a default is a required flag
            default, kw["required"] = None, True
        env = f.metadata.get("env")
        if env and os.environ.get(env) is not None:
            default = os.environ[env]
        if "cli_default" in f.metadata:
            default = f.metadata["cli_default"]
        kw["default"] = default
        if tp is bool:
            kw["action"] = argparse.BooleanOptionalAction
        elif typing.get_origin(tp) is list:
            (item,) = typing.get_args(tp)
            kw.update(action="append", type=_converter(item, False), metavar=f.metadata.get("metavar", _METAVARS[item]))
            kw["default"] = None if default is None else list(default)
        elif typing.get_origin(tp) is Literal:
            choices = list(typing.get_args(tp))
            kw.update(choices=choices + ([None] if optional else []), type=_choice(choices, optional))
        else:
            kw.update(type=_converter(tp, optional), metavar=f.metadata.get("metavar", _METAVARS[tp]))
            if "choices" in f.metadata:
                kw["choices"] = list(f.metadata["choices"])
        parser.add_argument(_flag(f), **kw)


def _shown(value: Any) -> str:
    if value is None or value == []:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    return str(value)


def _help(f: dataclasses.Field[Any]) -> str:
    text = str(f.metadata["help"]).replace("%", "%%")
    if "cli_default" in f.metadata:
        return text  # it says what the default is
    if f.default is not dataclasses.MISSING:
        default = _shown(f.default)
    elif f.default_factory is not dataclasses.MISSING:
        default = _shown(f.default_factory())
    else:
        return text + " (required)"
    env = f.metadata.get("env")
    default = (f"${env}, else {default}" if env else default).replace("%", "%%")
    return f"{text} (default: {default})"


def from_arguments(cls: type[T], args: argparse.Namespace, **given: Any) -> T:
    """An instance of dataclass ``cls`` from parsed flags; ``given`` fills the fields without a flag.

    A flag left at None keeps the field's own default when None is not a value of the field
    (a repeated flag given no times, a ``cli_default`` of None).
    """
    hints = typing.get_type_hints(cls)
    values = dict(given)
    for f in dataclasses.fields(cls):
        if f.name in values or not f.metadata.get("help"):
            continue
        value = getattr(args, f.name)
        if value is None and not _unwrap(hints[f.name])[1]:
            continue
        values[f.name] = value
    try:
        return cls(**values)
    except ValidationError as exc:  # a value out of its bounds: the flag's name and pydantic's reason
        flags = {f.name: _flag(f) for f in dataclasses.fields(cls)}
        problems = [f"{flags.get(str(e['loc'][0]), e['loc'][0]) if e['loc'] else cls.__name__}: {e['msg']}"
                    for e in exc.errors()]
        raise SystemExit("rlgate: " + "; ".join(problems)) from None
