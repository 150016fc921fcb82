"""What a model family is: how its prompts are rendered and bridged, and how its replies are parsed.

A :class:`ModelFamily` is a small, immutable description (one file per family declares one);
:meth:`ModelFamily.renderer` builds the :class:`PromptRenderer` for a loaded tokenizer.

The prompt renderer contract
----------------------------
``render_ids(messages, tools, template_kwargs)``
    a fresh rendering of the whole conversation, ending with the generation prompt;
``bridge_ids(parent=..., new_messages=..., ...)``
    the tokens that follow a parent turn's *exact* prompt and generated tokens, so that
    ``child_prompt = parent.prompt_ids + parent.output_ids + bridge``. It renders only the new
    messages, with the separators the family's template really writes between turns. A template
    that rewrites history (drops earlier reasoning, renders the last assistant turn differently)
    never makes it fail; it raises :class:`BridgeError` only when it cannot know the separators;
``max_chars`` / ``cache`` (issue 15)
    a renderer that renders text refuses one over ``max_chars`` before tokenizing it
    (:class:`~rlgate.chat.prompt_bounds.PromptTooLong`); by-products it memoises per request
    context go in the caller's ``cache`` (one per session, bounded), never in the renderer.
    Renderers may be called on a worker thread (``core/render_pool.py``);
``reasoning_open(prompt_ids)``
    whether the generation prompt already opened a reasoning block (Qwen3-Thinking-2507 and
    DeepSeek-R1 end it with ``<think>\\n``), so the reply starts inside reasoning. It reads
    only the last ``REASONING_TAIL`` ids (the caller memoises the answer by them).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from rlgate.chat.conversation import Message, ToolSpec
from rlgate.chat.render_cache import RenderCache

# reasoning_open reads at most this many ids from the end of the prompt
REASONING_TAIL = 8


class BridgeError(Exception):
    """The next turn cannot be appended to the parent's tokens (the caller starts a new root)."""


class TemplateError(Exception):
    """The chat template refused the conversation (e.g. a role it does not support)."""


@dataclass(frozen=True)
class ParentTurn:
    """What a bridge needs to know about the turn it continues."""

    prompt_ids: list[int]
    output_ids: list[int]
    reply: Message  # the reply as the client received it
    stop_text: str | None  # text of the stop token the output ended with; None: length / abort / stop string


class PromptRenderer(Protocol):
    """Messages to prompt token ids for one family (see module docstring)."""

    name: str  # e.g. "renderers:qwen3" or "jinja"

    def render_ids(
        self, messages: list[Message], tools: list[ToolSpec] | None = None,
        template_kwargs: dict[str, Any] | None = None, *, max_chars: int | None = None,
    ) -> list[int]: ...

    def bridge_ids(
        self, *, parent: ParentTurn, leading_system: Message | None, new_messages: list[Message],
        tools: list[ToolSpec] | None = None, template_kwargs: dict[str, Any] | None = None,
        cache_key: str | None = None, cache: RenderCache | None = None, max_chars: int | None = None,
    ) -> list[int]: ...

    def reasoning_open(self, prompt_ids: list[int]) -> bool: ...


@dataclass(frozen=True)
class CheckpointInfo:
    """What detection looks at: ``config.json`` and the tokenizer (never the directory name)."""

    model_type: str = ""
    architectures: tuple[str, ...] = ()
    chat_template: str = ""
    vocab: frozenset[str] = frozenset()  # added / special token strings

    def has_tokens(self, *tokens: str) -> bool:
        return all(t in self.vocab for t in tokens)


@dataclass(frozen=True)
class ModelFamily:
    """One model family (see module docstring)."""

    name: str
    title: str  # human name, printed at startup
    detect: Callable[[CheckpointInfo], bool]
    build_renderer: Callable[[Any, ModelFamily], PromptRenderer]
    tool_parser: str | None  # registry name of the incremental tool-call parser
    reasoning_parser: str | None  # registry name of the reasoning parser
    stop_tokens: tuple[str, ...] = ()  # token strings that end a reply (besides the tokenizer's eos)
    # What the family's template does to history, for docs and the export (token_exact keeps all).
    history: str = "keeps history verbatim"
    options: Mapping[str, Any] = field(default_factory=dict)

    def renderer(self, tokenizer: Any) -> PromptRenderer:
        return self.build_renderer(tokenizer, self)

    def stop_token_ids(self, tokenizer: Any) -> list[int]:
        out: list[int] = []
        unk = getattr(tokenizer, "unk_token_id", None)
        for t in self.stop_tokens:
            tid = tokenizer.convert_tokens_to_ids(t)
            if isinstance(tid, int) and tid != unk and tid not in out:
                out.append(tid)
        return out
