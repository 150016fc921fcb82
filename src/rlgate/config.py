"""Gateway configuration: every knob and limit, with its default, in one place."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass
class GatewayConfig:
    admin_key: str  # required for control routes; compared in constant time, never logged
    capacity_mode: Literal["unlimited", "granted"] = "unlimited"  # granted: only /grant_capacity admits
    trajectory_mode: Literal["token_exact", "rerender"] = "token_exact"  # default per session
    model_family: str | None = None  # chat/families name (--renderer); None: detected from the checkpoint
    tool_parser: str | None = "auto"  # registry name; "auto": the model family's; None disables tool-call parsing
    reasoning_parser: str | None = "auto"  # e.g. "think"; "auto": the family's; None leaves reasoning in content
    default_max_tokens: int = 512  # when a request sets no max tokens
    max_tokens_cap: int | None = None  # hard cap on generated tokens per request (None: context only)
    context_length: int | None = None  # None: the engine's max_context_length
    stop_token_ids: list[int] | None = None  # None: tokenizer eos + generation_config eos
    model_name: str = "rlgate"  # what /v1/models lists and responses echo when not given
    session_idle_timeout: float = 3600.0  # seconds without a request before the sweeper ends a session
    sweep_interval: float = 60.0  # how often the idle sweeper runs
    max_sessions: int = 10_000  # open (active) sessions at once; more -> 429
    max_stored_sessions: int = 100_000  # sessions held in any state (active, ended, interrupted); more -> 429
    max_interactions_per_session: int = 10_000  # more -> 429
    max_concurrent_requests_per_session: int = 64  # generations in flight for one session key; more -> 429
    max_messages_per_request: int = 10_000  # messages in one generation request; more -> 400
    max_tools: int = 512  # tools offered in one request; more -> 400
    max_stop_sequences: int = 16  # stop strings in one request; more -> 400
    max_body_bytes: int = 32 * 1024 * 1024  # larger request bodies -> 413 (chunked bodies too)
    retain_exported: float = 0.0  # seconds to keep an exported session for audit (0: drop at export)
    shutdown_timeout: float = 30.0  # SIGTERM: seconds in-flight requests get to finish before being aborted
    cors_origins: list[str] = field(default_factory=list)  # empty: no CORS headers at all
    stream_keepalive_interval: float = 10.0  # seconds without a streamed event before a keep-alive (0: never)
    image_placeholder: str = "<image>"  # informational: what text-only templates render for an image
    # ---- hardening (docs/operations.md "Limits", docs/security.md) ----
    allow_template_override: bool = field(default=False, metadata={"help": (
        "let clients set reserved chat_template_kwargs (chat_template, tokenize, ...): only for trusted "
        "clients; their templates then render in a worker bounded by --render-timeout")})
    render_timeout: float = field(default=30.0, metadata={"help": (
        "seconds a request's prompt may take to render and tokenize in a worker thread; more -> 503")})
    render_workers: int = field(default=2, metadata={"help": (
        "worker threads that render and tokenize large prompts (small ones stay on the event loop)")})
    max_json_depth: int = field(default=64, metadata={"help": "nesting depth of a request body; deeper -> 400"})
    max_image_bytes: int = field(default=10 * 1024 * 1024, metadata={"help": (
        "size of one image (base64 data or URL) in a request; larger -> 413")})
    max_image_bytes_per_session: int = field(default=64 * 1024 * 1024, metadata={"help": (
        "image bytes one session may record (each image counted where the store writes it); more -> 413")})
    rate_limit_per_key: float = field(default=0.0, metadata={"help": (
        "requests per second one session key may make (token bucket; 0: no limit); more -> 429 + Retry-After")})
    rate_limit_burst: int = field(default=32, metadata={"help": "token bucket size of --rate-limit-per-key"})
    header_timeout: float = field(default=10.0, metadata={"help": (
        "seconds a client has to send a request's headers (from the connection or the request's first byte)")})
    body_timeout: float = field(default=60.0, metadata={"help": (
        "seconds a client has to send a whole request body once its headers arrived; slower -> 408")})
    max_buffered_body_bytes: int = field(default=512 * 1024 * 1024, metadata={"help": (
        "request bodies held in memory at once, all requests together; more -> 503 server_busy")})
    max_connections: int = field(default=2048, metadata={"help": (
        "open HTTP connections; more are answered 503 and closed (lowered to fit the open-file limit)")})

    # ---- metrics, silent-failure guards and the viewer (docs/operations.md, "Metrics and guards")
    metrics_port: int | None = field(default=None, metadata={
        "help": "also serve GET /metrics without a key on this port (a separate bind for scrapers); "
                "None: only the admin-key /metrics on the main port"})
    metrics_host: str = field(default="127.0.0.1", metadata={"help": "address of the --metrics-port bind"})
    ui: bool = field(default=False, metadata={
        "help": "serve the trajectory viewer at /ui (admin key required: login form or Authorization header)"})
    ui_login_ttl: float = field(default=12 * 3600.0, metadata={
        "help": "seconds a /ui login cookie stays valid"})
    guard_window: int = field(default=500, metadata={
        "help": "observations each silent-failure guard looks back over (a reply, an export, a store poll)"})
    guard_min_events: int = field(default=20, metadata={
        "help": "events a guard needs in its window before its ratio can raise an alarm"})
    guard_poll_interval: float = field(default=5.0, metadata={
        "help": "seconds between polls of the store's write counters (store guard, alarms without traffic)"})
    guard_tool_parse_failure_ratio: float = field(default=0.1, metadata={
        "help": "alarm when more than this fraction of tool-call blocks the parser met did not parse"})
    guard_unparsed_tool_markup_ratio: float = field(default=0.05, metadata={
        "help": "alarm when more than this fraction of replies show tool-call markup as text"})
    guard_empty_reply_ratio: float = field(default=0.1, metadata={
        "help": "alarm when more than this fraction of replies are empty (no text, reasoning or tool call)"})
    guard_fork_ratio: float = field(default=0.25, metadata={
        "help": "alarm when more than this fraction of follow-up turns fork instead of extending a parent"})
    guard_unaligned_turn_ratio: float = field(default=0.05, metadata={
        "help": "alarm when more than this fraction of turns in concat exports are unaligned (no loss)"})
    guard_missing_reward_ratio: float = field(default=0.05, metadata={
        "help": "alarm when more than this fraction of exported samples have no reward"})
    guard_stale_lag: int = field(default=4, metadata={
        "help": "a generated token is stale at export when the weights moved more than this many versions since"})
    guard_stale_token_ratio: float = field(default=0.1, metadata={
        "help": "alarm when more than this fraction of exported generated tokens are stale"})
    guard_abort_ratio: float = field(default=0.1, metadata={
        "help": "alarm when more than this fraction of generations are aborted, fail or are cut by a restart"})
    guard_store_failure_ratio: float = field(default=0.0, metadata={
        "help": "alarm when more than this fraction of store writes fail (0: any failure)"})

@dataclass
class ClusterConfig:
    """Gateway replicas on Ray behind one router (``rlgate serve --replicas N``; see docs/scale-out.md)."""

    replicas: int = field(default=0, metadata={
        "help": "run N gateway replicas as Ray actors behind a router on --host/--port (0: one plain gateway)"})
    ray_address: str | None = field(default=None, metadata={
        "help": "join this Ray cluster (e.g. 'auto' or HOST:6379) instead of starting a local one"})
    replica_num_cpus: float = field(default=1.0, metadata={"help": "CPUs Ray reserves for each replica"})
    replica_num_gpus: float = field(default=0.0, metadata={
        "help": "GPUs Ray reserves for each replica (1 with --engine local on GPU nodes)"})
    replica_host: str = field(default="127.0.0.1", metadata={
        "help": "interface each replica's HTTP port binds; 0.0.0.0 when replicas run on other nodes"})
    ray_num_cpus: int | None = field(default=None, metadata={
        "help": "local Ray cluster only: CPUs it may schedule (default: the machine's)"})
    object_store_mb: int = field(default=128, metadata={
        "help": "local Ray cluster only: object store size in MiB (the data plane does not use it)"})
    refresh_interval: float = field(default=0.5, metadata={
        "help": "seconds between the router's refreshes of replica state and load"})
    namespace: str = field(default="rlgate", metadata={"help": "Ray namespace of the replica actors"})
