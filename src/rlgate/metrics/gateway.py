"""The gateway's Prometheus metrics and silent-failure guards (one instance per app).

Everything lives in a per-app :class:`prometheus_client.CollectorRegistry` (never the
global default registry), so tests build as many gateways as they like. The core calls
the ``record_*`` methods as things happen; values that already exist elsewhere (session
counts, engine batch, store writes) are read at scrape time by a collector, so there is
one source of truth for each number. docs/operations.md lists every metric.

Cost: a generation records ~10 label lookups and observations: ~1% of a request's time in
benchmarks/metrics_overhead.py (recording calls vs whole requests, same run).
"""

from __future__ import annotations

import logging
import math
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from rlgate.config import GatewayConfig
from rlgate.metrics.guards import Guard, GuardSet, GuardSpec

log = logging.getLogger("rlgate.metrics")

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
LAG_BUCKETS = (0, 1, 2, 3, 4, 6, 8, 16, 32, 64)
APIS = ("chat", "responses", "messages")
FORK_REASONS = ("no_prefix_match", "template_not_incremental")  # series created at 0; others appear when seen


@dataclass
class GenerationOutcome:
    """What the core reports when a generation ends (completed, aborted or failed)."""

    api: str  # chat | responses | messages
    streamed: bool
    finish_reason: str  # stop | length | tool_calls | abort | error
    prompt_tokens: int
    completion_tokens: int
    ttft_s: float | None  # request prepared -> first generated token (None: no token)
    total_s: float  # request prepared -> end of generation
    parser: str | None = None  # the tool parser that ran (None: tool parsing was off)
    tool_calls: int = 0  # calls the parser returned
    parse_failures: int = 0  # blocks in the parser's own format it left as text (could not parse)
    unparsed_markup: int = 0  # tool-call markup blocks of any known format left in the visible text
    empty: bool = False  # a finished reply with no text, reasoning or tool call
    relation: str | None = None  # of the recorded interaction (None: not recorded, store=false)
    fork_reason: str | None = None
    cut_by_operator_cap: bool = False  # finish "length" at --default-max-tokens / --max-tokens-cap, not the client's


@dataclass
class LiveSources:
    """Callables read at scrape time (each may be None)."""

    session_counters: Callable[[], Mapping[str, int]] | None = None  # SessionManager.metrics
    sessions_by_status: Callable[[], Mapping[str, int]] | None = None
    engine_version: Callable[[], int] | None = None
    engine_stats: Callable[[], Mapping[str, float]] | None = None  # LocalEngine.stats()
    store_stats: Callable[[], Mapping[str, int]] | None = None  # SQLiteStore.stats


WEIGHT_CHECK_GUARD = GuardSpec("weight_check", "weight updates whose engine did not serve the checkpoint's probe "
                               "(the update failed; the previous weights serve)", "checked weight updates", 0.0, 1)


def guard_specs(c: GatewayConfig) -> list[GuardSpec]:
    m = c.guard_min_events
    return [
        GuardSpec("tool_parse_failures", "tool-call blocks the parser could not parse", "tool-call blocks",
                  c.guard_tool_parse_failure_ratio, m),
        GuardSpec("unparsed_tool_markup", "replies showing tool-call markup as text", "replies",
                  c.guard_unparsed_tool_markup_ratio, m),
        GuardSpec("empty_replies", "empty replies (no text, reasoning or tool call)", "replies",
                  c.guard_empty_reply_ratio, m),
        GuardSpec("forks", "follow-up turns that forked instead of extending a parent", "follow-up turns",
                  c.guard_fork_ratio, m),
        GuardSpec("unaligned_turns", "unaligned turns in concat exports (trained without loss)", "turns",
                  c.guard_unaligned_turn_ratio, m),
        GuardSpec("missing_rewards", "exported samples without a reward", "samples",
                  c.guard_missing_reward_ratio, m),
        GuardSpec("stale_tokens", f"exported tokens more than {c.guard_stale_lag} weight versions old",
                  "generated tokens", c.guard_stale_token_ratio, m),
        GuardSpec("aborted_generations", "generations aborted, failed or cut by a restart", "generations",
                  c.guard_abort_ratio, m),
        GuardSpec("store_write_failures", "store writes that failed", "writes", c.guard_store_failure_ratio, 1),
        GuardSpec("default_cap_cuts", "replies cut by a token cap the client never asked for (--default-max-tokens, "
                  "--max-tokens-cap)", "replies", c.guard_default_cap_cut_ratio, m),
    ]


class _LagHistogram:
    """A histogram of integer lags observed many at a time (one export = thousands of tokens)."""

    def __init__(self, name: str, doc: str, bounds: Sequence[int]) -> None:
        self.name, self.doc, self.bounds = name, doc, tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # last: +Inf
        self.total = 0.0

    def observe_counts(self, lags: Mapping[int, int]) -> None:
        for lag, n in lags.items():
            i = next((k for k, b in enumerate(self.bounds) if lag <= b), len(self.bounds))
            self.counts[i] += n
            self.total += lag * n

    def family(self) -> Metric:
        cumulative, buckets = 0, []
        for b, n in zip([*map(str, self.bounds), "+Inf"], self.counts, strict=True):
            cumulative += n
            buckets.append((b, cumulative))
        return HistogramMetricFamily(self.name, self.doc, buckets=buckets, sum_value=self.total)


class _LiveCollector:
    """Reads values that are kept elsewhere, at scrape time."""

    def __init__(self, metrics: GatewayMetrics) -> None:
        self.m = metrics

    def collect(self) -> Iterator[Metric]:
        m, src = self.m, self.m.sources
        yield m.version_lag.family()
        firing = GaugeMetricFamily("rlgate_guard_firing", "1 while the silent-failure guard is raising its "
                                   "alarm (see /health for the reason), else 0", labels=["guard"])
        ratio = GaugeMetricFamily("rlgate_guard_ratio", "failure ratio over the guard's window", labels=["guard"])
        alarms = CounterMetricFamily("rlgate_guard_alarms", "times the guard started firing", labels=["guard"])
        for name, guard in m.guards.guards.items():
            firing.add_metric([name], 1.0 if guard.firing else 0.0)
            ratio.add_metric([name], guard.ratio)
            alarms.add_metric([name], guard.alarms)
        yield from (firing, ratio, alarms)
        if src.session_counters is not None:
            for key, value in src.session_counters().items():
                yield CounterMetricFamily(f"rlgate_{key}", SESSION_COUNTER_HELP.get(key, key.replace("_", " ")),
                                          value=value)
        if src.sessions_by_status is not None:
            g = GaugeMetricFamily("rlgate_sessions", "sessions held by the gateway, by status "
                                  "(active, ended, interrupted, exported = kept for audit)", labels=["status"])
            counts = src.sessions_by_status()
            for status in ("active", "ended", "interrupted", "exported"):
                g.add_metric([status], counts.get(status, 0))
            yield g
        if src.engine_version is not None:
            yield GaugeMetricFamily("rlgate_engine_weight_version", "weight version the engine serves",
                                    value=src.engine_version())
        if src.engine_stats is not None:
            yield from _engine_families(src.engine_stats())
        st = src.store_stats() if src.store_stats is not None else {}  # {}: a store that keeps nothing
        yield CounterMetricFamily("rlgate_store_writes", "store writes committed", value=st.get("writes", 0))
        yield CounterMetricFamily("rlgate_store_write_failures", "store writes that failed (the request "
                                  "that made them got a 503)", value=st.get("failed_writes", 0))


SESSION_COUNTER_HELP = {
    "sessions_started": "sessions started",
    "sessions_ended": "sessions ended (by the client, the admin or the idle sweeper)",
    "sessions_exported": "sessions exported",
    "sessions_swept": "sessions ended by the idle sweeper",
    "sessions_interrupted": "sessions that were active when the gateway stopped (found at restart)",
    "interactions_completed": "interactions recorded as completed (aborted ones included)",
    "interactions_failed": "interactions that failed (engine error, malformed output, restart)",
    "interactions_aborted": "completed interactions cut short (client disconnect, shutdown)",
}


def _engine_families(st: Mapping[str, float]) -> Iterator[Metric]:
    running, capacity = st.get("running", 0), st.get("max_batch_size", 0)
    yield GaugeMetricFamily("rlgate_engine_running_requests", "requests holding a row of the engine's batch",
                            value=running)
    yield GaugeMetricFamily("rlgate_engine_waiting_requests", "requests queued for a batch row",
                            value=st.get("waiting", 0))
    if capacity:
        yield GaugeMetricFamily("rlgate_engine_batch_capacity", "rows the engine's batch can hold", value=capacity)
        yield GaugeMetricFamily("rlgate_engine_batch_occupancy", "running requests / batch capacity (now)",
                                value=running / capacity)
    if "decode_steps" in st:
        yield CounterMetricFamily("rlgate_engine_decode_steps", "batched decoding steps run",
                                  value=st["decode_steps"])
        yield CounterMetricFamily("rlgate_engine_decode_rows", "rows decoded, summed over steps "
                                  "(rate / rate of decode_steps = mean batch size)", value=st["decode_rows"])


class GatewayMetrics:
    """Counters, histograms and guards of one gateway (see module docstring)."""

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.registry = CollectorRegistry()
        r = self.registry
        self.sources = LiveSources()
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}  # _child's memo
        # -- traffic
        self.requests = Counter("rlgate_requests", "HTTP requests answered, by surface (chat, responses, messages, "
                                "control, metrics, ui, other), status code and whether the answer was a stream",
                                ["surface", "status", "streamed"], registry=r)
        self.generations = Counter("rlgate_generations", "generations that ended, by surface and finish reason "
                                   "(stop, length, tool_calls, abort, error)", ["api", "finish_reason"], registry=r)
        self.queue_seconds = Histogram("rlgate_queue_seconds", "time a request waited for a row in the "
                                       "engine's batch (local engine)", buckets=LATENCY_BUCKETS, registry=r)
        self.ttft_seconds = Histogram("rlgate_time_to_first_token_seconds", "request prepared -> first "
                                      "generated token", ["api", "streamed"], buckets=LATENCY_BUCKETS, registry=r)
        self.total_seconds = Histogram("rlgate_generation_seconds", "request prepared -> generation done",
                                       ["api", "streamed"], buckets=LATENCY_BUCKETS, registry=r)
        self.prompt_tokens = Counter("rlgate_prompt_tokens", "prompt tokens sent to the engine", ["api"], registry=r)
        self.generated_tokens = Counter("rlgate_generated_tokens", "tokens generated (recorded in trajectories)",
                                        ["api"], registry=r)
        # -- silent failures
        self.tool_parse_attempts = Counter("rlgate_tool_parse_attempts", "tool-call blocks a parser met "
                                           "(parsed or not)", ["parser"], registry=r)
        self.tool_parse_failures = Counter("rlgate_tool_parse_failures", "tool-call blocks a parser met but "
                                           "could not parse (left as text in the reply)", ["parser"], registry=r)
        self.unparsed_markup = Counter("rlgate_unparsed_tool_markup_replies", "replies whose visible text holds "
                                       "tool-call markup (parse failure, wrong parser, or parsing off: "
                                       "parser=\"none\")", ["parser"], registry=r)
        self.empty_replies = Counter("rlgate_empty_replies", "finished replies with no text, reasoning or tool "
                                     "call", ["api"], registry=r)
        self.operator_cap_cuts = Counter("rlgate_replies_cut_by_operator_cap", "replies cut at a token cap the client "
                                         "never asked for (--default-max-tokens, --max-tokens-cap)", ["api"],
                                         registry=r)
        self.template_dropped = Counter("rlgate_template_dropped", "requests whose chat template left out a part "
                                        "of them (tools, tool_calls, tool_results, reasoning, images): the model "
                                        "never saw it", ["part", "api"], registry=r)
        self.turns = Counter("rlgate_turns", "recorded interactions by relation to the session's tree "
                             "(root, extend, fork)", ["relation"], registry=r)
        self.forks = Counter("rlgate_forks", "turns that started a new branch, by fork_reason", ["reason"],
                             registry=r)
        self.exported_samples = Counter("rlgate_exported_samples", "samples exported", ["style"], registry=r)
        self.missing_rewards = Counter("rlgate_exported_samples_without_reward", "exported samples whose reward "
                                       "is None (never rewarded, nor any descendant)", ["style"], registry=r)
        self.concat_turns = Counter("rlgate_exported_concat_turns", "turns inside concat samples", registry=r)
        self.unaligned_turns = Counter("rlgate_unaligned_turns", "turns of concat samples whose tokens are not a "
                                       "prefix of the leaf's (trained without loss)", registry=r)
        self.stale_tokens = Counter("rlgate_stale_tokens", "exported generated tokens more than guard_stale_lag "
                                    "weight versions older than the engine at export", registry=r)
        self.interrupted = Counter("rlgate_interrupted_generations", "generations that did not end normally, by "
                                   "reason (client_abort, error, restart)", ["reason"], registry=r)
        self.version_lag = _LagHistogram("rlgate_token_version_lag", "weight versions between the engine at "
                                         "export and each exported generated token", LAG_BUCKETS)
        self.weight_checks = Counter("rlgate_weight_checks", "weight updates checked against the checkpoint's "
                                     "probe (what the engine serves after loading it), by result (pass, fail, "
                                     "skipped: no probe)", ["result"], registry=r)
        self.weight_check_diff = Gauge("rlgate_weight_check_max_diff", "largest |served - probe| logprob "
                                       "difference of the last checked weight update", registry=r)
        self.guards = GuardSet(guard_specs(config), config.guard_window, details={"forks": self._fork_detail})
        # firing while the last checked weight update failed its check (until one passes)
        self.guards.guards[WEIGHT_CHECK_GUARD.name] = Guard(WEIGHT_CHECK_GUARD, 1)
        self._fork_reasons: Tally[str] = Tally()
        self._store_seen = (0, 0)  # (writes, failed_writes) at the last poll
        r.register(_LiveCollector(self))
        self._zero_series()

    def _zero_series(self) -> None:
        """Create the known label sets at 0, so every guard's series exists (and rate() works) before
        its first failure."""
        # "auto": the model family's parser, resolved by the GenerationService (its series appear on first use)
        parser = self.config.tool_parser if self.config.tool_parser != "auto" else None
        for api in APIS:
            self.empty_replies.labels(api)
        for name in (parser, "none"):
            if name:
                self.unparsed_markup.labels(name)
        if parser:
            self.tool_parse_attempts.labels(parser)
            self.tool_parse_failures.labels(parser)
        for reason in FORK_REASONS:
            self.forks.labels(reason)
        for api in APIS:
            self.template_dropped.labels("tools", api)
        for reason in ("client_abort", "error", "restart"):
            self.interrupted.labels(reason)
        for style in ("individual", "concat"):
            self.exported_samples.labels(style)
            self.missing_rewards.labels(style)
        for result in ("pass", "fail", "skipped"):
            self.weight_checks.labels(result)

    # ------------------------------------------------------------------ wiring

    def bind(self, **sources: Any) -> None:
        """Set scrape-time sources (see :class:`LiveSources`)."""
        for k, v in sources.items():
            if not hasattr(self.sources, k):
                raise TypeError(f"unknown metrics source {k!r}")
            setattr(self.sources, k, v)

    # ------------------------------------------------------------------ events

    def _child(self, metric: Any, *values: str) -> Any:
        """``metric.labels(*values)``, remembered: ``labels`` validates and locks on every call,
        a dict lookup does not. Label values are bounded (docs/operations.md), so is this."""
        key = (id(metric), values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child

    def record_request(self, surface: str, status: int, streamed: bool) -> None:
        """``status`` 0: no answer was sent (label "none")."""
        self._child(self.requests, surface, str(status) if status else "none", "true" if streamed else "false").inc()

    def record_template_dropped(self, part: str, api: str) -> None:
        self._child(self.template_dropped, part, api).inc()

    def record_generation(self, o: GenerationOutcome) -> None:
        streamed = "true" if o.streamed else "false"
        self._child(self.generations, o.api, o.finish_reason).inc()
        self._child(self.prompt_tokens, o.api).inc(o.prompt_tokens)
        self._child(self.generated_tokens, o.api).inc(o.completion_tokens)
        if o.ttft_s is not None:
            self._child(self.ttft_seconds, o.api, streamed).observe(o.ttft_s)
        self._child(self.total_seconds, o.api, streamed).observe(o.total_s)
        g = self.guards
        interrupted = o.finish_reason in ("abort", "error")
        if interrupted:
            self._child(self.interrupted, "client_abort" if o.finish_reason == "abort" else "error").inc()
        g.observe("aborted_generations", int(interrupted), 1)
        if o.finish_reason == "error":
            return  # nothing was recorded as a reply
        if o.parser is not None:
            blocks = o.tool_calls + o.parse_failures
            if blocks:
                self._child(self.tool_parse_attempts, o.parser).inc(blocks)
                if o.parse_failures:
                    self._child(self.tool_parse_failures, o.parser).inc(o.parse_failures)
                g.observe("tool_parse_failures", o.parse_failures, blocks)
        if o.unparsed_markup:
            self._child(self.unparsed_markup, o.parser or "none").inc()
        g.observe("unparsed_tool_markup", int(o.unparsed_markup > 0), 1)
        if o.finish_reason != "abort":
            if o.cut_by_operator_cap:
                self._child(self.operator_cap_cuts, o.api).inc()
            g.observe("default_cap_cuts", int(o.cut_by_operator_cap), 1)
            if o.empty:
                self._child(self.empty_replies, o.api).inc()
            g.observe("empty_replies", int(o.empty), 1)
        if o.relation is not None:
            self._child(self.turns, o.relation).inc()
            if o.relation == "fork":
                reason = o.fork_reason or "unknown"
                self._child(self.forks, reason).inc()
                self._fork_reasons[reason] += 1
            if o.relation != "root":  # a compacted history is the client's choice, not a failure to match
                g.observe("forks", int(o.relation == "fork" and o.fork_reason != "compacted"), 1)

    def record_export(self, samples: Iterable[Mapping[str, Any]], stats: Mapping[str, int], style: str,
                      current_version: int | None) -> None:
        n = missing = generated = stale = turns = 0
        lags: Tally[int] = Tally()
        limit = self.config.guard_stale_lag
        for s in samples:
            n += 1
            turns += len(s.get("chain") or ())
            if s.get("reward") is None:
                missing += 1
            if current_version is None:
                continue
            versions = Tally(v for v, m in zip(s["versions"], s["loss_mask"], strict=False) if m)
            for v, k in versions.items():
                lag = max(0, current_version - v)
                lags[lag] += k
                generated += k
                if lag > limit:
                    stale += k
        self._child(self.exported_samples, style).inc(n)
        if missing:
            self._child(self.missing_rewards, style).inc(missing)
        self.guards.observe("missing_rewards", missing, n)
        if current_version is not None:
            self.version_lag.observe_counts(lags)
            if stale:
                self.stale_tokens.inc(stale)
            self.guards.observe("stale_tokens", stale, generated)
        if style == "concat":
            unaligned = int(stats.get("unaligned_turns", 0))
            self.concat_turns.inc(turns)
            if unaligned:
                self.unaligned_turns.inc(unaligned)
            self.guards.observe("unaligned_turns", unaligned, turns)

    def record_weight_check(self, result: str, max_diff: float | None) -> None:
        """A weight update's check: ``pass``, ``fail`` or ``skipped`` (engine/weight_check.py)."""
        self._child(self.weight_checks, result).inc()
        if result == "skipped":
            return
        if max_diff is not None and math.isfinite(max_diff):
            self.weight_check_diff.set(max_diff)
        self.guards.observe(WEIGHT_CHECK_GUARD.name, int(result == "fail"), 1)

    def record_restart(self, interrupted_generations: int) -> None:
        """Generations found pending at restart (cut by the stop)."""
        if interrupted_generations:
            self._child(self.interrupted, "restart").inc(interrupted_generations)
            self.guards.observe("aborted_generations", interrupted_generations, interrupted_generations)

    def poll(self) -> None:
        """Read counters kept elsewhere that guards watch (the store's writes)."""
        if self.sources.store_stats is None:
            return
        st = self.sources.store_stats()
        writes, failed = int(st.get("writes", 0)), int(st.get("failed_writes", 0))
        w0, f0 = self._store_seen
        self._store_seen = (writes, failed)
        self.guards.observe("store_write_failures", failed - f0, (writes - w0) + (failed - f0))

    # ------------------------------------------------------------------ reading

    def degraded(self) -> list[dict[str, str]]:
        self.poll()
        return self.guards.degraded()

    def exposition(self) -> bytes:
        """The Prometheus text format of everything in this gateway's registry."""
        self.poll()
        return generate_latest(self.registry)

    def _fork_detail(self) -> str:
        if not self._fork_reasons:
            return ""
        return "by reason: " + ", ".join(f"{k} {n}" for k, n in self._fork_reasons.most_common())
