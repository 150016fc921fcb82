"""The serving core shared by every API surface.

A surface converts its wire request into a :class:`ChatRequest` and calls
:meth:`GenerationService.prepare` (which validates, finds the parent interaction,
builds the prompt token ids and registers a pending interaction — all errors happen
here, before any response byte is sent), then iterates :meth:`GenerationService.run`,
which yields :class:`~rlgate.chat.output.OutputEvent` s while the engine generates and
finally one :class:`Finished`. Streaming surfaces forward events as they come;
non-streaming surfaces collect them. Both record the same trajectory.

If the consumer stops early (client disconnect), the engine request is aborted and
the interaction is kept with ``finish_reason="abort"`` and the tokens generated so far.

(Past ~500 lines on purpose: prepare -> run -> record is one state machine over one pending
interaction; split across files, its invariants would be read in three places.)
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import random
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import Any

from rlgate.chat.conversation import DigestChain, Message, tools_digest
from rlgate.chat.families.base import REASONING_TAIL, BridgeError, ModelFamily, ParentTurn, PromptRenderer, TemplateError
from rlgate.chat.families.registry import resolve_family
from rlgate.chat.output import OutputAssembler, OutputEvent, openai_call_id
from rlgate.chat.parsers import get_reasoning_parser, get_tool_parser, unparsed_tool_blocks
from rlgate.chat.prompt_bounds import PromptTooLong, max_token_chars, reserved_template_kwargs
from rlgate.chat.template_support import TemplateSupport, dropped
from rlgate.chat.token_text import decode
from rlgate.chat.tool_prompt import tool_prompt_renderer
from rlgate.config import GatewayConfig
from rlgate.core.limits import (
    check_images,
    check_request_limits,
    check_template_kwargs,
    image_size,
    images,
    request_chars,
)
from rlgate.core.policies import PolicyRegistry
from rlgate.core.render_pool import RenderPool
from rlgate.core.request import ChatRequest
from rlgate.core.request_scope import current_scope, store_refusal
from rlgate.core.sessions import SessionManager
from rlgate.core.shared_messages import share_prefix
from rlgate.core.template_drops import TemplateDrops
from rlgate.engine.base import Engine, EngineError, GenerateRequest, SamplingParams
from rlgate.errors import ContextLengthExceeded, InvalidRequest, PayloadTooLarge, engine_failure
from rlgate.metrics.gateway import GatewayMetrics, GenerationOutcome
from rlgate.store.base import StoreError
from rlgate.trajectory.flags import is_empty_reply
from rlgate.trajectory.interaction import Interaction, Session
from rlgate.trajectory.matchers import best_match, load_matchers
from rlgate.trajectory.tree import find_parent

log = logging.getLogger("rlgate.generation")

# Prompts with fewer characters (message text and tool-call arguments, plus the canonical JSON
# of the tools) render and tokenize on the event loop (well under a millisecond); longer ones,
# and any with a client-supplied template, on the render pool.
INLINE_CHARS = 32 * 1024
# A tokenizer's normalizer (NFC, NFKC...) may merge up to three characters into one before
# the vocabulary sees them: the character bound on prompts allows for it.
NORMALIZER_SLACK = 3
# A retried request supersedes an earlier attempt among the session's last this many interactions.
RETRY_LOOKBACK = 64


@dataclass
class BuiltPrompt:
    """What :meth:`GenerationService.build_prompt` returns."""

    prompt_ids: list[int]
    interaction: Interaction  # unsaved; its id and api are set by prepare
    chain: DigestChain  # digest of the request messages (+ reply = the interaction's prefix key)
    image_bytes: int  # image bytes the interaction adds to its session (not shared with the parent)


@dataclass
class Prepared:
    """A validated request, ready to generate."""

    session: Session
    request: ChatRequest
    interaction_id: str
    api: str
    prompt_ids: list[int]
    sampling: SamplingParams
    interaction: Interaction  # recorded whatever the client's store flag says
    call_id: Callable[[], str]
    chain: DigestChain  # digest of the request messages; + reply = the interaction's prefix key
    received_at: float = field(default_factory=time.perf_counter)  # for the latency metrics
    streamed: bool = True  # complete() sets False (metrics label)
    reported: bool = False  # the outcome went to the metrics (once per run)
    image_bytes: int = 0  # counted against max_image_bytes_per_session once recorded
    operator_capped: bool = False  # max new tokens set by an operator cap below what the client allows
    adapter: str | None = None  # the engine adapter of the policy that serves it (core/policies.py)


@dataclass
class Finished:
    """The last event of a run."""

    interaction_id: str
    content: str
    reasoning: str
    tool_calls: list[Any]
    finish_reason: str  # stop | length | tool_calls | abort
    stop_kind: str  # stop_token | stop_string | length | abort
    stop_sequence: str | None
    prompt_tokens: int
    completion_tokens: int
    message: Message


def serving_renderer(config: GatewayConfig, tokenizer: Any, family: ModelFamily | None = None
                     ) -> tuple[ModelFamily, str | None, PromptRenderer, TemplateSupport]:
    """(family, active tool parser, prompt renderer, what its template shows): the gateway's and a warm start's
    (train/warm_start.py), so both make the same tokens. ``ValueError``: a setting this model cannot be served with."""
    family = family if family is not None else resolve_family(tokenizer, config.model_family)
    tool_parser = family.tool_parser if config.tool_parser == "auto" else config.tool_parser
    renderer, support = tool_prompt_renderer(family.renderer(tokenizer), tokenizer, config.tool_prompt, tool_parser,
                                             family.title)
    return family, tool_parser, renderer, support


class GenerationService:
    def __init__(
        self,
        *,
        config: GatewayConfig,
        engine: Engine,
        tokenizer: Any,
        sessions: SessionManager,
        stop_token_ids: list[int],
        metrics: GatewayMetrics | None = None,
        family: ModelFamily | None = None,
        policies: PolicyRegistry | None = None,
    ) -> None:
        self.config = config
        self.policies = policies or PolicyRegistry(config, engine, sessions.store, lambda: sessions.sessions)
        self.metrics = metrics if metrics is not None else sessions.gateway_metrics
        self.engine = engine
        self.tokenizer = tokenizer
        self.family, self.tool_parser, self.renderer, self.template_support = serving_renderer(config, tokenizer, family)
        self.drops = TemplateDrops(self.metrics, self.family.title)
        # Bounds of every family's renderer (issue 15): properties of the tokenizer, not the renderer.
        self.reserved_kwargs = reserved_template_kwargs(tokenizer)
        backend = getattr(tokenizer, "backend_tokenizer", None)
        slack = 1 if backend is not None and backend.normalizer is None else NORMALIZER_SLACK
        self._chars_per_token = max_token_chars(tokenizer) * slack
        self.render_pool = RenderPool(config.render_workers, config.render_timeout)
        self.inline_chars = INLINE_CHARS
        self.sessions = sessions
        self.matchers = load_matchers(config.history_matchers)  # clients that re-serialise replies
        self.stop_token_ids = tuple(dict.fromkeys([*stop_token_ids, *self.family.stop_token_ids(tokenizer)]))
        self.reasoning_parser = (
            self.family.reasoning_parser if config.reasoning_parser == "auto" else config.reasoning_parser
        )
        # Called with each completed (recorded, not failed) turn, on the event loop, before its final event
        # is sent; must not block (online training starts its live groups here: online/groups.py).
        self.completed_listeners: list[Callable[[Prepared], None]] = []
        # Interaction ids: 128 random bits each, from a generator seeded by the OS once (uuid4
        # asked the OS for every id: a syscall per request). Ids name turns; they grant nothing.
        self._ids = random.Random(os.urandom(32))
        # reasoning_open's answer by the prompt's last tokens (renderers read at most the last 8:
        # the generation prompt, the same for almost every request); bounded
        self._reasoning_open: dict[tuple[int, ...], bool] = {}
        for name, get in ((self.tool_parser, get_tool_parser), (self.reasoning_parser, get_reasoning_parser)):
            if name:  # validate parser names once, at startup
                get(name)

    @property
    def context_length(self) -> int:
        return self.config.context_length or self.engine.max_context_length

    # ------------------------------------------------------------------ prompt

    def max_prompt_chars(self, tokens: int) -> int:
        """The most characters a text of ``tokens`` tokens can have (any longer cannot fit)."""
        return max(0, tokens) * self._chars_per_token

    async def build_prompt(self, session: Session, req: ChatRequest) -> BuiltPrompt:
        """Check the request's limits, find the parent, build the prompt ids; return them with an
        unsaved interaction and the digest chain of the request's messages (extended with the
        reply on completion). Large prompts are rendered and tokenized on the render pool."""
        check_request_limits(self.config, req)
        check_template_kwargs(self.config, req, self.reserved_kwargs)
        check_images(self.config, req)
        ctx = self.context_length
        chars = request_chars(req)
        if chars > self.max_prompt_chars(ctx):  # early: before hashing, rendering or tokenizing
            raise self._too_long(chars)
        context_key, tools_chars = tools_digest(req.tools, req.template_kwargs)
        parent, covered, chain = find_parent(session, context_key, req.messages)
        fork_hint = None
        if self.matchers and session.interactions:
            found = best_match(self.matchers, session, context_key, req.messages, covered)
            if found is not None and found.parent is not None:
                parent, covered = found.parent, found.covered  # the reply in the client's form
            elif found is not None and parent is None:
                fork_hint = found.fork_reason
        new_image_bytes = sum(image_size(p) for p in images(req.messages[covered:]))
        budget = self.config.max_image_bytes_per_session
        if new_image_bytes and session.image_bytes + new_image_bytes > budget:
            raise PayloadTooLarge(
                f"session {session.id} holds {session.image_bytes} bytes of images; {new_image_bytes} more would "
                f"exceed max_image_bytes_per_session={budget}", param="messages", code="session_image_budget_exceeded")
        if parent is not None:
            share_prefix(parent, req.messages, covered)
        relation = "extend" if parent is not None else ("fork" if session.interactions else "root")
        render = functools.partial(self._render, session, req, parent, covered, relation, context_key, fork_hint)
        try:
            # tools count towards the rendering's cost (not towards the prompt's lower bound: a
            # template may leave them out); a large tool list renders off the event loop
            if chars + tools_chars < self.inline_chars and "chat_template" not in req.template_kwargs:
                prompt, parent, relation, fork_reason = render()
            else:
                prompt, parent, relation, fork_reason = await self.render_pool.run(render)
        except PromptTooLong as exc:  # the rendered text (template included) cannot fit
            raise self._too_long(exc.chars, offset=exc.offset) from exc
        rendered = req.messages[covered:] if parent is not None and session.mode == "token_exact" else req.messages
        interaction = Interaction(
            id="",
            session_id=session.id,
            api="",
            messages=req.messages,
            tools=req.tools,
            prompt_ids=prompt,
            parent_id=parent.id if parent is not None else None,
            relation=relation,  # type: ignore[arg-type]
            fork_reason=fork_reason,
            context_key=context_key,
            template_dropped=dropped(self.template_support, rendered, req.tools),
        )
        return BuiltPrompt(prompt, interaction, chain, new_image_bytes)

    def _render(
        self, session: Session, req: ChatRequest, parent: Interaction | None, covered: int, relation: str,
        context_key: str, fork_hint: str | None = None,
    ) -> tuple[list[int], Interaction | None, str, str | None]:
        """Prompt ids, parent, relation, fork reason (``fork_hint``: a history matcher's, else
        no_prefix_match). Thread-safe: reads only completed (immutable) interactions and the
        session's locked render cache."""
        ctx = self.context_length
        fork_reason = None if parent is not None or relation == "root" else (fork_hint or "no_prefix_match")
        if parent is not None and session.mode == "token_exact":
            base = parent.prompt_ids + parent.output_ids
            try:
                bridge = self.renderer.bridge_ids(
                    parent=ParentTurn(parent.prompt_ids, parent.output_ids,
                                      parent.output_message,  # type: ignore[arg-type]
                                      self._stop_text(parent)),
                    leading_system=req.messages[0] if req.messages[0].role == "system" else None,
                    new_messages=req.messages[covered:],
                    tools=req.tools,
                    template_kwargs=req.template_kwargs,
                    cache_key=context_key,
                    cache=session.render_cache,
                    max_chars=self.max_prompt_chars(ctx - len(base)),
                )
                return base + bridge, parent, relation, fork_reason
            except PromptTooLong as exc:
                exc.offset = len(base)
                raise
            except (BridgeError, TemplateError) as exc:
                log.warning("session %s: %s; starting a new root", session.id, exc)
                parent, relation, fork_reason = None, "fork", "template_not_incremental"
        try:
            prompt = self.renderer.render_ids(req.messages, req.tools, req.template_kwargs,
                                              max_chars=self.max_prompt_chars(ctx))
        except TemplateError as exc:
            raise InvalidRequest(str(exc), param="messages") from exc
        return prompt, parent, relation, fork_reason

    def _too_long(self, chars: int, *, offset: int = 0) -> ContextLengthExceeded:
        """The refusal of a text of ``chars`` characters that cannot fit the context (after ``offset``
        tokens already in the prompt), without tokenizing it: it has at least chars / (the most
        characters a token covers) tokens."""
        at_least = offset + -(-chars // self._chars_per_token)
        ctx = self.context_length
        return ContextLengthExceeded(
            f"This model's maximum context length is {ctx} tokens. However, your messages have {chars} "
            f"characters, which is at least {at_least} tokens. Please reduce the length of the messages.",
            prompt_tokens=at_least, limit=ctx, param="messages")

    def _stop_text(self, parent: Interaction) -> str | None:
        if parent.stop_kind == "stop_token" and parent.output_ids and parent.output_ids[-1] in self.stop_token_ids:
            return decode(self.tokenizer, [parent.output_ids[-1]])
        return None

    # ------------------------------------------------------------------ prepare

    async def prepare(
        self,
        session: Session,
        req: ChatRequest,
        *,
        api: str,
        id_prefix: str,
        call_id: Callable[[], str] = openai_call_id,
    ) -> Prepared:
        received_at = time.perf_counter()
        self.sessions.require_generating(session)
        policy = self.policies.resolve(session, req.model)  # 404 / 400 before any work
        built = await self.build_prompt(session, req)
        prompt, interaction, chain = built.prompt_ids, built.interaction, built.chain
        ctx = self.context_length
        if len(prompt) >= ctx:
            raise ContextLengthExceeded(prompt_tokens=len(prompt), limit=ctx, param="messages")
        # What the client allows (its max tokens, its max_total_tokens, else the rest of the context, as
        # the OpenAI API and vLLM do), then the operator's caps; a reply cut by the latter is counted.
        max_new = ctx - len(prompt)
        if req.max_tokens is not None:
            max_new = min(max_new, req.max_tokens)
        if req.max_total_tokens is not None:
            max_new = min(max_new, req.max_total_tokens - len(prompt))
            if max_new < 1:
                raise ContextLengthExceeded(
                    f"max_total_tokens={req.max_total_tokens} leaves no room after the "
                    f"{len(prompt)}-token prompt",
                    prompt_tokens=len(prompt), limit=req.max_total_tokens, param="max_total_tokens",
                )
        client_max = max_new
        if req.max_tokens is None and self.config.default_max_tokens is not None:
            max_new = min(max_new, self.config.default_max_tokens)
        if self.config.max_tokens_cap is not None:
            max_new = min(max_new, self.config.max_tokens_cap)
        try:
            sampling = SamplingParams(
                max_new_tokens=max_new,
                temperature=req.temperature,
                top_p=req.top_p,
                top_k=req.top_k,
                stop_token_ids=self.stop_token_ids,
                seed=req.seed,
            )
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from exc
        interaction_id = f"{id_prefix}{self._ids.getrandbits(128):032x}"
        interaction.id = interaction_id
        interaction.api, interaction.policy = api, policy.name
        interaction.sampling = {
            "temperature": sampling.temperature,  # as the engine samples (below 1e-5: 0, greedy)
            "top_p": req.top_p,
            "top_k": req.top_k,
            "seed": req.seed,
            "max_new_tokens": max_new,
        }
        interaction.client_store = req.store
        self.drops.report(interaction.template_dropped, api)
        return Prepared(session, req, interaction_id, api, prompt, sampling, interaction, call_id, chain,
                        received_at, image_bytes=built.image_bytes, operator_capped=max_new < client_max,
                        adapter=policy.adapter)

    # ------------------------------------------------------------------ run

    def _tool_parser_name(self, p: Prepared) -> str | None:
        """The tool parser that runs for this request (None: tool parsing is off)."""
        if p.request.tools and p.request.tool_choice != "none" and self.tool_parser:
            return self.tool_parser
        return None

    def _assembler(self, p: Prepared) -> OutputAssembler:
        parser = self._tool_parser_name(p)
        tools = get_tool_parser(parser, {t.name: t.parameters for t in p.request.tools}) if parser else None
        reasoning = None
        if self.reasoning_parser:
            # Templates whose generation prompt opens the reasoning block (Qwen3-Thinking-2507,
            # DeepSeek-R1) produce replies that start inside it.
            tail = tuple(p.prompt_ids[-REASONING_TAIL:])
            opens = self._reasoning_open.get(tail)
            if opens is None:
                opens = self.renderer.reasoning_open(p.prompt_ids)
                if len(self._reasoning_open) >= 1024:
                    self._reasoning_open.clear()
                self._reasoning_open[tail] = opens
            reasoning = get_reasoning_parser(self.reasoning_parser, starts_in_reasoning=opens)
        return OutputAssembler(
            self.tokenizer,
            stop_token_ids=self.stop_token_ids,
            stop_strings=p.request.stop,
            tool_parser=tools,
            reasoning_parser=reasoning,
            call_id=p.call_id,
        )

    async def run(self, p: Prepared, *, incremental: bool = True) -> AsyncGenerator[OutputEvent | Finished, None]:
        """Generate; the interaction is registered when iteration starts (not in prepare),
        so a response that is never sent leaves nothing pending behind.

        ``incremental=False`` (a response sent in one piece): the reply is assembled once at
        the end instead of delta by delta, unless stop strings must be watched as tokens
        arrive. The events and the recorded interaction are the same either way.
        """
        self.sessions.require_generating(p.session)
        deferred = not incremental and not p.request.stop
        assembler = self._assembler(p)
        ids: list[int] = []
        logprobs: list[float] = []
        versions: list[int] = []
        engine_finish: str | None = None
        final: Finished | None = None
        first_token_at: float | None = None
        stream = self.engine.stream(
            GenerateRequest(p.prompt_ids, p.sampling, request_id=p.interaction_id, session_id=p.session.id, adapter=p.adapter)
        )
        if p.request.retry_attempt > 0:
            self._supersede_earlier_attempt(p.session, p.interaction, p.request.retry_attempt)
        self.sessions.add_interaction(p.session, p.interaction, image_bytes=p.image_bytes)
        p.session.in_flight += 1
        try:
            async for delta in stream:
                if not len(delta.token_ids) == len(delta.logprobs) == len(delta.versions):
                    raise EngineError(f"malformed engine output: {len(delta.token_ids)} token ids, "
                                      f"{len(delta.logprobs)} logprobs, {len(delta.versions)} versions in one delta")
                if first_token_at is None and delta.token_ids:
                    first_token_at = time.perf_counter()
                ids += delta.token_ids  # beyond a stop string's match: cut to kept_tokens on record
                logprobs += delta.logprobs
                versions += delta.versions
                if delta.finish_reason is not None:
                    engine_finish = delta.finish_reason
                if deferred:
                    continue
                # Tokens that arrived together (the client fell behind the engine) go out as
                # one text delta instead of one per token: fewer frames when backlogged.
                for ev in assembler.push_many(delta.token_ids):
                    yield ev
                if assembler.stopped:
                    break
            if deferred:
                for ev in assembler.push_all(ids):
                    yield ev
            for ev in assembler.finish():
                yield ev
            final = self._record(p, assembler, ids, logprobs, versions, engine_finish, first_token_at)
        except EngineError as exc:  # the engine failed: a 5xx that names it (or its 400)
            self._fail(p, f"engine error: {exc.message}", len(ids), first_token_at)
            raise engine_failure(exc.message, status=exc.status, code=exc.code) from exc
        except Exception as exc:  # rlgate's own failure: recorded, then reported as an internal error
            self._fail(p, f"internal error: {exc!r}", len(ids), first_token_at)
            raise
        finally:
            try:
                if final is None and not p.reported:
                    # The consumer went away (disconnect / cancellation): keep what was generated.
                    self._record(p, assembler, ids, logprobs, versions, "abort", first_token_at)
            finally:
                p.session.in_flight -= 1
                await _abort(stream)  # aborts the engine request if it is still running
        scope = current_scope()
        try:  # the final event (finish reason, usage) is sent only once the interaction is on disk
            if scope is not None:
                await scope.wait_durable(self.sessions.store)
        except StoreError as exc:  # refused to the client: not kept for a later request to land on
            raise store_refusal(exc, f"{p.api} stream of session {p.session.id}") from exc
        yield final

    def _supersede_earlier_attempt(self, session: Session, new: Interaction, attempt: int) -> None:
        """A retried request (``x-stainless-retry-count`` > 0: the SDK gave up on an attempt, e.g. at its
        timeout, and sent it again) is the same turn as the latest earlier attempt with the same parent and
        the same prompt that nothing extends. That attempt, which the client never received, is recorded
        as failed (at once, or when it ends if it is still generating), so the turn is recorded once, not
        as a second branch; the retry takes its place in the tree (its relation and fork reason)."""
        for prev in reversed(list(session.interactions.values())[-RETRY_LOOKBACK:]):
            if (prev.status == "failed" or prev.superseded_by is not None or prev.parent_id != new.parent_id
                    or len(prev.prompt_ids) != len(new.prompt_ids) or prev.prompt_ids != new.prompt_ids):
                continue
            if any(i.parent_id == prev.id for i in session.interactions.values()):
                return  # the client went on from it: not an attempt it gave up on
            new.relation, new.fork_reason = prev.relation, prev.fork_reason
            log.info("session %s: %s is retry %d of %s; the earlier attempt is recorded as failed", session.id,
                     new.id, attempt, prev.id)
            if prev.status == "pending":
                prev.superseded_by = new.id
            else:
                ids = session.prefix_index.get(prev.prefix_key)
                if ids and prev.id in ids:
                    ids.remove(prev.id)
                self.sessions.fail_interaction(session, prev, _superseded(new.id))
            return

    def _fail(self, p: Prepared, error: str, generated: int, first_token_at: float | None) -> None:
        if p.interaction.status == "pending":
            self.sessions.fail_interaction(p.session, p.interaction, error)
        self._report(p, GenerationOutcome(
            api=p.api, streamed=p.streamed, finish_reason="error", prompt_tokens=len(p.prompt_ids),
            completion_tokens=generated, ttft_s=None, total_s=0.0), first_token_at)

    def _report(self, p: Prepared, outcome: GenerationOutcome, first_token_at: float | None) -> None:
        """Hand the outcome to the metrics and guards, once per run."""
        if p.reported:
            return
        p.reported = True
        now = time.perf_counter()
        outcome.total_s = now - p.received_at
        outcome.ttft_s = first_token_at - p.received_at if first_token_at is not None else None
        self.metrics.record_generation(outcome)

    def _record(
        self,
        p: Prepared,
        assembler: OutputAssembler,
        ids: list[int],
        logprobs: list[float],
        versions: list[int],
        engine_finish: str | None,
        first_token_at: float | None = None,
    ) -> Finished:
        out = assembler.result
        kept = assembler.kept_tokens
        if out.stop_sequence is not None:
            finish, stop_kind = "stop", "stop_string"
        elif engine_finish == "stop":
            finish, stop_kind = "stop", "stop_token"
        elif engine_finish == "length":
            finish, stop_kind = "length", "length"
        else:
            finish, stop_kind = "abort", "abort"
        if finish == "stop" and out.tool_calls:
            finish = "tool_calls"
        message = out.to_message()
        inter = p.interaction
        if inter.status == "pending":
            inter.output_ids = ids[:kept]
            inter.output_logprobs = logprobs[:kept]
            inter.output_versions = versions[:kept]
            inter.finish_reason = finish
            inter.stop_kind = stop_kind
            inter.output_message = message
            inter.prefix_key = p.chain.copy().add(message).hexdigest()
            if inter.superseded_by is not None:  # the client retried it meanwhile: the retry is the turn
                self.sessions.fail_interaction(p.session, inter, _superseded(inter.superseded_by))
            else:
                self.sessions.complete_interaction(p.session, inter)
                for listener in self.completed_listeners:
                    listener(p)
        log.debug("session %s turn %s: %s, %d prompt + %d generated tokens, finish %s (%s)", p.session.id,
                  p.interaction_id, inter.relation if inter is not None else "-", len(p.prompt_ids), kept, finish,
                  stop_kind)
        parser = self._tool_parser_name(p)
        text = out.content
        self._report(p, GenerationOutcome(
            api=p.api, streamed=p.streamed, finish_reason=finish, prompt_tokens=len(p.prompt_ids),
            completion_tokens=kept, ttft_s=None, total_s=0.0, parser=parser, tool_calls=len(out.tool_calls),
            parse_failures=unparsed_tool_blocks(text, parser) if parser else 0,
            unparsed_markup=unparsed_tool_blocks(text), empty=is_empty_reply(message),
            relation=inter.relation if inter is not None else None,
            fork_reason=inter.fork_reason if inter is not None else None,
            cut_by_operator_cap=p.operator_capped and finish == "length"), first_token_at)
        return Finished(
            interaction_id=p.interaction_id,
            content=out.content,
            reasoning=out.reasoning,
            tool_calls=list(out.tool_calls),
            finish_reason=finish,
            stop_kind=stop_kind,
            stop_sequence=out.stop_sequence,
            prompt_tokens=len(p.prompt_ids),
            completion_tokens=kept,
            message=message,
        )

    async def complete(self, p: Prepared) -> Finished:
        """Run to the end and return only the final result (non-streaming surfaces)."""
        final: Finished | None = None
        p.streamed = False
        async for ev in self.run(p, incremental=False):
            if isinstance(ev, Finished):
                final = ev
        assert final is not None
        return final


def _superseded(retry_id: str) -> str:
    return f"superseded by {retry_id}: the client retried the request (x-stainless-retry-count), never received this"


async def _abort(stream: AsyncGenerator[Any, None]) -> None:
    """Close an engine stream, which aborts its request if it is still running.

    The close is shielded, so it runs to its end even if this task is cancelled meanwhile;
    the cancellation itself is not swallowed. A failure to close is logged. A generator that
    already ran to its end has nothing to close (no task is created for it: the common case).
    """
    if getattr(stream, "ag_frame", True) is None:
        return
    try:
        await asyncio.shield(stream.aclose())
    except Exception:
        log.exception("closing an engine stream failed")
