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
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import Any

from rlgate.chat.conversation import DigestChain, Message, tools_digest
from rlgate.chat.families.base import BridgeError, ModelFamily, ParentTurn, TemplateError
from rlgate.chat.families.registry import resolve_family
from rlgate.chat.output import OutputAssembler, OutputEvent, openai_call_id
from rlgate.chat.parsers import get_reasoning_parser, get_tool_parser, unparsed_tool_blocks
from rlgate.config import GatewayConfig
from rlgate.core.limits import check_request_limits
from rlgate.core.request import ChatRequest
from rlgate.core.request_scope import current_scope
from rlgate.core.sessions import SessionManager
from rlgate.engine.base import Engine, EngineError, GenerateRequest, SamplingParams
from rlgate.errors import ContextLengthExceeded, InvalidRequest, Unavailable, engine_failure
from rlgate.metrics.gateway import GatewayMetrics, GenerationOutcome
from rlgate.store.base import StoreError
from rlgate.trajectory.flags import is_empty_reply
from rlgate.trajectory.interaction import Interaction, Session
from rlgate.trajectory.tree import find_parent

log = logging.getLogger("rlgate.generation")


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
    ) -> None:
        self.config = config
        self.metrics = metrics if metrics is not None else sessions.gateway_metrics
        self.engine = engine
        self.tokenizer = tokenizer
        self.family = family if family is not None else resolve_family(tokenizer, config.model_family)
        self.renderer = self.family.renderer(tokenizer)
        self.sessions = sessions
        stops = list(stop_token_ids)
        stops += [t for t in self.family.stop_token_ids(tokenizer) if t not in stops]
        self.stop_token_ids = tuple(stops)
        self.tool_parser = self.family.tool_parser if config.tool_parser == "auto" else config.tool_parser
        self.reasoning_parser = (
            self.family.reasoning_parser if config.reasoning_parser == "auto" else config.reasoning_parser
        )
        # Validate parser names once, at startup.
        if self.tool_parser:
            get_tool_parser(self.tool_parser)
        if self.reasoning_parser:
            get_reasoning_parser(self.reasoning_parser)

    @property
    def context_length(self) -> int:
        return self.config.context_length or self.engine.max_context_length

    # ------------------------------------------------------------------ prompt

    def build_prompt(self, session: Session, req: ChatRequest) -> tuple[list[int], Interaction, DigestChain]:
        """Find the parent, build the prompt ids; return them with an unsaved interaction and
        the digest chain of the request's messages (extended with the reply on completion)."""
        check_request_limits(self.config, req)
        context_key = tools_digest(req.tools, req.template_kwargs)
        parent, covered, chain = find_parent(session, context_key, req.messages)
        relation = "extend" if parent is not None else ("fork" if session.interactions else "root")
        fork_reason = None if parent is not None or relation == "root" else "no_prefix_match"
        prompt: list[int] | None = None
        if parent is not None and session.mode == "token_exact":
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
                )
                prompt = parent.prompt_ids + parent.output_ids + bridge
            except (BridgeError, TemplateError) as exc:
                log.warning("session %s: %s; starting a new root", session.id, exc)
                parent, relation, fork_reason = None, "fork", "template_not_incremental"
        if prompt is None:
            try:
                prompt = self.renderer.render_ids(req.messages, req.tools, req.template_kwargs)
            except TemplateError as exc:
                raise InvalidRequest(str(exc), param="messages") from exc
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
        )
        return prompt, interaction, chain

    def _stop_text(self, parent: Interaction) -> str | None:
        if parent.stop_kind == "stop_token" and parent.output_ids and parent.output_ids[-1] in self.stop_token_ids:
            return self.tokenizer.decode([parent.output_ids[-1]], skip_special_tokens=False)
        return None

    # ------------------------------------------------------------------ prepare

    def prepare(
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
        prompt, interaction, chain = self.build_prompt(session, req)
        ctx = self.context_length
        if len(prompt) >= ctx:
            raise ContextLengthExceeded(prompt_tokens=len(prompt), limit=ctx, param="messages")
        max_new = ctx - len(prompt)
        max_new = min(max_new, req.max_tokens if req.max_tokens is not None else self.config.default_max_tokens)
        if self.config.max_tokens_cap is not None:
            max_new = min(max_new, self.config.max_tokens_cap)
        if req.max_total_tokens is not None:
            max_new = min(max_new, req.max_total_tokens - len(prompt))
            if max_new < 1:
                raise ContextLengthExceeded(
                    f"max_total_tokens={req.max_total_tokens} leaves no room after the "
                    f"{len(prompt)}-token prompt",
                    prompt_tokens=len(prompt), limit=req.max_total_tokens, param="max_total_tokens",
                )
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
        interaction_id = f"{id_prefix}{uuid.uuid4().hex}"
        interaction.id = interaction_id
        interaction.api = api
        interaction.sampling = {
            "temperature": req.temperature,
            "top_p": req.top_p,
            "top_k": req.top_k,
            "seed": req.seed,
            "max_new_tokens": max_new,
        }
        interaction.client_store = req.store
        return Prepared(session, req, interaction_id, api, prompt, sampling, interaction, call_id, chain,
                        received_at)

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
            reasoning = get_reasoning_parser(self.reasoning_parser,
                                             starts_in_reasoning=self.renderer.reasoning_open(p.prompt_ids))
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
            GenerateRequest(p.prompt_ids, p.sampling, request_id=p.interaction_id, session_id=p.session.id)
        )
        self.sessions.add_interaction(p.session, p.interaction)
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
                for ev in assembler.push_many(ids):
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
        except StoreError as exc:
            raise Unavailable(str(exc), code="store_unavailable") from exc
        yield final

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
            self.sessions.complete_interaction(p.session, inter)
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
            fork_reason=inter.fork_reason if inter is not None else None), first_token_at)
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


async def _abort(stream: AsyncGenerator[Any, None]) -> None:
    """Close an engine stream, which aborts its request if it is still running.

    The close is shielded, so it runs to its end even if this task is cancelled meanwhile;
    the cancellation itself is not swallowed. A failure to close is logged.
    """
    try:
        await asyncio.shield(stream.aclose())
    except Exception:
        log.exception("closing an engine stream failed")
